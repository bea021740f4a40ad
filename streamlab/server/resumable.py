"""Generations as resources: ``POST /generations`` starts an answer that outlives its connection.

Its events are kept, numbered, so a reader who drops reconnects with
``Last-Event-ID`` and resumes where it left off, while the model carries on
for a grace period (``--grace``) with nobody reading. ``--forget`` is the
contrast, a policy of the same registry: keep nothing, and start every
reader's generation over (the same prompt and seed, paid for again).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from streamlab.protocol.http_head import HTTPError
from streamlab.protocol.endings import CANCEL, GRACE_EXPIRED
from streamlab.server.config import RETRY_MS, ServerConfig
from streamlab.server.jobs import Job, Jobs, Turn
from streamlab.server.requests import GenerationRequest
from streamlab.server.streams import Event


@dataclass(eq=False)
class GenerationResource:
    """A ``POST /generations`` answer: its request, its run, and its events, kept for replay.

    ``events[i]`` is the event with id ``i + 1``, as ``(name, data)``: the
    pieces are ``message`` events, the last one is ``end`` or ``error``.
    Readers ``follow`` the list, each from its own place, and wait on
    ``changed`` for more: any number of them can read at once, and one that
    reconnects picks up after the last id it saw. With ``--forget`` nothing
    is kept: ``job`` is the run of the latest reader, and ends with it.
    """

    id: str
    req: GenerationRequest
    turn: Turn
    job: Job | None = None
    events: list[tuple[str, Any]] = field(default_factory=list)
    ended: bool = False
    subscribers: int = 0
    grace_timer: asyncio.TimerHandle | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.job is not None and not self.job.record.done

    @property
    def status(self) -> str:
        """``waiting`` (``--forget``, before any reader), ``running`` or ``done``."""
        if self.job is None:
            return "waiting"
        return "running" if self.running else "done"

    def headers(self) -> list[tuple[str, str]]:
        headers = [("X-Generation-Id", self.id), ("X-Conversation-Id", self.turn.conversation_id)]
        if self.job is not None:
            headers.append(("X-Request-Id", self.job.record.id))
        return headers

    def add(self, name: str, data: Any, *, last: bool = False) -> None:
        """Keep one more event and wake every reader waiting for it."""
        self.events.append((name, data))
        self.ended = self.ended or last
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def finished_for(self, after: int | None) -> bool:
        """Whether a reader that saw event ``after`` already has everything: the cue for 204."""
        return after is not None and self.ended and after >= len(self.events)

    async def follow(self, after: int, ping_interval: float) -> AsyncIterator[Event | None]:
        """Every event after id ``after``, kept ones first, then live ones; ``None`` after a silence.

        The first event sent carries ``retry:``, so an ``EventSource`` knows how
        soon to reconnect after a drop.
        """
        number = after
        while True:
            while number < len(self.events):
                name, data = self.events[number]
                number += 1
                yield Event(data, name, id=number, retry=RETRY_MS if number == after + 1 else None)
            if self.ended:
                return
            try:
                await asyncio.wait_for(self.changed.wait(), ping_interval if ping_interval > 0 else None)
            except asyncio.TimeoutError:
                yield None


class Registry:
    """The ``/generations`` resources of one server, at most ``keep_generations`` of them remembered."""

    def __init__(self, jobs: Jobs, config: ServerConfig) -> None:
        self.jobs = jobs
        self.config = config
        self.resources: OrderedDict[str, GenerationResource] = OrderedDict()

    def get(self, id: str) -> GenerationResource:  # noqa: A002
        resource = self.resources.get(id)
        if resource is None:
            raise HTTPError(404, f"no generation {id!r}")
        return resource

    def create(self, req: GenerationRequest) -> GenerationResource:
        """A new resource; unless forgetting, its generation starts at once, with nobody reading yet.

        The reader may take a moment to connect, or drop and come back, and
        nothing is lost in between. Admission is checked before the turn is
        stored, so a refused request leaves nothing behind.
        """
        if not self.config.forget:
            self.jobs.admit()
        resource = GenerationResource(uuid.uuid4().hex, req, self.jobs.begin_turn(req))
        self._remember(resource)
        if not self.config.forget:
            resource.job = self._start(resource, "/generations")
            resource.task = asyncio.create_task(self._produce(resource))
            self.start_grace(resource)
        return resource

    def _remember(self, resource: GenerationResource) -> None:
        """Keep a new resource; past ``keep_generations``, forget the oldest that no longer run."""
        self.resources[resource.id] = resource
        excess = len(self.resources) - self.config.keep_generations
        if excess > 0:
            over = [g for g, r in self.resources.items() if not r.running and r is not resource]
            for generation_id in over[:excess]:
                del self.resources[generation_id]

    def _start(self, resource: GenerationResource, path: str) -> Job:
        return self.jobs.start(path, resource.req, turn=resource.turn, generation_id=resource.id)

    async def _produce(self, resource: GenerationResource) -> None:
        """Turn each piece into a kept, numbered event and store it, whether anyone reads or not."""
        job = resource.job
        assert job is not None
        try:
            async for piece in job.generation.pieces():
                job.answer.append(piece.text, piece.tokens)
                job.record.pieces_sent += 1
                resource.add("message", {"text": piece.text})
        finally:
            await self.jobs.finish(job)
            self.cancel_grace(resource)
            name, data = job.ending()
            resource.add(name, data, last=True)

    # -- readers, and the grace period when there are none ----------------------

    def start_grace(self, resource: GenerationResource) -> None:
        """Nobody is reading: unless a reader comes within ``--grace`` seconds, stop generating for nobody."""
        if resource.running and resource.job is not None:
            loop = asyncio.get_running_loop()
            resource.grace_timer = loop.call_later(self.config.grace, self.jobs.stop, resource.job, GRACE_EXPIRED)

    def cancel_grace(self, resource: GenerationResource) -> None:
        if resource.grace_timer is not None:
            resource.grace_timer.cancel()
            resource.grace_timer = None

    def subscribe(self, resource: GenerationResource) -> None:
        resource.subscribers += 1
        self.cancel_grace(resource)

    def unsubscribe(self, resource: GenerationResource) -> None:
        resource.subscribers -= 1
        if resource.subscribers == 0:
            self.start_grace(resource)

    def afresh(self, resource: GenerationResource) -> Job:
        """``--forget``: nothing was kept, so this reader's run starts over, tied to its connection."""
        resource.job = self._start(resource, f"/generations/{resource.id}/events")
        return resource.job

    async def cancel(self, resource: GenerationResource) -> None:
        """The user pressed stop: stop the generation and wait (a little) until it has."""
        job = resource.job
        if job is not None and resource.running:
            self.jobs.stop(job, CANCEL)
            try:
                await asyncio.wait_for(job.over.wait(), 5.0)
            except asyncio.TimeoutError:
                pass

    async def shutdown(self) -> None:
        """Let the kept generations write their ending (interrupted) to the store."""
        producers = [r.task for r in self.resources.values() if r.task is not None and not r.task.done()]
        if producers:
            await asyncio.wait(producers, timeout=2.0)
