"""Generations as resources: ``POST /generations`` starts an answer that outlives its connection.

Its events are kept, numbered, so a reader who drops reconnects with
``Last-Event-ID`` and resumes where it left off, while the model carries on
for a grace period (``--grace``) with nobody reading. ``--forget`` is the
contrast, a policy of the same registry and the same stream: keep nothing,
so every reader's generation starts over (the same prompt and seed, paid for
again) and ends when that reader leaves.

A run may have to wait in line for its turn (``Jobs.admit``). Meanwhile its
readers get ``queued`` events with its place, unnumbered (they are not part
of the answer, and a reader who comes back needs only the place now), and
keep-alives; a cancel, the grace period or (``--forget``) its reader leaving
takes it out of line.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Protocol

from streamlab.protocol.endings import CANCEL, ERROR, GRACE_EXPIRED, INCOMPLETE_REASONS
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import Request
from streamlab.server.transport import responses
from streamlab.server.config import RETRY_MS, ServerConfig
from streamlab.server.transport.connection import ClientConnection
from streamlab.server.transport.events import Event
from streamlab.server.wire.formats import answer_ending, place_data, text_data
from streamlab.model.lifecycle import Piece
from streamlab.server.answers.answer import Answer, Job, begin_turn
from streamlab.server.answers.jobs import Jobs, LogRecord, Ticket, Turn
from streamlab.server.answers.requests import GenerationRequest, last_event_id
from streamlab.server.transport.streams import EventStream


@dataclass(eq=False)
class Run:
    """One generation of a resource and the numbered events it made, for its readers to follow.

    ``events[i]`` is the event with id ``i + 1``, as ``(name, data)``: the
    pieces are ``message`` events, the last one is ``end`` or ``error``.
    Readers ``follow`` the list, each from its own place, and wait on
    ``changed`` for more, so any number of them can read at once and none
    holds up the model. ``job`` is None while the run waits in line
    (``ahead``: its place) and for ever if it left the line.
    """

    answer: Answer
    ahead: int | None = None
    events: list[tuple[str, Any]] = field(default_factory=list)
    ended: bool = False
    readers: int = 0
    grace_timer: asyncio.TimerHandle | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    over: asyncio.Event = field(default_factory=asyncio.Event)  # set with the last event

    @property
    def running(self) -> bool:
        """Whether it may still make events: waiting in line, or generating."""
        return not self.ended and not self.record.done

    @property
    def ticket(self) -> Ticket:
        return self.answer.ticket

    @property
    def job(self) -> Job | None:
        return self.answer.job

    @property
    def record(self) -> LogRecord:
        return self.ticket.record

    def add(self, name: str, data: Any, *, last: bool = False) -> None:
        """Keep one more event and wake every reader waiting for it."""
        self.events.append((name, data))
        self.ended = self.ended or last
        if last:
            self.over.set()
        self.wake()

    def place_now(self, ahead: int | None) -> None:
        """Its place in line changed (None: its turn came): tell the readers."""
        self.ahead = ahead
        self.wake()

    def wake(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def finished_for(self, after: int | None) -> bool:
        return after is not None and self.ended and after >= len(self.events)

    async def follow(self, after: int, ping_interval: float) -> AsyncIterator[Event | None]:
        """Every event after id ``after``, kept ones first, then live ones; ``None`` after a silence.

        The first event sent carries ``retry:``, so an ``EventSource`` knows how
        soon to reconnect after a drop.
        """
        number, told, first = after, None, True
        while True:
            while number < len(self.events):
                name, data = self.events[number]
                number += 1
                yield Event(data, name, id=number, retry=RETRY_MS if first else None)
                first = False
            if self.ended:
                return
            if self.job is None and self.ahead is not None and self.ahead != told:
                told = self.ahead
                yield Event(place_data(told), "queued", retry=RETRY_MS if first else None)
                first = False
                continue
            try:
                await asyncio.wait_for(self.changed.wait(), ping_interval if ping_interval > 0 else None)
            except asyncio.TimeoutError:
                yield None


    # -- as the answer's delivery (``streamlab.server.answers.answer.Delivery``): events kept, whoever reads them --

    async def place(self, answer: Answer, ahead: int | None) -> None:
        if ahead is not None:  # its readers send their own keep-alives
            self.place_now(ahead)

    async def opening(self, answer: Answer) -> bool:
        self.place_now(None)
        return True

    async def piece(self, answer: Answer, piece: Piece) -> None:
        self.add("message", text_data(piece.text))

    async def silence(self, answer: Answer) -> None:
        return None

    async def ending(self, answer: Answer) -> None:
        self.add(*answer_ending(answer), last=True)


@dataclass(eq=False)
class GenerationResource:
    """A ``POST /generations`` answer: its request, the user's turn, and its latest run.

    ``keeps_events`` is False with ``--forget``: then ``run`` is the latest
    reader's own, and what it made is never offered to the next reader.
    """

    id: str
    req: GenerationRequest
    turn: Turn
    keeps_events: bool = True
    run: Run | None = None

    @property
    def job(self) -> Job | None:
        return self.run.job if self.run is not None else None

    @property
    def record(self) -> LogRecord | None:
        """The latest run's ``/log`` record: from admission on, while it waits in line too."""
        return self.run.record if self.run is not None else None

    @property
    def events(self) -> list[tuple[str, Any]]:
        """The events a new reader can have without anything generated again (none with ``--forget``)."""
        return self.run.events if self.run is not None and self.keeps_events else []

    @property
    def running(self) -> bool:
        return self.run is not None and self.run.running

    @property
    def status(self) -> str:
        """``waiting`` (``--forget``, before any reader), ``queued`` (in line), ``running`` or ``done``."""
        if self.run is None:
            return "waiting"
        if not self.running:
            return "done"
        return "queued" if self.run.job is None else "running"

    def headers(self) -> list[tuple[str, str]]:
        headers = [("X-Generation-Id", self.id), ("X-Conversation-Id", self.turn.conversation_id)]
        if self.run is not None:
            headers.append(("X-Request-Id", self.run.record.id))
        return headers

    def finished_for(self, after: int | None) -> bool:
        """Whether a reader that saw event ``after`` already has everything: the cue for 204.

        Never with ``--forget``: with nothing kept, a reconnect is a new request.
        """
        return self.keeps_events and self.run is not None and self.run.finished_for(after)


