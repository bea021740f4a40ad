"""One answer, from the door to its one ending: the sequence every transport and the worker run, written once.

An :class:`Answer` is admitted when it is made (by the line, ``jobs.py``:
measured against the context, given a slot or a place in line, or refused
there with 400, 404 or 503), then ``run`` takes it through its phases::

    WAITING --its turn--> READY --start()--> DELIVERING --the last piece--> ENDED
       |                    |                    |
       +--------------------+--------------------+--the reader left, or shutdown--> ENDED

and ends it exactly once (``end``): the generation's finish (its record, its
stored answer, its slot handed on), or, when it never started, its place
given up.

Every step of the job's life between the door and the slot given back is
here, in order: its start (the user's turn committed to the store, unless
``/generations`` did it at its POST, the generation made by the source, its backpressure set, its answer's row
opened, the generation started; a start that fails is noted on the record
and frees the slot), the watch on the reader's connection while it waits and
while it is delivered (EOF: ``stop``), each piece handed to the delivery and
stored once it was sent (``delivered``), the stop (the first signal wins; a
naive server notes it and carries on), and the finish, once, whoever waits
for it, which closes the record and the stored answer with one stop reason
and gives the slot back (``Jobs.release``). The line (``Jobs``) knows the
answer only as the holder of its ticket.

What differs between ``/complete``, ``/stream``, the OpenAI and Anthropic
routes, ``/ws``, ``/generations`` and the Redis worker is only what each
phase *says* on its wire: a :class:`Delivery`, whose hooks the answer calls
(a place in line, the opening, each piece, a silence, the ending). None of
them admits, waits, starts, counts, stores or finishes anything.
"""

from __future__ import annotations

import asyncio
import enum
import time
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Protocol

from streamlab.model.generation import Generation, PieceStream
from streamlab.model.lifecycle import GenerationResult, Piece
from streamlab.protocol.endings import (
    CLIENT_LEFT,
    COMPLETED,
    EOF,
    LEAVING_SIGNALS,
    SERVER_SHUTDOWN,
    SLOW_READER,
    STOP_MESSAGE,
    stop_reason_for,
)
from streamlab.server.store.answers import AnswerWriter
from streamlab.server.store.conversations import Conversations
from streamlab.server.transport.connection import ClientConnection, in_background
from streamlab.net.serving import ClientGone
from streamlab.server.answers.jobs import Jobs, LogRecord, Ticket, Turn
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.answers.silence import Silence


class Phase(enum.Enum):
    WAITING = "waiting"  # admitted to the line: waits for a slot
    READY = "ready"  # holds a slot: its generation starts next
    DELIVERING = "delivering"  # generating, each piece handed to the delivery as it comes
    ENDED = "ended"  # finished (or its place given up), once: nothing more happens


# The moves each phase allows; any other is a bug in a transport, said where it happens.
MOVES = {
    Phase.WAITING: {Phase.READY, Phase.ENDED},
    Phase.READY: {Phase.DELIVERING, Phase.ENDED},
    Phase.DELIVERING: {Phase.ENDED},
    Phase.ENDED: set(),
}


@dataclass(eq=False)
class Job:
    """One generation request: the running ``Generation``, its log record, and its answer in the store."""

    generation: Generation
    record: LogRecord
    answer: AnswerWriter
    over: asyncio.Event = field(default_factory=asyncio.Event)  # set once record and answer are final
    finishing: asyncio.Future | None = None  # the one finish of this job (see Answer.finish)

    def ids(self) -> dict[str, str | None]:
        """Where the answer is stored: what a client needs to continue the conversation or read it back."""
        return {"conversation_id": self.record.conversation_id, "message_id": self.record.message_id}

    def headers(self) -> list[tuple[str, str]]:
        return [("X-Request-Id", self.record.id), ("X-Conversation-Id", self.record.conversation_id or "")]


class AnswerError(RuntimeError):
    """A move its phase does not allow."""


class Undeliverable(Exception):
    """Raised by a delivery that can send no more, though its reader did not leave (its peer began closing).

    The answer stops being delivered, as if its reader had gone, without a
    signal of its own: whoever began the closing has stopped it already.
    """


