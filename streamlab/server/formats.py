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
from streamlab.protocol.endings import ERROR
from streamlab.server.events import Event
from streamlab.server.jobs import error_body

if TYPE_CHECKING:
    from streamlab.server.jobs import Job, Ticket


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
        return [Event({"ahead": ahead}, "queued")]

    def unserved(self, ticket: Ticket) -> list[Event]:
        name, data = ticket.ending()
        return [Event(data, name), Event(sse.DONE)] if name == "end" else [Event(data, name)]

    def piece(self, text: str) -> Event:
        return TextPiece(text)

    def ending(self, job: Job) -> list[Event]:
        name, data = job.ending()
        return [Event(data, name), Event(sse.DONE)] if name == "end" else [Event(data, name)]

    def whole(self, job: Job) -> tuple[int, Any]:
        result = job.generation.result
        assert result is not None
        if result.stop_reason == ERROR:
            return 500, {**error_body(500, f"generation failed: {result.error}"), "id": job.record.id, **job.ids()}
        body = {"text": result.text, "tokens": result.tokens, "stop_reason": result.stop_reason,
                "id": job.record.id, **job.ids()}
        return 200, body
