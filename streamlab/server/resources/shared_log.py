"""``/generations`` kept in Redis: one event log and one job queue that every replica shares.

The in-memory registry (``resumable.py``) keeps a generation's events in the
process that made them, so a reader whose reconnect lands on another replica
finds nothing there. With ``serve --events redis://HOST:PORT`` the same four
routes keep everything in Redis instead, and no replica generates:

- ``POST /generations`` writes the request into a hash and one entry into the
  job stream (``streamlab:jobs``); a worker process (``python -m streamlab
  worker``, ``worker.py``) takes it with ``XREADGROUP`` and appends each piece
  to the generation's own stream. Past ``--max-waiting`` jobs no worker has
  taken yet, the POST is refused (503, ``Retry-After``), as the line in
  memory refuses (counted, then added: replicas that race may each add one).
- ``GET /generations/{id}/events`` follows that stream with ``XREAD BLOCK``,
  from any replica. A Redis stream entry's id (``1764625200123-0``, the
  milliseconds of Redis's clock and a sequence number) *is* the SSE ``id:``,
  so ``Last-Event-ID`` is where the next ``XREAD`` starts. A reader whose
  job still waits for a worker is told its place as the line in memory
  tells it (``queued`` ``{"ahead": N}``, unnumbered, at once and at every
  change: the jobs ahead of it that no worker has taken, looked up every
  ``PLACE_LOOK`` seconds), with keep-alives every ``--ping-interval``.
- a cancel, or the last reader leaving, is a field in the hash with the time
  Redis said it happened; the worker looks at the hash with every piece it
  appends (one round trip: the append and the look go in one pipeline), so it
  stops within a token or two whichever process told it.

Readers are counted by leases (``ReaderLeases``): each holds an entry of
``streamlab:gen:{id}:readers`` (a sorted set, reader -> the moment its lease
runs out, by Redis's clock) that its replica renews every third of the lease;
a replica killed with ``kill -9`` renews nothing, and any live replica's
sweep counts its readers out once their leases ran out, with the grace period
counted from then. The lease is ``--grace`` seconds, at most ``LEASE_SECONDS``
and at least ``LEASE_MIN``: a dead replica's reader costs at most twice the
grace period. Whoever touches the leases writes their count into the hash's
``readers`` (and ``orphaned_ms`` when it drops to 0), which the worker reads;
``live_readers`` counts the leases themselves.

When Redis does not answer, the replica stays up and says so:

- ``/health`` answers 503 with ``"redis": {"ok": false, "error": ...}``;
- new work (``POST /generations``, a cancel, ``GET /generations/{id}``, a
  new reader) is refused with 503 and ``Retry-After`` in the API's error
  body, never a 500; redis-py connects again with the next command, so the
  replica serves again as soon as Redis does;
- a reader already streaming waits: its replica reads again with backoff
  (keep-alives going out meanwhile) for the shorter of ``--grace`` and
  ``OUTAGE_WINDOW`` (3 s). A Redis that comes back within it (a restart,
  well under a second with a small log) resumes the stream where it was,
  nothing lost or repeated; one that comes back without the generation (no
  append-only file) ends it with an ``error`` that says the log was lost.
  Past the window the reader gets an ``error`` event naming the cause, within
  5 s of the loss, and the body's proper end: never a chunked body cut off.
  (A Redis that hangs rather than goes away is noticed when the read's
  timeout, the block plus ``ANSWER_MARGIN``, runs out.)

Conversations live in Redis too (``store/shared.py``): a POST commits the user's message there before it
queues the job, and the worker reads the conversation up to it and writes the answer's row.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import traceback
import uuid
from contextlib import contextmanager
from typing import Any, AsyncIterator, Iterator

from streamlab.net.errors import UserError
from streamlab.protocol.endings import CANCEL, INCOMPLETE_REASONS
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import Request
from streamlab.server.transport import responses
from streamlab.server.config import RETRY_MS, ServerConfig, flag
from streamlab.server.transport.connection import ClientConnection
from streamlab.server.transport.events import Event, dumps
from streamlab.server.wire.formats import error_body, place_data, stopped_in_line
from streamlab.server.answers.answer import commit_turn
from streamlab.server.answers.jobs import busy
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.store.shared import SharedStore, is_redis_error
from streamlab.server.transport.streams import EventStream

PREFIX = "streamlab"
JOBS = f"{PREFIX}:jobs"  # the job queue: one entry per generation, read by the workers' consumer group
GROUP = "workers"
LEASES = f"{PREFIX}:leases"  # every generation with reader leases -> when its latest lease runs out (the sweep's index)
KEEP_SECONDS = 3600  # an ended generation's hash and stream are kept this long, then Redis drops them
CANCEL_WAIT = 5.0  # s: how long a cancel waits for the worker's end event before answering
ENDINGS = ("end", "error")
ENTRY_ID = re.compile(r"[0-9]{1,18}-[0-9]{1,18}")
# The request fields a worker needs to generate (and nothing a replica alone knows).
REQUEST_FIELDS = ("prompt", "max_tokens", "seed", "chat", "ignore_eos", "temperature", "top_p", "stop")
PLACE_LOOK = 0.25  # s between two looks at the place of a job still waiting for a worker
PLACE_LIMIT = 1000  # the most jobs one look counts ahead (it reads at most this many entries)
OUTAGE_WINDOW = 3.0  # s: the longest a reader's stream waits for Redis to answer again before its error
BACKOFF = (0.05, 0.5)  # s: the first wait before reading the log again after a failure, and the longest
LEASE_SECONDS = 10.0  # a reader's lease at most (the grace period, when that is shorter) ...
LEASE_MIN = 1.0  # ... and at least: renewed every third of it
SWEEP_BATCH = 64  # generations whose leases all ran out, counted again per sweep
HEALTH_WAIT = 2.0  # s: how long /health waits for Redis's PONG


def meta_key(generation_id: str) -> str:
    return f"{PREFIX}:gen:{generation_id}"


def events_key(generation_id: str) -> str:
    return f"{PREFIX}:gen:{generation_id}:events"


def readers_key(generation_id: str) -> str:
    """The generation's reader leases: a sorted set, reader id -> when its lease runs out (ms, Redis's clock)."""
    return f"{PREFIX}:gen:{generation_id}:readers"


def entry_ms(entry_id: str) -> int:
    """Redis's clock, in milliseconds, when the entry was appended."""
    return int(entry_id.split("-", 1)[0])


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as numbers, to compare (``"10-0" > "9-5"``, which as text it is not)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def encode_entry(name: str, data: Any, tokens: int = 0) -> dict[str, Any]:
    """An answer's event as a generation stream's entry: its name, its data as JSON, the tokens made so far."""
    return {"e": name, "d": dumps(data), "n": tokens}