class Delivery(Protocol):
    """What one transport writes at each step of an answer; each hook may raise ``ClientGone``."""

    async def place(self, answer: Answer, ahead: int | None) -> None:
        """Its place in line, on arrival and at every change; ``None``: a silence, time for a keep-alive."""

    async def opening(self, answer: Answer) -> bool:
        """Its generation started: what goes before the first piece. False: deliver nothing (it refused)."""

    async def piece(self, answer: Answer, piece: Piece) -> None:
        """One piece of text, as soon as it exists."""

    async def silence(self, answer: Answer) -> None:
        """Nothing came for a ping interval: a keep-alive."""

    async def ending(self, answer: Answer) -> None:
        """After ``end``, to a reader still there: how it ended (or that its turn never came)."""


TITLE_CHARS = 60  # a conversation's title: the start of its first message


def title(prompt: str) -> str:
    """A conversation's title for a list of them: its first message, on one line, cut short."""
    line = " ".join(prompt.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "\u2026"


def commit_turn(store: Conversations, req: GenerationRequest, prompt_ids: list[int],
                messages: tuple[dict[str, str], ...]) -> Turn:
    """Commit the user's message before anything is generated: a crash can lose (part of) an answer, never the question."""
    conversation_id = req.conversation_id or store.new_conversation(title=title(req.prompt))
    user = store.add_user_message(conversation_id, req.prompt)
    return Turn(conversation_id, user.id, prompt_ids, messages)


def begin_turn(jobs: Jobs, req: GenerationRequest) -> Turn:
    """Measure the prompt at the door, then commit the user's message (nothing is stored for a request refused)."""
    return commit_turn(jobs.store, req, *jobs.measure(req))


class Answer:
    """One request's answer: its ticket in line, then its job; its phase; how its reader went, if it did.

    ``client`` is the connection whose EOF means the reader left, watched
    while it waits and while it is delivered (None: the transport watches its
    own, as a WebSocket session reads its frames, or there is no reader).
    ``counts_pieces``: each delivered piece is counted as sent (``/log``'s
    ``pieces_sent``); a whole answer counts itself once its body is written.
    """

    def __init__(self, jobs: Jobs, path: str, req: GenerationRequest, request_id: str | None = None, *,
                 client: ClientConnection | None = None, turn: Turn | None = None,
                 generation_id: str | None = None, counts_pieces: bool = True) -> None:
        self.jobs = jobs
        self.req = req
        self.client = client
        self.counts_pieces = counts_pieces
        self.ticket: Ticket = jobs.admit(path, req, request_id, turn=turn, generation_id=generation_id)
        self.ticket.holder = self  # what stops it at shutdown
        self.job: Job | None = None
        self.phase = Phase.WAITING if self.ticket.waiting else Phase.READY
        self.gone: str | None = None  # the signal its reader left with, mid-answer (a write failed, EOF...)

    def _move(self, phase: Phase) -> None:
        if phase not in MOVES[self.phase]:
            raise AnswerError(f"an answer cannot move from {self.phase.value} to {phase.value}")
        self.phase = phase

    @property
    def served(self) -> bool:
        """Whether its generation started (False: it left the line, or was shut out of it)."""
        return self.job is not None

    def headers(self) -> list[tuple[str, str]]:
        """Its response's head: its job's once it started; before (a reader waiting in line gets its head at
        once), its request id, and its conversation when that exists already."""
        if self.job is not None:
            return self.job.headers()
        ticket = self.ticket
        conversation_id = ticket.turn.conversation_id if ticket.turn is not None else ticket.req.conversation_id
        return [("X-Request-Id", ticket.record.id), *([("X-Conversation-Id", conversation_id)] if conversation_id else [])]

    def commit_turn(self) -> Turn:
        """Commit its turn now, while it may still wait (``/generations``: its 201 names the conversation)."""
        ticket = self.ticket
        if ticket.turn is None:
            ticket.turn = commit_turn(self.jobs.store, ticket.req, ticket.prompt_ids, ticket.messages)
            ticket.record.conversation_id = ticket.turn.conversation_id
        return ticket.turn

    def start(self) -> Job:
        """Its turn came: commit the user's turn (unless done), open the answer's row, start the generation.

        A transport may call this early (``/generations``: the 201 names its
        row). A start that fails is noted on the record, and its slot is free
        again at once.
        """
        ticket, jobs = self.ticket, self.jobs
        if not ticket.granted or ticket.started or ticket.left is not None:
            raise RuntimeError("a generation starts once, when its ticket's turn has come")
        ticket.started = True
        config, record = jobs.config, ticket.record
        if record.queue_position is not None:
            record.queued_s = time.monotonic() - ticket.arrived
        record.started = time.time()
        try:
            turn = self.commit_turn()
            generation = jobs.source.generation(ticket.req, turn.prompt_ids, turn.messages, config, record.count_tokens)
            if isinstance(generation, PieceStream):  # the backpressure policy, whichever engine makes the pieces
                generation.set_backpressure(config.max_queued, config.slow_reader_timeout)
            answer = jobs.store.begin_answer(turn.conversation_id, turn.begun)
        except BaseException as exc:
            record.error, record.ended, record.done = f"could not start: {exc!r}", time.time(), True
            jobs.release(ticket)  # the slot it was given is free again
            raise
        record.message_id = answer.message_id
        job = ticket.job = Job(generation, record, answer)  # running, for the line, from here
        generation.start()
        self.job = job
        self._move(Phase.DELIVERING)
        return job

    def stop(self, signal: str) -> None:
        """The reader is gone or said stop: stop its generation, or take it out of line (the first signal wins).

        Stopping notes why the reader is gone and, unless naive, stops
        generating: the generation checks its stop flag before every token
        and every prompt chunk, so it ends within one. A naive server notes the
        signal and carries on (``SERVER_SHUTDOWN`` stops it all the same).
        """
        job = self.job
        if job is None:
            self.jobs.leave(self.ticket, signal)
            return
        record = job.record
        if record.stop_signal is None:
            record.stop_signal = signal
            record.tokens_at_stop = record.tokens
        record.client_left |= signal in LEAVING_SIGNALS
        record.said_stop |= signal == STOP_MESSAGE
        if not self.jobs.config.naive or signal == SERVER_SHUTDOWN:
            job.generation.stop(signal)

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """While the reader waits in line, or its answer is produced, read its connection: EOF means it left.

        HTTP/1.1 gives a server no other sign. The read returns ``b""`` the
        moment the client's FIN arrives, usually long before a write would
        fail; then ``stop(EOF)`` takes it out of line, or stops its
        generation. A naive server skips this and learns only from a failed
        write; without a ``client`` the transport watches its own (a
        WebSocket session reads its frames).
        """
        if self.jobs.config.naive or self.client is None:
            yield
            return
        client = self.client
        async with in_background(client.watch_for_eof(lambda: self.stop(client.lost or EOF))):
            yield

    async def end(self) -> None:
        """End it, once: the generation's finish, or, when it never started, its place given up.

        A place still held here belongs to a transport cancelled at shutdown:
        no way out may keep a place, or a slot, that nobody will use.
        """
        if self.phase is Phase.ENDED:
            return
        self._move(Phase.ENDED)
        if self.job is not None:
            await self.finish()
        else:
            self.jobs.leave(self.ticket, SERVER_SHUTDOWN)

    async def finish(self) -> GenerationResult:
        """Wait for the generation thread to end (a naive one runs on), then close the record and the answer.

        Any number of callers may wait for it; the closing happens once, and
        a caller cancelled meanwhile does not cancel it. ``done`` is set
        last, so whoever waits for it (``client.wait_log``) finds the store
        already final.
        """
        job = self.job
        if job is None:
            raise AnswerError("only a generation that started can finish")
        if job.finishing is None:
            job.finishing = asyncio.ensure_future(self._finish(job))
        return await asyncio.shield(job.finishing)

    async def _finish(self, job: Job) -> GenerationResult:
        result = await job.generation.wait()
        record = job.record
        if job.generation.stopped_by == SLOW_READER and record.stop_signal != SLOW_READER:
            # It stopped itself, before any other signal reached it (its stopped_by is the first).
            record.stop_signal, record.tokens_at_stop = SLOW_READER, result.tokens
        record.tokens = result.tokens
        record.prompt_tokens = record.prompt_tokens or result.prompt_tokens  # an upstream counts it
        record.prompt_tokens_read = job.generation.prompt_tokens_read
        record.stop_reason = result.stop_reason
        record.error = result.error
        record.stored_reason = stop_reason_for(result.stop_reason, record.stop_signal)
        # A naive server whose model finished after its reader left: the model
        # completed, but what was sent, and stored, is only part of it.
        if record.stored_reason == COMPLETED and job.answer.appended != result.text:
            record.stored_reason = CLIENT_LEFT
        job.answer.finish(record.stored_reason, error=result.error)
        record.ended = time.time()
        record.done = True
        self.jobs.release(self.ticket)  # its slot goes to the first in line
        job.over.set()
        return result

    async def _wait(self, delivery: Delivery) -> bool:
        async def tell(ahead: int | None) -> None:
            await delivery.place(self, ahead)

        # Its reader is watched while it waits: EOF takes it out of line at once.
        async with self.watching() if self.ticket.waiting else nullcontext():
            if not await self.jobs.wait_turn(self.ticket, tell):
                return False
        self._move(Phase.READY)
        return True

    async def run(self, delivery: Delivery, ping_interval: float | None = None, *,
                  watch: Callable[[], AbstractAsyncContextManager[Any]] = nullcontext) -> None:
        """The whole answer: wait for its turn, start, hand each piece over, end once, say how it ended.

        ``watch()`` is held while it waits and while it is delivered: a
        transport that reads its peer meanwhile (a WebSocket session, its
        frames) does it there; ``client``'s EOF is watched here (``watching``).
        A reader who leaves mid-answer (a hook raised ``ClientGone``) stops it
        and is noted in ``gone``; it gets no ending.
        Cancelled (the server going away), it still ends, and says nothing more.
        """
        interval = self.jobs.config.ping_interval if ping_interval is None else ping_interval
        try:
            async with watch():
                # Not served (it left the line, or was shut out of it): nothing generated, nothing more to deliver.
                served = await self._wait(delivery) if self.phase is Phase.WAITING else True
                if served and self.job is None:
                    self.start()
                if served and await delivery.opening(self):
                    async with self.watching():
                        async with aclosing(delivered(self.job, interval, counted=self.counts_pieces)) as pieces:
                            async for piece in pieces:
                                await (delivery.silence(self) if piece is None else delivery.piece(self, piece))
        except ClientGone as gone:
            self.stop(gone.signal)
            self.gone = gone.signal
        except Undeliverable:
            pass
        finally:
            await self.end()
        if self.gone is None:
            await delivery.ending(self)


async def pieces_or_pings(generation: PieceStream, interval: float) -> AsyncIterator[Piece | None]:
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


async def delivered(job: Job, ping_interval: float, *, counted: bool = True) -> AsyncIterator[Piece | None]:
    """The pieces to send (``None``: time for a keep-alive); each counted and stored once it was sent.

    The bookkeeping after ``yield`` runs only when the caller asks for the
    next piece, i.e. after its write of this one succeeded: the stored
    answer is what left the server, never more. The server's copy is the
    record, not the client's: the client may be gone, or may not tell the truth.
    ``counted`` false: the pieces are stored, not counted as sent (a whole
    answer is sent once, at its end).

    It reads the source with its keep-alive timer itself, as
    ``pieces_or_pings`` does, rather than through it: every async generator
    between a piece and the socket is one more frame to resume, and one more
    object made, for every event (at 1,000 streams a ``perf`` profile of chapter
    11's benchmark showed twice uvicorn + Starlette's share in resuming them).
    """
    record, answer, silence = job.record, job.answer, Silence(ping_interval)
    pieces = job.generation.pieces(silence.wait)
    try:
        async for piece in pieces:
            yield piece
            if piece is not None:
                record.pieces_sent += counted
                answer.append(piece.text, piece.tokens)
    finally:
        silence.close()
        await pieces.aclose()
