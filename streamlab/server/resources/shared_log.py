"""``/generations`` kept in Redis: one event log and one job queue that every replica shares.

The in-memory registry (``resumable.py``) keeps a generation's events in the
process that made them, so a reader whose reconnect lands on another replica
finds nothing there. With ``serve --events redis://HOST:PORT`` the same four
routes keep everything in Redis instead, and no replica generates:

- ``POST /generations`` writes the request into a hash and one entry into the
  job stream (``streamlab:jobs``); a worker process (``python -m streamlab
  worker``, ``worker.py``) takes it with ``XREADGROUP`` and appends each piece
  to the generation's own stream.
- ``GET /generations/{id}/events`` follows that stream with ``XREAD BLOCK``,
  from any replica. A Redis stream entry's id (``1764625200123-0``, the
  milliseconds of Redis's clock and a sequence number) *is* the SSE ``id:``,
  so ``Last-Event-ID`` is where the next ``XREAD`` starts.
- a cancel, or the last reader leaving, is a field in the hash with the time
  Redis said it happened; the worker looks at the hash with every piece it
  appends (one round trip: the append and the look go in one pipeline), so it
  stops within a token or two whichever process told it.

Conversations stay in each replica's own SQLite store, which other replicas
cannot read: this log takes a prompt, not a ``conversation_id``.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any, AsyncIterator

from streamlab.net.errors import UserError
from streamlab.protocol.endings import CANCEL, INCOMPLETE_REASONS
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import Request
from streamlab.server.transport import responses
from streamlab.server.config import RETRY_MS, ServerConfig
from streamlab.server.transport.connection import ClientConnection
from streamlab.server.transport.events import Event, dumps
from streamlab.server.wire.formats import error_body, stopped_in_line
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.transport.streams import EventStream

PREFIX = "streamlab"
JOBS = f"{PREFIX}:jobs"  # the job queue: one entry per generation, read by the workers' consumer group
GROUP = "workers"
KEEP_SECONDS = 3600  # an ended generation's hash and stream are kept this long, then Redis drops them
CANCEL_WAIT = 5.0  # s: how long a cancel waits for the worker's end event before answering
ENDINGS = ("end", "error")
ENTRY_ID = re.compile(r"[0-9]{1,18}-[0-9]{1,18}")
# The request fields a worker needs to generate (and nothing a replica alone knows).
REQUEST_FIELDS = ("prompt", "max_tokens", "seed", "chat", "ignore_eos", "temperature", "top_p", "stop")


def meta_key(generation_id: str) -> str:
    return f"{PREFIX}:gen:{generation_id}"


def events_key(generation_id: str) -> str:
    return f"{PREFIX}:gen:{generation_id}:events"


def entry_ms(entry_id: str) -> int:
    """Redis's clock, in milliseconds, when the entry was appended."""
    return int(entry_id.split("-", 1)[0])


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
    block it asked for was the 15 s between pings.
    """
    try:
        import redis.asyncio as aioredis
    except ImportError:
        raise UserError("--events redis://...: redis-py is not installed here (pip install redis)") from None
    timeout = None if longest_block <= 0 else longest_block + ANSWER_MARGIN
    try:
        return aioredis.from_url(url, decode_responses=True, socket_timeout=timeout)
    except ValueError as err:
        raise UserError(f"--events {url}: {err} (give redis://HOST:PORT)") from None


def is_redis_error(err: BaseException) -> bool:
    """An error of redis-py's (its connection lost, a timeout, a refusal), by its module: no import needed."""
    return type(err).__module__.split(".")[0] == "redis" or isinstance(err, (ConnectionError, TimeoutError))


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