def decode_entry(fields: dict[str, str]) -> tuple[str, Any, int]:
    """A stream entry as ``(event name, data, tokens it carried)``: what ``encode_entry`` wrote."""
    return fields["e"], json.loads(fields["d"]), int(fields.get("n", 0))


# How long Redis may take to answer once a blocking read's time is up (redis-py's own default timeout).
ANSWER_MARGIN = 5.0


def open_client(url: str, longest_block: float = CANCEL_WAIT) -> Any:
    """A redis-py asyncio client for ``url`` (replies decoded as text); the tests swap in a fake.

    Its read timeout outlasts the longest ``XREAD BLOCK`` it will send (``longest_block`` seconds, 0:
    forever) by :data:`ANSWER_MARGIN`. redis-py 8 reads with a 5 s timeout by default, so a reader's stream
    silent for 5 s (a long prompt, a queue, a worker slowed down) ended in a ``TimeoutError`` where the
    block it asked for was the 15 s between pings. A command that finds its pooled connection closed (by a
    Redis restarted since) goes once more on a new one: else each idle connection's first command after the
    restart failed, a 503 while Redis served.
    """
    try:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
    except ImportError:
        raise UserError("--events redis://...: redis-py is not installed here (pip install redis)") from None
    timeout, closed = None if longest_block <= 0 else longest_block + ANSWER_MARGIN, aioredis.ConnectionError
    try:
        return aioredis.from_url(url, decode_responses=True, socket_timeout=timeout,
                                 retry=Retry(NoBackoff(), 1, supported_errors=(closed,)), retry_on_error=[closed])
    except ValueError as err:
        raise UserError(f"--events {url}: {err} (give redis://HOST:PORT)") from None