class GenerationRegistry(Protocol):
    """What the four ``/generations`` routes ask of a registry: this process's (``Registry``) or the one
    every replica shares in Redis (``shared_log.SharedRegistry``)."""

    async def created(self, req: GenerationRequest) -> tuple[dict, list[tuple[str, str]]]:
        """``POST /generations``: the 201's body and headers."""

    async def events(self, client: ClientConnection, request: Request, generation_id: str) -> bool:
        """``GET /generations/{id}/events``: its events after ``Last-Event-ID``; True: keep the connection."""

    async def cancelled(self, generation_id: str) -> dict:
        """``POST /generations/{id}/cancel``: stop it, then say where it stands."""

    async def describe(self, generation_id: str) -> dict:
        """``GET /generations/{id}``: how far it has come."""

    async def shutdown(self) -> None:
        """The server is going away: let what runs write its ending."""


class Registry:
    """The ``/generations`` resources of one server, at most ``keep_generations`` of them remembered."""

    def __init__(self, jobs: Jobs, config: ServerConfig) -> None:
        self.jobs = jobs
        self.config = config
        self.resources: OrderedDict[str, GenerationResource] = OrderedDict()
        self.producers: set[asyncio.Task] = set()  # held here: the loop keeps only weak references to tasks

    def get(self, id: str) -> GenerationResource:  # noqa: A002
        resource = self.resources.get(id)
        if resource is None:
            raise HTTPError(404, f"no generation {id!r}")
        return resource

    def create(self, req: GenerationRequest) -> GenerationResource:
        """A new resource; when its events are kept, its generation starts at once, with nobody reading yet.

        The reader may take a moment to connect, or drop and come back, and
        nothing is lost in between. Admission is checked before the turn is
        stored, so a refused request leaves nothing behind; one admitted to
        the line has its turn stored now (the 201 names its conversation) and
        its answer's row once it starts. With ``--forget`` nothing runs until
        a reader comes (each reader's own run is admitted then).
        """
        generation_id = uuid.uuid4().hex
        if self.config.forget:
            resource = GenerationResource(generation_id, req, begin_turn(self.jobs, req), keeps_events=False)
            self._remember(resource)
            return resource
        answer = Answer(self.jobs, "/generations", req, generation_id=generation_id, client=None)
        try:
            turn = answer.commit_turn()
        except BaseException:
            answer.stop(ERROR)
            raise
        resource = GenerationResource(generation_id, req, turn)
        self._remember(resource)
        self.start_grace(self._run(resource, answer))
        return resource

    # -- the four routes (``shared_log.SharedRegistry`` answers the same, from Redis) ----------

    async def created(self, req: GenerationRequest) -> tuple[dict, list[tuple[str, str]]]:
        """``POST /generations``: the 201's body and headers, for a resource ``create`` made."""
        resource = self.create(req)
        body = {
            "id": resource.id,
            "conversation_id": resource.turn.conversation_id,
            "message_id": resource.job.record.message_id if resource.job else None,  # None while it waits in line
            "events": f"/generations/{resource.id}/events",
        }
        return body, [("Location", f"/generations/{resource.id}"), *resource.headers()]

    async def events(self, client: ClientConnection, request: Request, generation_id: str) -> bool:
        """``GET /generations/{id}/events``: the events after ``Last-Event-ID``, kept ones at once, then live ones.

        A reader that reconnects with ``Last-Event-ID: N`` (an EventSource does
        so by itself after a drop) gets the events after N; nothing is
        generated again. One that already had the last event gets ``204``: any
        status but 200 stops an EventSource from reconnecting (204 is the one
        the HTML standard names for it; web-platform-tests check 204, 205, 404
        and 503 alike), and 204 says so without calling it an error. With
        ``--forget`` nothing was kept: every reader gets a new generation,
        tied to its connection, and never a 204. True: the connection may carry another request (a 204 only).
        """
        resource = self.get(generation_id)
        after = last_event_id(request)
        if resource.finished_for(after):
            return await responses.respond(client, request, None, status=204, headers=[("Cache-Control", "no-cache")])
        # The stream ends by closing: say so, so that a pooled client does not reuse the connection.
        stream = EventStream(client, request, headers=resource.headers(), accel_header=self.config.accel_header,
                             keep_alive=False)
        if stream.head_only:
            await stream.open()  # the head alone: with --forget, no run starts for a reader who reads nothing
            return False
        await self.send(client, stream, resource, after)
        return False  # the stream ended by closing

    async def cancelled(self, generation_id: str) -> dict:
        """``POST /generations/{id}/cancel``: stop it, then say where it stands."""
        resource = self.get(generation_id)
        await self.cancel(resource)
        return {"id": resource.id, "status": resource.status}

    async def describe(self, generation_id: str) -> dict:
        """``GET /generations/{id}``: how far it has come, its text so far, how it ended."""
        resource = self.get(generation_id)
        job = resource.job
        record = resource.record or LogRecord(id="", path="")  # none yet: --forget, before any reader
        return {
            "id": resource.id,
            "conversation_id": resource.turn.conversation_id,
            "message_id": record.message_id,
            "status": resource.status,
            "text": job.answer.text if job is not None else "",
            "tokens": record.tokens,
            "stop_reason": record.stop_reason,
            "stored_reason": record.stored_reason,
            "incomplete": (record.left_queue or record.stored_reason in INCOMPLETE_REASONS) if record.done else None,
            "events": len(resource.events),
        }

    def _remember(self, resource: GenerationResource) -> None:
        """Keep a new resource; past ``keep_generations``, forget the oldest that no longer run."""
        self.resources[resource.id] = resource
        excess = len(self.resources) - self.config.keep_generations
        if excess > 0:
            over = [g for g, r in self.resources.items() if not r.running and r is not resource]
            for generation_id in over[:excess]:
                del self.resources[generation_id]

    def _run(self, resource: GenerationResource, answer: Answer) -> Run:
        """A new run of the resource's request, admitted as ``answer``: it produces now, or once its turn comes.

        Given a slot at once, it starts here, before the 201 (or the stream)
        goes out, so that they can name its answer's row.
        """
        run = resource.run = Run(answer, ahead=answer.ticket.ahead)
        if not answer.ticket.waiting:
            answer.start()
        task = asyncio.create_task(self._produce(run))
        self.producers.add(task)
        task.add_done_callback(self.producers.discard)
        return run

    async def _produce(self, run: Run) -> None:
        """The answer's steps with the run as their delivery: each piece a numbered event, read or not.

        Its last event is kept whatever ends it, a cancel at shutdown too.
        """
        try:
            await run.answer.run(run)
        finally:
            self.cancel_grace(run)
            if not run.ended:
                run.add(*answer_ending(run.answer), last=True)

    # -- readers ------------------------------------------------------------------

    async def send(self, client: ClientConnection, stream: EventStream, resource: GenerationResource,
                   after: int | None) -> None:
        """Write one reader's stream: every ``/generations`` reading, kept or forgotten, comes through here.

        The reader joins a run, follows its events until the end or until it
        leaves, then leaves the run. What ``--forget`` changes is only which
        run it joins and what its leaving does (see ``_join`` and ``_leave``).
        A naive server does not watch the connection: only a failed write
        tells it the reader is gone.
        """
        run, after = self._join(resource, after)
        stream.headers = resource.headers()  # with --forget, the X-Request-Id of the run just started
        gone: str | None = None
        try:
            gone = await stream.follow(run.follow(after, self.config.ping_interval), naive=self.config.naive)
        finally:
            self._leave(resource, run, gone)

    def _join(self, resource: GenerationResource, after: int | None) -> tuple[Run, int]:
        """The run a reader follows, and the last event id it already has.

        Kept: the resource's one run, from where the reader left off. With
        ``--forget`` nothing was kept, so the reader gets a run of its own,
        from event 1, whatever it saw before (admitted like any request: 503
        before the stream opens, if the line is full).
        """
        if resource.keeps_events:
            run, after = resource.run, after or 0
            assert run is not None
        else:
            path = f"/generations/{resource.id}/events"
            answer = Answer(self.jobs, path, resource.req, turn=resource.turn, generation_id=resource.id)
            run, after = self._run(resource, answer), 0
        run.readers += 1
        self.cancel_grace(run)
        return run, after

    def _leave(self, resource: GenerationResource, run: Run, gone: str | None) -> None:
        """A reader is done with ``run``; ``gone`` is how it went, None if it read to the end.

        The last reader of a kept run leaves it the grace period: someone may
        come back for it. A ``--forget`` run has no one to come back for it,
        so it stops at once, for the reason its reader went.
        """
        run.readers -= 1
        if run.readers:
            return
        if resource.keeps_events:
            self.start_grace(run)
        elif gone is not None and run.running:
            self.stop_run(run, gone)

    # -- the grace period, cancel, shutdown ------------------------------------------

    def start_grace(self, run: Run) -> None:
        """Nobody is reading: unless a reader comes within ``--grace`` seconds, stop generating for nobody."""
        if run.running:
            loop = asyncio.get_running_loop()
            run.grace_timer = loop.call_later(self.config.grace, self.stop_run, run, GRACE_EXPIRED)

    def cancel_grace(self, run: Run) -> None:
        if run.grace_timer is not None:
            run.grace_timer.cancel()
            run.grace_timer = None

    def stop_run(self, run: Run, signal: str) -> None:
        """Stop its generation, or, while it waits in line, take it out (it ends at once, nothing generated)."""
        run.answer.stop(signal)

    async def cancel(self, resource: GenerationResource) -> None:
        """The user pressed stop: stop the generation (or its wait in line) and wait (a little) until it has."""
        run = resource.run
        if run is not None and resource.running:
            self.stop_run(run, CANCEL)
            try:
                await asyncio.wait_for(run.over.wait(), 5.0)
            except asyncio.TimeoutError:
                pass

    async def shutdown(self) -> None:
        """Let the running generations write their ending (interrupted) to the store."""
        if self.producers:
            await asyncio.wait(list(self.producers), timeout=2.0)
