"""Generation jobs: the user's turn, the running generation, its ``/log`` record, its stored answer.

Every route that generates (``/complete``, ``/stream``, ``/ws``,
``/generations``) goes through ``Jobs``: it measures the prompt in tokens
against the context, admits at most ``max_active`` generations at once,
commits the user's message before anything is generated, starts the
generation thread, and at the end closes the record and the stored answer
with one stop reason (the vocabulary is in ``streamlab/stops.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from contextlib import aclosing, asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from streamlab.model.generation import Generation, GenerationResult, Piece, PieceSource
from streamlab.protocol.http_head import HTTPError
from streamlab.protocol.endings import (
    CLIENT_LEFT,
    COMPLETED,
    EOF,
    ERROR,
    INCOMPLETE_REASONS,
    LEAVING_SIGNALS,
    SERVER_SHUTDOWN,
    SLOW_READER,
    STOP_MESSAGE,
    stop_reason_for,
)
from streamlab.server.store import AnswerWriter, Store
from streamlab.server.config import MAX_LOG_RECORDS, RETRY_AFTER, ServerConfig
from streamlab.server.connection import ClientConnection, in_background
from streamlab.server.requests import GenerationRequest, check_context
from streamlab.server.responses import Refused

TITLE_CHARS = 60  # a conversation's title: the start of its first message


def busy(message: str) -> Refused:
    """503 with ``Retry-After``: the server is at a limit, not broken; the client should try again soon."""
    return Refused(503, message, [("Retry-After", str(RETRY_AFTER))])


@dataclass
class LogRecord:
    """What ``GET /log`` shows for one generation request: how it ended, and why.

    ``tokens`` counts generated tokens (live while it runs); ``pieces_sent``
    counts text pieces written to the client (1 for ``/complete``, once its
    body is written). ``stop_reason`` is the generation's own (eos,
    max_tokens, stopped, error); ``stop_signal`` is how the server learned to
    stop sending, the first one that came, and ``tokens_at_stop`` the token
    count at that moment (how far it ran on after being told is ``tokens``
    minus that). ``stored_reason`` is what the store recorded;
    ``conversation_id`` and ``message_id`` find the answer there.
    ``generation_id`` names the ``/generations`` resource a request served
    (None for the others): with ``--forget`` one resource can cost several
    generations, and their tokens add up. ``prompt_tokens_read`` is how much
    of the prompt went through the model (less than ``prompt_tokens`` when a
    stop came during a chunked prefill).
    """

    id: str
    path: str
    prompt_tokens: int = 0
    prompt_tokens_read: int = 0
    tokens: int = 0
    pieces_sent: int = 0
    stop_reason: str | None = None
    stop_signal: str | None = None
    client_left: bool = False
    said_stop: bool = False
    done: bool = False
    started: float = field(default_factory=time.time)
    ended: float | None = None
    naive: bool = False
    error: str | None = None
    tokens_at_stop: int | None = None
    stored_reason: str | None = None
    conversation_id: str | None = None
    message_id: str | None = None
    generation_id: str | None = None

    def count_tokens(self, tokens: int) -> None:
        """Called from the generation thread after every token (an int store is atomic)."""
        self.tokens = tokens


@dataclass(frozen=True)
class Turn:
    """The user's side of one exchange, committed before anything is generated.

    ``prompt_ids`` is what the model reads: the prompt alone, or the whole
    conversation in the chat template when the request continued one or sent
    a transcript (the OpenAI and Anthropic routes). An upstream source counts
    the prompt itself: then ``prompt_ids`` is empty.
    """

    conversation_id: str
    user_message_id: str
    prompt_ids: list[int]
    messages: tuple[dict[str, str], ...] = ()  # the conversation as messages (what an upstream source is sent)


@dataclass(eq=False)
class Job:
    """One generation request: the running ``Generation``, its log record, and its answer in the store."""

    generation: Generation
    record: LogRecord
    answer: AnswerWriter
    over: asyncio.Event = field(default_factory=asyncio.Event)  # set once record and answer are final
    finishing: asyncio.Future | None = None  # the one finish of this job (see Jobs.finish)

    def ids(self) -> dict[str, str | None]:
        """Where the answer is stored: what a client needs to continue the conversation or read it back."""
        return {"conversation_id": self.record.conversation_id, "message_id": self.record.message_id}

    def headers(self) -> list[tuple[str, str]]:
        return [("X-Request-Id", self.record.id), ("X-Conversation-Id", self.record.conversation_id or "")]

    def ending(self) -> tuple[str, dict]:
        """The last event of every stream: ``end`` (how it ended, where it is stored) or ``error``.

        An error never looks like an ending: a client must not mistake a
        failed answer for a complete one. Its ``stop_reason`` is the stored
        one (``completed``, ``max_tokens``, ``client_left``, ``stopped``,
        ``error``, ``interrupted``, ``slow_reader``): one vocabulary, the word
        the reader will find on this answer when it reads the conversation
        back. The generation's own word (``eos``...) and the signal are in ``/log``.
        """
        result, record = self.generation.result, self.record
        assert result is not None
        ending = {
            "stop_reason": record.stored_reason,
            "tokens": result.tokens,
            "incomplete": record.stored_reason in INCOMPLETE_REASONS,
            **self.ids(),
        }
        if result.stop_reason == ERROR:
            return "error", {**error_body(500, f"generation failed: {result.error}"), **ending}
        return "end", ending


def error_body(status: int, message: str) -> dict:
    return {"error": {"status": status, "message": message}}


def title(prompt: str) -> str:
    """A conversation's title for a list of them: its first message, on one line, cut short."""
    line = " ".join(prompt.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "\u2026"


class Jobs:
    """Every generation the server runs, its log, and the admission limit."""

    def __init__(self, source: Any, config: ServerConfig, store: Store) -> None:
        self.source = source  # sources.ModelSource or sources.UpstreamSource
        self.config = config
        self.store = store
        self.running: set[Job] = set()
        self.log: OrderedDict[str, LogRecord] = OrderedDict()
        self._ids = itertools.count(1)

    def new_id(self) -> str:
        return str(next(self._ids))

    def admit(self) -> None:
        """503 when ``max_active`` generations already run: refuse early, before anything is stored."""
        if len(self.running) >= self.config.max_active:
            raise busy(f"{len(self.running)} generations are running, the limit is {self.config.max_active}")

    # -- the user's turn ------------------------------------------------------

    def begin_turn(self, req: GenerationRequest) -> Turn:
        """Measure the prompt, then commit the user's message, before anything is generated.

        The prompt is counted in tokens and refused (400) when it and
        ``max_tokens`` do not fit the context: nothing is stored for a request
        refused. A crash after this can lose (part of) an answer, never the
        question. A ``conversation_id`` continues that conversation (404 if
        there is none); with ``chat`` the model reads all of it.
        """
        store = self.store
        if req.conversation_id is not None and store.conversation(req.conversation_id) is None:
            raise HTTPError(404, f"no conversation {req.conversation_id!r}")
        if req.conversation_id is not None and req.chat:
            messages = (*store.as_chat_messages(req.conversation_id), {"role": "user", "content": req.prompt})
        else:
            messages = req.messages or ({"role": "user", "content": req.prompt},)
        prompt_ids = self.source.prompt_ids(messages, chat=req.chat)
        if prompt_ids:
            check_context(len(prompt_ids), req.max_tokens, self.source.context_length)
        conversation_id = req.conversation_id or store.new_conversation(title=title(req.prompt))
        user = store.add_user_message(conversation_id, req.prompt)
        return Turn(conversation_id, user.id, prompt_ids, tuple(messages))

    # -- a job's life -----------------------------------------------------------

    def start(
        self,
        path: str,
        req: GenerationRequest,
        request_id: str | None = None,
        *,
        turn: Turn | None = None,
        generation_id: str | None = None,
    ) -> Job:
        """Admit, commit the user's turn (unless given), open the answer's row, start the generation thread."""
        self.admit()
        turn = turn or self.begin_turn(req)
        config = self.config
        record = LogRecord(
            id=request_id or self.new_id(),
            path=path,
            naive=config.naive,
            conversation_id=turn.conversation_id,
            generation_id=generation_id,
            prompt_tokens=len(turn.prompt_ids),
        )
        generation = self.source.generation(req, turn.prompt_ids, turn.messages, config, record.count_tokens)
        if isinstance(generation, PieceSource):  # the backpressure policy, whichever engine makes the pieces
            generation.set_backpressure(config.max_queued, config.slow_reader_timeout)
        answer = self.store.begin_answer(turn.conversation_id)
        record.message_id = answer.message_id
        self.log[record.id] = record
        while len(self.log) > MAX_LOG_RECORDS:
            self.log.popitem(last=False)
        job = Job(generation, record, answer)
        self.running.add(job)
        generation.start()
        return job

    def stop(self, job: Job, signal: str) -> None:
        """Note why the reader is gone (the first signal wins) and, unless naive, stop generating.

        The generation checks its stop flag before every token and every
        prompt chunk, so it ends within one. A naive server notes the signal
        and carries on.
        """
        record = job.record
        if record.stop_signal is None:
            record.stop_signal = signal
            record.tokens_at_stop = record.tokens
        record.client_left |= signal in LEAVING_SIGNALS
        record.said_stop |= signal == STOP_MESSAGE
        if not self.config.naive or signal == SERVER_SHUTDOWN:
            job.generation.stop(signal)

    async def finish(self, job: Job) -> GenerationResult:
        """Wait for the generation thread to end (a naive one runs on), then close the record and the answer.

        Any number of callers may wait for it; the closing happens once.
        ``done`` is set last, so whoever waits for it (``client.wait_log``)
        finds the store already final.
        """
        if job.finishing is None:
            job.finishing = asyncio.ensure_future(self._finish(job))
        return await asyncio.shield(job.finishing)

    async def _finish(self, job: Job) -> GenerationResult:
        result = await job.generation.wait()
        record = job.record
        if getattr(job.generation, "stop_source", None) == SLOW_READER and record.stop_signal != SLOW_READER:
            # It stopped itself, before any other signal reached it (its stop_source is the first).
            record.stop_signal, record.tokens_at_stop = SLOW_READER, result.tokens
        record.tokens = result.tokens
        record.prompt_tokens = record.prompt_tokens or result.prompt_tokens  # an upstream counts it
        record.prompt_tokens_read = job.generation.prompt_tokens_read
        record.stop_reason = result.stop_reason
        record.error = result.error
        record.stored_reason = stop_reason_for(result.stop_reason, record.stop_signal)
        # A naive server whose model finished after its reader left: the model
        # completed, but what was sent, and stored, is only part of it.
        if record.stored_reason == COMPLETED and job.answer.text != result.text:
            record.stored_reason = CLIENT_LEFT
        job.answer.finish(record.stored_reason, error=result.error)
        record.ended = time.time()
        record.done = True
        self.running.discard(job)
        job.over.set()
        return result

    @asynccontextmanager
    async def watching(self, client: ClientConnection, job: Job) -> AsyncIterator[None]:
        """While the response is produced, read the connection: EOF means the reader left.

        HTTP/1.1 gives a server no other sign. The read returns ``b""`` the
        moment the client's FIN arrives, usually long before a write would
        fail. A naive server skips this and learns only from a failed write.
        """
        if self.config.naive:
            yield
            return
        async with in_background(client.watch_for_eof(lambda: self.stop(job, EOF))):
            yield

    def stop_all(self) -> None:
        """The server is going away: stop every generation, naive ones too (each ends within a token)."""
        for job in list(self.running):
            self.stop(job, SERVER_SHUTDOWN)

    async def wait_all(self) -> None:
        """Let the threads see their stop flag and return."""
        for job in list(self.running):
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(job.generation.wait(), 2.0)


class Silence:
    """``wait(ready)``: True once the future ``ready`` is done, False after ``interval`` seconds of waiting (0: never).

    ``asyncio.wait({task}, timeout=interval)`` does the same, but makes a
    timer, a future and callbacks for every piece, and cancels the timer
    once the piece comes: chapter 11's benchmark (``benchmarks/many_streams.py``)
    measured it at a fifth of the server's CPU per event at 300 streams.
    Pieces come far more often than keep-alives are due, so this keeps one
    timer per stream: when it fires, it looks at when the current wait
    began, and either ends the wait (resolving the reader's own ``ready``
    future with False) or sets itself for the right moment.
    """

    def __init__(self, interval: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.interval = interval
        self.began = 0.0  # loop time when the current wait began
        self.waiter: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None

    async def wait(self, ready: asyncio.Future) -> bool:
        if ready.done():
            return bool(ready.result())
        self.waiter = ready
        self.began = self.loop.time()
        if self.interval > 0 and self.timer is None:
            self.timer = self.loop.call_at(self.began + self.interval, self._due)
        try:
            return bool(await ready)
        finally:
            self.waiter = None

    def _due(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait sets the timer again
        due = self.began + self.interval
        if self.loop.time() >= due:
            waiter.set_result(False)
        else:
            self.timer = self.loop.call_at(due, self._due)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


async def pieces_or_pings(generation: PieceSource, interval: float) -> AsyncIterator[Piece | None]:
    """Yield each piece as it is made, or ``None`` after ``interval`` seconds of silence.

    ``None`` is the caller's cue to send a keep-alive (an SSE comment, a
    WebSocket ping) so that proxies and load balancers, which close
    connections idle for 60-100 s, keep this one open while the model thinks.
    One timer per stream, and one future per wait for a piece (the queue's
    ``ready()``): no task per piece, and a timeout that cancels nothing.
    """
    silence = Silence(interval)
    pieces = generation.pieces(silence.wait)
    try:
        async for piece in pieces:
            yield piece
    finally:
        silence.close()
        await pieces.aclose()


async def delivered(job: Job, ping_interval: float) -> AsyncIterator[Piece | None]:
    """The pieces to send (``None``: time for a keep-alive); each counted and stored once it was sent.

    The bookkeeping after ``yield`` runs only when the caller asks for the
    next piece, i.e. after its write of this one succeeded: the stored
    answer is what left the server, never more. The server's copy is the
    record, not the client's: the client may be gone, or may not tell the truth.
    """
    async with aclosing(pieces_or_pings(job.generation, ping_interval)) as items:
        async for piece in items:
            yield piece
            if piece is not None:
                job.record.pieces_sent += 1
                job.answer.append(piece.text, piece.tokens)