class SharedRegistry:
    """The ``/generations`` routes over Redis: the interface of ``resumable.Registry``, the state elsewhere."""

    def __init__(self, redis: Any, config: ServerConfig, served_by: str = "") -> None:
        self.redis = redis
        self.config = config
        self.served_by = served_by  # this replica's URL, in every stream's X-Served-By: who served which part

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
        return cls(redis, config, served_by)

    async def _meta(self, generation_id: str) -> dict[str, str]:
        meta = await self.redis.hgetall(meta_key(generation_id))
        if not meta:
            raise HTTPError(404, f"no generation {generation_id!r}")
        return meta

    # -- the four routes -------------------------------------------------------------

    async def created(self, req: GenerationRequest) -> tuple[dict, list[tuple[str, str]]]:
        """``POST /generations``: the request in a hash, a job in the queue; the 201's body and headers."""
        if req.conversation_id is not None:
            raise HTTPError(400, "the shared event log keeps no conversations: send a prompt without conversation_id")
        generation_id = uuid.uuid4().hex
        request = {name: getattr(req, name) for name in REQUEST_FIELDS}
        now = await redis_ms(self.redis)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(meta_key(generation_id), mapping={
            "request": dumps(request), "status": "queued", "readers": 0, "orphaned_ms": now,
            "grace_ms": int(self.config.grace * 1000), "tokens": 0,
        })
        pipe.xadd(JOBS, {"generation": generation_id})
        await pipe.execute()
        body = {"id": generation_id, "conversation_id": None, "message_id": None,
                "events": f"/generations/{generation_id}/events"}
        return body, [("Location", f"/generations/{generation_id}"), ("X-Generation-Id", generation_id)]

    async def events(self, client: ClientConnection, request: Request, generation_id: str) -> bool:
        """``GET /generations/{id}/events`` from any replica: the stream after ``Last-Event-ID``, or 204 (kept alive)."""
        await self._meta(generation_id)
        header = (request.header("last-event-id") or "").strip()
        after = header if ENTRY_ID.fullmatch(header) else "0-0"
        last = await self.redis.xrevrange(events_key(generation_id), count=1)
        if last and last[0][0] == after and last[0][1]["e"] in ENDINGS:
            return await responses.respond(client, request, None, status=204, headers=[("Cache-Control", "no-cache")])
        stream = EventStream(client, request, headers=[("X-Generation-Id", generation_id),
                                                       ("X-Served-By", self.served_by)],
                             accel_header=self.config.accel_header, keep_alive=False)
        if stream.head_only:
            await stream.open()
            return False
        await self.redis.hincrby(meta_key(generation_id), "readers", 1)
        gone: str | None = None
        try:
            gone = await stream.follow(self.follow(generation_id, after), naive=self.config.naive)
        finally:
            try:
                await asyncio.shield(self._leave(generation_id, gone))
            except Exception as err:  # noqa: BLE001 - the stream has ended already: nothing more to tell its reader
                if not is_redis_error(err):
                    raise
        return False  # the stream ended by closing

    async def follow(self, generation_id: str, after: str) -> AsyncIterator[Event | None]:
        """Every entry after ``after``, kept ones first, then live ones (``XREAD BLOCK``); None after a silence.

        A log that cannot be read (Redis gone, or not answering) ends the
        stream with an ``error`` event that says so, and the body's proper
        end: never a chunked body cut off, which a client can only report as
        a broken connection.
        """
        key, first = events_key(generation_id), True
        block = int(self.config.ping_interval * 1000) if self.config.ping_interval > 0 else 0
        while True:
            try:
                found = await self.redis.xread({key: after}, count=256, block=block)
            except Exception as err:  # noqa: BLE001 - redis-py's ConnectionError, TimeoutError...
                if not is_redis_error(err):
                    raise
                yield Event({**error_body(503, f"the shared log cannot be read: {err}"), "id": generation_id}, "error")
                return
            if not found:
                yield None
                continue
            for entry_id, fields in found[0][1]:
                name, data, _ = decode_entry(fields)
                yield Event(data, name, id=entry_id, retry=RETRY_MS if first else None)
                first, after = False, entry_id
                if name in ENDINGS:
                    return

    async def _leave(self, generation_id: str, gone: str | None) -> None:
        """One reader fewer; the last one out starts the grace period (by Redis's clock), as in memory."""
        key, pipe = meta_key(generation_id), self.redis.pipeline(transaction=True)
        if gone is not None:  # the time first, then the count: a worker never sees 0 readers with an old time
            pipe.hset(key, "orphaned_ms", await redis_ms(self.redis))
        pipe.hincrby(key, "readers", -1)
        await pipe.execute()

    async def cancelled(self, generation_id: str) -> dict:
        """``POST /generations/{id}/cancel`` on any replica: a field the worker reads with its next piece.

        Answers once the worker wrote the end (or after ``CANCEL_WAIT``). A
        generation no worker has taken yet ends here, nothing generated.
        """
        meta = await self._meta(generation_id)
        if meta["status"] != "done":
            now = await redis_ms(self.redis)
            await self.redis.hset(meta_key(generation_id), mapping={"cancel": CANCEL, "cancel_ms": now})
            await self._end_if_queued(generation_id)
            await self._wait_for_end(generation_id)
        return {"id": generation_id, "status": (await self._meta(generation_id))["status"]}

    async def _end_if_queued(self, generation_id: str) -> None:
        """End a generation that is still waiting for a worker (the worker that takes it later skips it)."""
        key = meta_key(generation_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                if await pipe.hget(key, "status") != "queued":
                    return
                pipe.multi()
                pipe.hset(key, mapping={"status": "done", "stop_reason": "stopped"})
                pipe.xadd(events_key(generation_id), encode_entry("end", stopped_in_line()))
                await pipe.execute()
            except Exception as err:  # noqa: BLE001 - WatchError: a worker took it meanwhile
                if type(err).__name__ != "WatchError":
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
        meta = await self._meta(generation_id)
        entries = await self.redis.xrange(events_key(generation_id))
        decoded = [decode_entry(fields) for _, fields in entries]
        ends = [i for i, (name, _, _) in enumerate(decoded) if name in ENDINGS]
        decoded = decoded[: ends[0] + 1] if ends else decoded  # a worker taken over may append once more: not read
        text = "".join(data["text"] for name, data, _ in decoded if name == "message")
        ending = decoded[-1][1] if ends else None
        stored = ending.get("stop_reason") if ending else None
        return {
            "id": generation_id, "conversation_id": None, "message_id": None, "status": meta["status"],
            "text": text, "tokens": int(meta.get("tokens", 0)), "stop_reason": stored, "stored_reason": stored,
            "incomplete": (stored in INCOMPLETE_REASONS) if ending else None, "events": len(entries),
            "worker": meta.get("worker"),
        }

    async def shutdown(self) -> None:
        await self.redis.aclose()
