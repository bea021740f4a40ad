"""How each API spells an answer: one ``Format`` per wire format, plugged into the one streaming path.

Every generating route runs the same answer (``answer.Answer``: admission,
the user's turn, the generation, the disconnect watch, the stored answer,
``/log``) and delivers it the same way (``deliveries.EventDelivery`` for a
stream, ``deliveries.WholeDelivery`` for a whole answer). What differs between streamlab's own events, OpenAI's
``chat.completion.chunk`` and Anthropic's Messages events is only how a
place in line, a beginning, a piece, a silence, an ending and an error are
written. That is a ``Format``; this module holds the base and streamlab's
own. The others are in ``openai_api.py`` and ``anthropic_api.py``.
"""

from __future__ import annotations

from json.encoder import encode_basestring  # a str as JSON, the way JSONEncoder(ensure_ascii=False) writes it (C)
from typing import TYPE_CHECKING, Any, Iterable

from streamlab.protocol import sse
from streamlab.protocol.endings import ERROR, INCOMPLETE_REASONS, SERVER_SHUTDOWN, STOPPED
from streamlab.server.transport.events import Event

if TYPE_CHECKING:
    from streamlab.server.answers.answer import Answer, Job
    from streamlab.server.answers.jobs import Ticket


# -- streamlab's own payloads: every body below, and every other transport's, is made of these -------------


def error_body(status: int, message: str) -> dict:
    """streamlab's error, as a refusal's body and inside an ``error`` event or message."""
    return {"error": {"status": status, "message": message}}


def text_data(text: str) -> dict:
    """One piece: ``{"text": ...}`` (an SSE event's data, a WebSocket message, a kept event, a log entry)."""
    return {"text": text}


def place_data(ahead: int) -> dict:
    """A place in line: how many readers are ahead."""
    return {"ahead": ahead}


def ending_data(stored: str, tokens: int, conversation_id: str | None = None, message_id: str | None = None,
                **extra: object) -> dict:
    """An ``end``'s fields: the stored reason, the tokens, whether it is incomplete, where it is stored."""
    return {"stop_reason": stored, "tokens": tokens, "incomplete": stored in INCOMPLETE_REASONS,
            "conversation_id": conversation_id, "message_id": message_id, **extra}


def job_ending(job: Job) -> tuple[str, dict]:
    """The last event of every answer that ran: ``end`` (how it ended, where it is stored) or ``error``.

    An error never looks like an ending: a client must not mistake a
    failed answer for a complete one. Its ``stop_reason`` is the stored
    one (``completed``, ``max_tokens``, ``client_left``, ``stopped``,
    ``error``, ``interrupted``, ``slow_reader``): one vocabulary, the word
    the reader will find on this answer when it reads the conversation
    back. The generation's own word (``eos``...) and the signal are in ``/log``.
    """
    result, record = job.generation.result, job.record
    assert result is not None
    ending = ending_data(record.stored_reason, result.tokens, **job.ids())
    if result.stop_reason == ERROR:
        return "error", {**error_body(500, f"generation failed: {result.error}"), **ending}
    return "end", ending


def unserved_ending(ticket: Ticket, conversation_id: str | None = None) -> tuple[str, dict]:
    """For a reader still there whose turn never came: stopped (``end``, no answer) or shut out (``error``)."""
    turn = ticket.turn
    conversation_id = turn.conversation_id if turn else conversation_id or ticket.req.conversation_id
    if ticket.left == SERVER_SHUTDOWN:
        return "error", {**error_body(503, "the server is shutting down; this request's turn never came"),
                         "conversation_id": conversation_id, "message_id": None}
    return "end", stopped_in_line(conversation_id)


def answer_ending(answer: Answer) -> tuple[str, dict]:
    """An answer's last event, after its end: its job's ending, or, when none ran, its ticket's."""
    return job_ending(answer.job) if answer.job is not None else unserved_ending(answer.ticket)


def stopped_in_line(conversation_id: str | None = None, **extra: object) -> dict:
    """The ``end`` of an answer stopped while it waited for its turn: nothing generated."""
    return ending_data(STOPPED, 0, conversation_id, left_queue=True, **extra)