def is_named(err: BaseException, name: str) -> bool:
    """redis-py's exception of that class name (``WatchError``, ``ResponseError``), without importing redis-py."""
    return type(err).__name__ == name and is_redis_error(err)


@contextmanager
def answered_busy(doing: str) -> Iterator[None]:
    """Redis not answering, as a 503 with ``Retry-After`` (the replica is fine; the client may try again soon)."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - redis-py's ConnectionError, TimeoutError...
        if not is_redis_error(err):
            raise
        raise busy(f"the shared log (Redis) does not answer, so {doing} must wait: {err}") from None


async def ensure_group(redis: Any) -> None:
    """The job stream and its consumer group, made by whoever comes first (replica or worker)."""
    try:
        await redis.xgroup_create(JOBS, GROUP, id="0", mkstream=True)
    except Exception as err:  # noqa: BLE001 - redis-py's ResponseError; BUSYGROUP: it exists already
        if "BUSYGROUP" not in str(err):
            raise


async def redis_ms(redis: Any) -> int:
    """Now, by Redis's clock: the clock every stream entry id is stamped with."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def jobs_waiting(redis: Any, before: str = "+", limit: int = PLACE_LIMIT) -> int | None:
    """How many jobs no worker has taken yet (at most ``limit``), of those before the job ``before``.

    The group's last delivered id says where the workers are; what comes
    after it waits (a job cancelled in line is deleted from the queue, so it
    is not counted). None: the job ``before`` was taken already, or there is
    no queue (a Redis that came back without it).
    """
    try:
        groups = await redis.xinfo_groups(JOBS)
    except Exception as err:  # noqa: BLE001 - ResponseError: no such key
        if is_named(err, "ResponseError"):
            return None
        raise
    last = next((g["last-delivered-id"] for g in groups if g["name"] == GROUP), None)
    if last is None or (before != "+" and entry_order(before) <= entry_order(last)):
        return None
    ms, seq = entry_order(last)
    entries = await redis.xrange(JOBS, min=f"{ms}-{seq + 1}", max=before, count=limit + 1)
    return min(limit, sum(1 for entry_id, _ in entries if entry_id != before))


async def live_readers(redis: Any, generation_id: str, now_ms: int) -> int:
    """The readers of a generation whose lease has not run out at ``now_ms`` (Redis's clock): the truthful count.

    What a worker may read with every piece instead of the hash's ``readers``
    (which the replicas keep equal to it whenever they touch the leases);
    ``ZCOUNT readers_key(id) (now +inf`` in a pipeline of its own does the same.
    """
    return int(await redis.zcount(readers_key(generation_id), f"({now_ms}", "+inf"))


def lease_seconds(grace: float) -> float:
    """A reader's lease: the grace period, between ``LEASE_MIN`` and ``LEASE_SECONDS``."""
    return min(LEASE_SECONDS, max(LEASE_MIN, grace))


def lost(generation_id: str) -> Event:
    """The ``error`` that ends a stream whose generation Redis no longer has (restarted without its data)."""
    message = f"the shared log lost generation {generation_id} (Redis came back without it)"
    return Event({**error_body(503, message), "id": generation_id}, "error")


