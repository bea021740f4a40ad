"""One answer, from the door to its one ending: the sequence every transport and the worker run, written once.

An :class:`Answer` is admitted when it is made (measured against the
context, given a slot or a place in line, or refused there with 400, 404 or
503), then ``run`` takes it through its phases::

    WAITING --its turn--> READY --start()--> DELIVERING --the last piece--> ENDED
       |                    |                    |
       +--------------------+--------------------+--the reader left, or shutdown--> ENDED

and ends it exactly once (``end``): the generation's finish (its record, its
stored answer, its slot handed on), or, when it never started, its place
given up. What differs between ``/complete``, ``/stream``, the OpenAI and
Anthropic routes, ``/ws``, ``/generations`` and the Redis worker is only what
each phase *says* on its wire: a :class:`Delivery`, whose hooks the answer
calls (a place in line, the opening, each piece, a silence, the ending).
None of them admits, waits, starts, counts, stores or finishes anything.
"""

from __future__ import annotations

import enum
from contextlib import AbstractAsyncContextManager, aclosing, nullcontext
from typing import Any, Callable, Protocol

from streamlab.model.lifecycle import Piece
from streamlab.protocol.endings import SERVER_SHUTDOWN
from streamlab.server.transport.connection import ClientConnection
from streamlab.net.serving import ClientGone
from streamlab.server.answers.jobs import Job, Jobs, Ticket, Turn, delivered
from streamlab.server.answers.requests import GenerationRequest


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

    def start(self) -> Job:
        """Its turn came: start its generation (a transport may call this early: the 201 names its row)."""
        self.job = self.jobs.start(self.ticket)
        self._move(Phase.DELIVERING)
        return self.job

    def stop(self, signal: str) -> None:
        """The reader is gone or said stop: stop its generation, or take it out of line (the first signal wins)."""
        if self.job is not None:
            self.jobs.stop(self.job, signal)
        else:
            self.jobs.leave(self.ticket, signal)

    async def end(self) -> None:
        """End it, once: the generation's finish, or, when it never started, its place given up.

        A place still held here belongs to a transport cancelled at shutdown:
        no way out may keep a place, or a slot, that nobody will use.
        """
        if self.phase is Phase.ENDED:
            return
        self._move(Phase.ENDED)
        if self.job is not None:
            await self.jobs.finish(self.job)
        else:
            self.jobs.leave(self.ticket, SERVER_SHUTDOWN)

    async def _wait(self, delivery: Delivery) -> bool:
        async def tell(ahead: int | None) -> None:
            await delivery.place(self, ahead)

        if not await self.jobs.wait_turn(self.client, self.ticket, tell):
            return False
        self._move(Phase.READY)
        return True

    async def run(self, delivery: Delivery, ping_interval: float | None = None, *,
                  watch: Callable[[], AbstractAsyncContextManager[Any]] = nullcontext) -> None:
        """The whole answer: wait for its turn, start, hand each piece over, end once, say how it ended.

        ``watch()`` is held while it waits and while it is delivered: a
        transport that reads its peer meanwhile (a WebSocket session, its
        frames) does it there; ``client``'s EOF is watched by the line and the
        job themselves. A reader who leaves mid-answer (a hook raised
        ``ClientGone``) stops it and is noted in ``gone``; it gets no ending.
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
                    async with self.jobs.watching(self.client, self.job):
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