class Format:
    """The hooks an API fills in; a new object for every response (it may count what it sent)."""

    def queued(self, ahead: int) -> list[Event]:
        """What a reader waiting in line is told of its place (``ahead`` readers before it), on arrival and at
        every change. An API with no word for it says nothing: its readers get the silences' keep-alives alone."""
        return []

    def unserved(self, ticket: Ticket) -> list[Event]:
        """The end of a stream whose turn never came (the server is going away): an error, never an ending."""
        raise NotImplementedError

    def opening(self, job: Job) -> list[Event]:
        """Events before the first piece (a role, a message header)."""
        return []

    def piece(self, text: str) -> Event:
        raise NotImplementedError

    def silence(self) -> Event | None:
        """What a silence sends: None for an SSE comment (``: ping``), or an event of the API's own."""
        return None

    def ending(self, job: Job) -> list[Event]:
        """The events after the last piece: how it ended, or an error that no client can take for an end."""
        raise NotImplementedError

    def whole(self, job: Job) -> tuple[int, Any]:
        """The answer as one JSON body, for a client that did not ask for a stream: ``(status, body)``."""
        raise NotImplementedError


    @staticmethod
    def failure(job: Job, endings: Iterable[str]) -> str | None:
        """Why the answer is not whole, or None when it ended in one of the API's ``endings``.

        An API that can only say "it ended" (OpenAI's ``finish_reason``,
        Anthropic's ``stop_reason``) must not say it of an answer that failed
        or was stopped: that one ends with an error the SDK raises.
        """
        result = job.generation.result
        assert result is not None
        if result.stop_reason in endings:
            return None
        if result.error:
            return f"generation failed: {result.error}"
        return f"generation stopped before the end ({job.record.stored_reason}): the answer is incomplete"


class TextPiece(Event):
    """``{"text": ...}``, the event of every piece of streamlab's own streams: the bytes of ``Event({"text": text})``.

    An ``Event`` whose data is its JSON already, made in one step. At 1,000
    streams the server makes up to 20,000 of these a second, and
    ``Event({"text": text})`` built a frozen dataclass (an assignment guarded
    by ``object.__setattr__`` for each of four fields) and then ran the JSON
    encoder over a one-key dict for every one of them: 3.7 µs made and
    encoded against 1.1 µs here (``timeit``), of the 60-90 µs of CPU an event
    costs the server in chapter 11's benchmark. A JSON object with one string
    member needs only the string encoded, and JSON never leaves a line break
    unescaped, so the SSE framing (``Event.encode``) still writes one data line.
    """

    def __init__(self, text: str) -> None:
        object.__setattr__(self, "data", '{"text": ' + encode_basestring(text) + "}")  # name, id, retry: defaults


class StreamlabFormat(Format):
    """streamlab's own events: ``queued`` ``{"ahead"}`` while in line, ``{"text"}`` per piece, then ``end`` (or ``error``).

    ``/stream`` adds ``data: [DONE]`` after ``end``, as OpenAI's streams do, and
    never after ``error``: a client must not mistake a failed answer for a
    complete one. (The numbered, resumable ``/generations`` events carry the
    same data, numbered by the run that keeps them: see ``resumable.Run``.)
    """

    def queued(self, ahead: int) -> list[Event]:
        return [Event(place_data(ahead), "queued")]

    def unserved(self, ticket: Ticket) -> list[Event]:
        name, data = unserved_ending(ticket)
        return [Event(data, name), Event(sse.DONE)] if name == "end" else [Event(data, name)]

    def piece(self, text: str) -> Event:
        return TextPiece(text)

    def ending(self, job: Job) -> list[Event]:
        name, data = job_ending(job)
        return [Event(data, name), Event(sse.DONE)] if name == "end" else [Event(data, name)]

    def whole(self, job: Job) -> tuple[int, Any]:
        result = job.generation.result
        assert result is not None
        if result.stop_reason == ERROR:
            return 500, {**error_body(500, f"generation failed: {result.error}"), "id": job.record.id, **job.ids()}
        body = {"text": result.text, "tokens": result.tokens, "stop_reason": result.stop_reason,
                "id": job.record.id, **job.ids()}
        return 200, body


class WebSocketMessages:
    """streamlab's answer as WebSocket text messages: the same data as its events, one JSON object each.

    ``{"queued": true, "ahead": N}`` while in line, ``{"text": ...}`` per
    piece, then ``{"done": true, ...}`` with the ending's fields and the
    request id, or the error object (then the socket closes).
    """

    @staticmethod
    def queued(ahead: int) -> dict:
        return {"queued": True, **place_data(ahead)}

    @staticmethod
    def piece(text: str) -> dict:
        return text_data(text)

    @staticmethod
    def ending(name: str, ending: dict, request_id: str) -> dict:
        """The answer's last message: its ending's fields, or (``name`` ``error``) the error, then the socket closes."""
        return {**ending, "id": request_id} if name == "error" else {"done": True, **ending, "id": request_id}

    @staticmethod
    def refusal(status: int, message: str) -> dict:
        return error_body(status, message)