class ReaderLeases:
    """This replica's readers, each a lease in Redis that runs out unless renewed, and the sweep of dead ones.

    ``join`` and ``leave`` add and remove one lease and write the live count
    into the hash (a ``WATCH`` transaction on the generation's leases: two
    replicas counting at once cannot leave a stale count). ``run`` renews
    every lease this replica holds every third of the lease (one pipelined
    round trip for all of them), then counts again the generations whose
    leases all ran out: a replica killed with ``kill -9`` renews nothing, and
    its readers stop counting within the lease, the grace period starting
    from the moment the last lease ran out.
    """

    def __init__(self, redis: Any, seconds: float) -> None:
        self.redis = redis
        self.ms = int(seconds * 1000)
        self.held: dict[str, str] = {}  # reader id -> generation id, the leases this replica renews

    async def join(self, generation_id: str) -> str:
        """A new reader of the generation: its lease (its id), counted in the hash."""
        reader = uuid.uuid4().hex
        now = await redis_ms(self.redis)
        self.held[reader] = generation_id
        try:
            await self.recount(generation_id, now, add=(reader, now + self.ms))
        except BaseException:
            self.held.pop(reader, None)
            raise
        return reader

    async def leave(self, generation_id: str, reader: str) -> None:
        """The reader is gone: its lease removed (renewed no more even if Redis does not answer now)."""
        self.held.pop(reader, None)
        now = await redis_ms(self.redis)
        await self.recount(generation_id, now, remove=reader, orphaned=now)

    async def recount(self, generation_id: str, now: int, *, add: tuple[str, int] | None = None,
                      remove: str | None = None, orphaned: int | None = None) -> int:
        """Drop the leases run out by ``now``, add or remove one, and write the live count into the hash.

        When the count drops to 0, ``orphaned_ms`` becomes ``orphaned`` (the
        moment the last reader left, or its lease ran out): the worker counts
        the grace period from there. The count, once written.
        """
        key, meta = readers_key(generation_id), meta_key(generation_id)
        count = 0
        for _ in range(5):  # a lease renewed meanwhile makes the transaction fail: count again
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    live = dict(await pipe.zrangebyscore(key, f"({now}", "+inf", withscores=True))
                    before = await pipe.hget(meta, "readers")
                    if add is not None:
                        live[add[0]] = add[1]
                    live.pop(remove, None)
                    count = len(live)
                    pipe.multi()
                    pipe.zremrangebyscore(key, "-inf", now)
                    if add is not None:
                        pipe.zadd(key, {add[0]: add[1]})
                    if remove is not None:
                        pipe.zrem(key, remove)
                    if before is None:  # no such generation (any more): no count to keep
                        pipe.delete(key)
                        pipe.zrem(LEASES, generation_id)
                    else:
                        fields: dict[str, int] = {"readers": count}
                        if count == 0 and int(before) > 0 and orphaned is not None:
                            fields["orphaned_ms"] = orphaned
                        pipe.hset(meta, mapping=fields)
                        if count:
                            pipe.zadd(LEASES, {generation_id: int(max(live.values()))})
                            pipe.expire(key, KEEP_SECONDS)
                        else:
                            pipe.zrem(LEASES, generation_id)
                    await pipe.execute()
                    return count
                except Exception as err:  # noqa: BLE001 - redis-py's WatchError: the leases changed meanwhile
                    if not is_named(err, "WatchError"):
                        raise
        return count

    async def renew(self) -> None:
        """Renew every lease this replica holds, then sweep the generations whose leases all ran out."""
        now = await redis_ms(self.redis)
        held = list(self.held.items())
        if held:
            pipe = self.redis.pipeline(transaction=False)
            for reader, generation_id in held:
                pipe.zadd(readers_key(generation_id), {reader: now + self.ms}, xx=True, ch=True)
                pipe.zadd(LEASES, {generation_id: now + self.ms})
            renewed = await pipe.execute()
            for (reader, generation_id), changed in zip(held, renewed[::2]):
                if not changed and self.held.get(reader) == generation_id:  # swept meanwhile (a stall): back in
                    await self.recount(generation_id, now, add=(reader, now + self.ms))
        ran_out = await self.redis.zrangebyscore(LEASES, "-inf", now, start=0, num=SWEEP_BATCH, withscores=True)
        for generation_id, last in ran_out:
            await self.recount(generation_id, now, orphaned=int(last))

    async def run(self) -> None:
        """Renew and sweep for ever, every third of a lease; Redis not answering is tried again next time."""
        while True:
            await asyncio.sleep(self.ms / 3000)
            try:
                await self.renew()
            except Exception as err:  # noqa: BLE001 - a bug must not stop the renewals of every other reader
                if not is_redis_error(err):
                    print("streamlab: renewing the readers' leases failed:", file=sys.stderr)
                    traceback.print_exc(file=sys.stderr)


class SharedRegistry:
    """The ``/generations`` routes over Redis: the interface of ``resumable.Registry``, the state elsewhere."""

    def __init__(self, redis: Any, config: ServerConfig, served_by: str = "", store: SharedStore | None = None) -> None:
        self.redis = redis
        self.config = config
        self.store = store  # the conversations in Redis, where a POST commits its user's message (None: it cannot)
        self.served_by = served_by  # this replica's URL, in every stream's X-Served-By: who served which part
        self.leases = ReaderLeases(redis, lease_seconds(config.grace))
        self.renewing: asyncio.Task | None = None

    @classmethod
    async def open(cls, url: str, config: ServerConfig, served_by: str = "") -> "SharedRegistry":
        # follow() blocks for a ping interval (0: until an entry comes), a cancel for CANCEL_WAIT.
        redis = open_client(url, max(config.ping_interval, CANCEL_WAIT) if config.ping_interval > 0 else 0)
        try:
            await redis.ping()
            await ensure_group(redis)
        except (OSError, ConnectionError) as err:
            await redis.aclose()
            raise UserError(f"--events {url}: no Redis answers there ({err})") from None
        except Exception as err:  # noqa: BLE001 - redis-py's own ConnectionError is not OSError
            await redis.aclose()
            if type(err).__name__ in ("ConnectionError", "TimeoutError", "AuthenticationError"):
                raise UserError(f"--events {url}: no Redis answers there ({err})") from None
            raise
        registry = cls(redis, config, served_by, SharedStore.open(url, flush_interval=config.flush_interval))
        registry.renewing = asyncio.create_task(registry.leases.run())
        return registry

    async def _meta(self, generation_id: str) -> dict[str, str]:
        meta = await self.redis.hgetall(meta_key(generation_id))
        if not meta:
            raise HTTPError(404, f"no generation {generation_id!r}")
        return meta

    async def health(self) -> dict:
        """Whether Redis answers now (``/health``'s ``redis``): ``{"ok": true}``, or false and the error."""
        try:
            await asyncio.wait_for(self.redis.ping(), HEALTH_WAIT)
        except Exception as err:  # noqa: BLE001 - redis-py's ConnectionError, a timeout
            if not is_redis_error(err):
                raise
            return {"ok": False, "error": f"{type(err).__name__}: {err}" if str(err) else type(err).__name__}
        return {"ok": True}

    # -- the four routes -------------------------------------------------------------

    async def created(self, req: GenerationRequest) -> tuple[dict, list[tuple[str, str]]]:
        """``POST /generations``: the user's message committed, then the request in a hash and a job in the queue.

        The 201 names the conversation (the one given, or a new one). Refused: 503 while ``--max-waiting`` jobs
        wait for a worker already, 404 for a ``conversation_id`` the shared store does not have.
        """
        store = self.store
        if store is None:
            raise RuntimeError("a registry made without its store cannot take new generations")
        if req.conversation_id is not None and store.conversation(req.conversation_id) is None:
            raise HTTPError(404, f"no conversation {req.conversation_id!r}")
        generation_id = uuid.uuid4().hex
        request = {name: getattr(req, name) for name in REQUEST_FIELDS}
        limit = max(1, self.config.max_waiting)  # 0 (no line): refused while any job waits
        with answered_busy("a new generation"):
            waiting = await jobs_waiting(self.redis, limit=limit)
            if waiting is None:  # Redis came back without the queue: make it again
                await ensure_group(self.redis)
                waiting = 0
            if waiting >= limit:
                jobs = f"{waiting} job{'' if waiting == 1 else 's'}"
                raise busy(f"the shared queue is full ({jobs} waiting for a worker, {flag('max_waiting')}"
                           f" {self.config.max_waiting})")
            turn = commit_turn(store, req, [], ())  # the worker measures the prompt, with the model
            now = await redis_ms(self.redis)
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(meta_key(generation_id), mapping={
                "request": dumps(request), "status": "queued", "readers": 0, "orphaned_ms": now,
                "grace_ms": int(self.config.grace * 1000), "tokens": 0,
                "conversation_id": turn.conversation_id, "user_message_id": turn.user_message_id,
            })
            pipe.xadd(JOBS, {"generation": generation_id})
            job = (await pipe.execute())[1]
            await self.redis.hset(meta_key(generation_id), "job", job)  # where its place in the queue is read
        body = {"id": generation_id, "conversation_id": turn.conversation_id, "message_id": None,
                "events": f"/generations/{generation_id}/events"}  # message_id: once a worker begins the answer
        return body, [("Location", f"/generations/{generation_id}"), ("X-Generation-Id", generation_id),
                      ("X-Conversation-Id", turn.conversation_id)]

    async def events(self, client: ClientConnection, request: Request, generation_id: str) -> bool:
        """``GET /generations/{id}/events`` from any replica: the stream after ``Last-Event-ID``, or 204 (kept alive)."""
        header = (request.header("last-event-id") or "").strip()
        after = header if ENTRY_ID.fullmatch(header) else "0-0"
        with answered_busy("this generation's events"):
            meta = await self._meta(generation_id)
            last = await self.redis.xrevrange(events_key(generation_id), count=1)
        if last and last[0][0] == after and last[0][1]["e"] in ENDINGS:
            return await responses.respond(client, request, None, status=204, headers=[("Cache-Control", "no-cache")])
        stream = EventStream(client, request, headers=[("X-Generation-Id", generation_id),
                                                       ("X-Served-By", self.served_by)],
                             accel_header=self.config.accel_header, keep_alive=False)
        if stream.head_only:
            await stream.open()
            return False
        job = meta.get("job") if meta.get("status") == "queued" else None
        with answered_busy("a new reader"):
            reader = await self.leases.join(generation_id)
        try:
            await stream.follow(self.follow(generation_id, after, job), naive=self.config.naive)
        finally:
            try:
                await asyncio.shield(self.leases.leave(generation_id, reader))
            except Exception as err:  # noqa: BLE001 - the stream has ended already: its lease runs out by itself
                if not is_redis_error(err):
                    raise
        return False  # the stream ended by closing

    async def follow(self, generation_id: str, after: str, job: str | None = None) -> AsyncIterator[Event | None]:
        """Every entry after ``after``, kept ones first, then live ones (``XREAD BLOCK``); None: a keep-alive is due.

        ``job``: the generation's entry in the job queue, while it waits for a
        worker; its place is told (``queued``) at once and at every change. A
        log that stops answering is read again with backoff for the shorter of
        the grace period and ``OUTAGE_WINDOW``, then the stream ends with an
        ``error`` event that says why (and the body's proper end).
        """
        key, meta, first = events_key(generation_id), meta_key(generation_id), True
        loop, ping = asyncio.get_running_loop(), self.config.ping_interval
        window = min(self.config.grace, OUTAGE_WINDOW)
        told: int | None = None
        quiet_since, outage, backoff = loop.time(), None, BACKOFF[0]
        while True:
            try:
                if outage is not None and not await self.redis.exists(meta):
                    yield lost(generation_id)
                    return
                if job is not None:
                    ahead = await jobs_waiting(self.redis, job)
                    if ahead is None:  # a worker took it (or it is gone): its events follow
                        job = None
                    elif ahead != told:
                        told = ahead
                        yield Event(place_data(ahead), "queued", retry=RETRY_MS if first else None)
                        first, quiet_since = False, loop.time()
                wait = quiet_since + ping - loop.time() if ping > 0 else None  # until a keep-alive is due
                if job is not None:
                    wait = PLACE_LOOK if wait is None else min(wait, PLACE_LOOK)
                block = 0 if wait is None else max(1, int(wait * 1000))  # 0: until an entry comes
                found = await self.redis.xread({key: after}, count=256, block=block)
                outage, backoff = None, BACKOFF[0]
                if not found and ping > 0 and loop.time() >= quiet_since + ping - 0.01:
                    if not await self.redis.exists(meta):  # gone in a silence: a Redis restarted without it
                        yield lost(generation_id)
                        return
                    quiet_since = loop.time()
                    yield None
            except Exception as err:  # noqa: BLE001 - redis-py's ConnectionError, TimeoutError...
                if not is_redis_error(err):
                    print(f"streamlab: reading generation {generation_id} failed:", file=sys.stderr)
                    traceback.print_exc(file=sys.stderr)
                    yield Event({**error_body(500, "internal server error"), "id": generation_id}, "error")
                    return
                now = loop.time()
                outage = now if outage is None else outage
                if now - outage >= window:
                    message = f"the shared log cannot be read: {err} (no answer from Redis for {now - outage:.1f} s)"
                    yield Event({**error_body(503, message), "id": generation_id}, "error")
                    return
                if ping > 0 and now - quiet_since >= ping:
                    quiet_since = now
                    yield None
                await asyncio.sleep(max(0.0, min(backoff, outage + window - now)))
                backoff = min(2 * backoff, BACKOFF[1])
                continue
            for entry_id, fields in (found[0][1] if found else []):
                name, data, _ = decode_entry(fields)
                yield Event(data, name, id=entry_id, retry=RETRY_MS if first else None)
                first, after, quiet_since = False, entry_id, loop.time()
                if name in ENDINGS:
                    return

    async def cancelled(self, generation_id: str) -> dict:
        """``POST /generations/{id}/cancel`` on any replica: a field the worker reads with its next piece.

        Answers once the worker wrote the end (or after ``CANCEL_WAIT``). A
        generation no worker has taken yet ends here, nothing generated.
        """
        with answered_busy("a cancel"):
            meta = await self._meta(generation_id)
            if meta["status"] != "done":
                now = await redis_ms(self.redis)
                await self.redis.hset(meta_key(generation_id), mapping={"cancel": CANCEL, "cancel_ms": now})
                await self._end_if_queued(generation_id)
                await self._wait_for_end(generation_id)
            return {"id": generation_id, "status": (await self._meta(generation_id))["status"]}

    async def _end_if_queued(self, generation_id: str) -> None:
        """End a generation that is still waiting for a worker, and take its job out of the queue."""
        key = meta_key(generation_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                if await pipe.hget(key, "status") != "queued":
                    return
                job = await pipe.hget(key, "job")
                pipe.multi()
                pipe.hset(key, mapping={"status": "done", "stop_reason": "stopped"})
                pipe.xadd(events_key(generation_id), encode_entry("end", stopped_in_line()))
                if job:  # not counted as waiting any more (a worker that took it meanwhile skips it: done)
                    pipe.xdel(JOBS, job)
                await pipe.execute()
            except Exception as err:  # noqa: BLE001 - WatchError: a worker took it meanwhile
                if not is_named(err, "WatchError"):
                    raise

    async def _wait_for_end(self, generation_id: str) -> None:
        key, after = events_key(generation_id), "0-0"
        deadline = asyncio.get_running_loop().time() + CANCEL_WAIT
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            found = await self.redis.xread({key: after}, count=256, block=max(1, int(left * 1000)))
            for entry_id, fields in (found[0][1] if found else []):
                after = entry_id
                if fields["e"] in ENDINGS:
                    return

    async def describe(self, generation_id: str) -> dict:
        """``GET /generations/{id}``: its status, its text so far (from the stream), how it ended."""
        with answered_busy("a look at this generation"):
            meta = await self._meta(generation_id)
            entries = await self.redis.xrange(events_key(generation_id))
        decoded = [decode_entry(fields) for _, fields in entries]
        ends = [i for i, (name, _, _) in enumerate(decoded) if name in ENDINGS]
        decoded = decoded[: ends[0] + 1] if ends else decoded  # a worker taken over may append once more: not read
        text = "".join(data["text"] for name, data, _ in decoded if name == "message")
        ending = decoded[-1][1] if ends else None
        stored = ending.get("stop_reason") if ending else None
        return {
            "id": generation_id, "conversation_id": meta.get("conversation_id"), "message_id": meta.get("message_id"),
            "status": meta["status"], "text": text, "tokens": int(meta.get("tokens", 0)), "stop_reason": stored, "stored_reason": stored,
            "incomplete": (stored in INCOMPLETE_REASONS) if ending else None, "events": len(entries),
            "worker": meta.get("worker"),
        }

    async def shutdown(self) -> None:
        if self.renewing is not None:
            self.renewing.cancel()
            await asyncio.gather(self.renewing, return_exceptions=True)
        await self.redis.aclose()
        if self.store is not None:
            self.store.close()
