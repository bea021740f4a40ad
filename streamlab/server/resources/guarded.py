"""What a worker writes into a generation's log, guarded: a piece only by the job's owner, the end only while it owns it.

A worker that stalls (a long pause of its process, a swap, a debugger) past
``--claim-idle`` looks dead: another worker claims its job, names itself in the
generation's hash, reads the stream and continues the answer after the pieces
it found (``continued.py``). Were the stalled worker to wake and append its
next piece unchecked, that piece would be in the stream after the heir's read:
one piece written twice (and a reader's text with two versions of one token).

So the look and the append are one: a Lua script (``STEP``) that Redis runs
whole, no other client's command between its lines, reads the hash and, only
if the job runs and the hash names this worker, appends the piece, counts the
tokens and claims the job's entry again (a heartbeat). A worker that finds
another named reads so in the same reply and gives the answer up, having
written nothing and claimed nothing back. Its end (the end event, the hash
made ``done``, the acknowledgement) is a transaction on the watched hash,
written only while the hash still names it.

A Redis restarted forgets its scripts: a ``NOSCRIPT`` reply loads it again, once.
A Redis that runs no scripts (fakeredis without Lua, in the tests) gets the
same commands in one pipeline, unguarded, as before there was a guard.
"""

from __future__ import annotations

from typing import Any

from streamlab.server.resources.shared_log import GROUP, JOBS, KEEP_SECONDS, events_key, is_named, meta_key

STATE = ("status", "worker", "cancel", "cancel_ms", "readers", "orphaned_ms", "grace_ms")  # what a step reads back
TRIES = 10  # transactions undone by a write to the hash meanwhile (a reader counted), before the end gives up
# KEYS: the generation's stream, its hash, the job queue. ARGV: the worker, the tokens so far, the job's entry to
# claim again ('' for none), the group, then the piece entry's fields and values (none: a silence). Returns the
# appended entry's id (nil: nothing appended) and the hash's STATE fields, as they were before the append.
STEP = """
local state = redis.call('HMGET', KEYS[2], 'status', 'worker', 'cancel', 'cancel_ms', 'readers', 'orphaned_ms',
                         'grace_ms')
local id = false
if state[1] == 'running' and state[2] == ARGV[1] then
  if #ARGV > 4 then id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 5)) end
  redis.call('HSET', KEYS[2], 'tokens', ARGV[2])
  if ARGV[3] ~= '' then redis.call('XCLAIM', KEYS[3], ARGV[4], ARGV[1], 0, ARGV[3], 'JUSTID') end
end
return {id, state[1], state[2], state[3], state[4], state[5], state[6], state[7]}
"""


class GuardedLog:
    """One worker's writes into the shared log: each step and each end, only while the job is its own."""

    def __init__(self, redis: Any, worker: str) -> None:
        self.redis = redis
        self.worker = worker
        self.sha: str | None = None  # the step's script, once loaded ("": Redis runs no scripts here)

    async def load(self) -> str:
        """Load ``STEP`` into Redis: its sha1, or "" where Redis runs no scripts."""
        try:
            self.sha = await self.redis.script_load(STEP)
        except Exception as err:  # noqa: BLE001 - ResponseError: unknown command 'script'
            if not (is_named(err, "ResponseError") and "unknown command" in str(err).lower()):
                raise
            self.sha = ""
        return self.sha

    async def step(self, entry_id: str, generation_id: str, entry: dict[str, Any] | None, tokens: int,
                   heartbeat: bool) -> tuple[str | None, list, tuple[Any, Any]]:
        """One round trip: ``entry`` appended (None: a silence), the tokens counted, the hash read, Redis's time.

        Returns the appended entry's id (None: nothing appended), the hash's
        ``STATE`` fields, and Redis's ``TIME`` reply.
        """
        if self.sha is None:
            await self.load()
        events, meta = events_key(generation_id), meta_key(generation_id)
        for attempt in (1, 2):
            pipe = self.redis.pipeline(transaction=False)
            if self.sha:
                fields = [str(v) for pair in (entry or {}).items() for v in pair]
                pipe.evalsha(self.sha, 3, events, meta, JOBS, self.worker, tokens, entry_id if heartbeat else "",
                             GROUP, *fields)
            else:
                if entry is not None:
                    pipe.xadd(events, entry)
                pipe.hset(meta, "tokens", tokens)
                pipe.hmget(meta, list(STATE))
                if heartbeat:
                    pipe.xclaim(JOBS, GROUP, self.worker, 0, [entry_id], justid=True)
            pipe.time()
            try:
                replies = await pipe.execute()
            except Exception as err:  # noqa: BLE001 - NoScriptError: a Redis restarted forgets its scripts
                if attempt == 2 or not (is_named(err, "NoScriptError") or "NOSCRIPT" in str(err)):
                    raise
                await self.load()
                continue
            break
        if self.sha:
            return replies[0][0], list(replies[0][1:]), replies[-1]
        at = 1 if entry is not None else 0  # [xadd,] hset, hmget, [xclaim,] time
        return (replies[0] if entry is not None else None), list(replies[at + 1]), replies[-1]

    async def finish(self, entry_id: str, generation_id: str, end: dict[str, Any], stop_reason: str,
                     tokens: int) -> bool:
        """The end entry, the hash ``done``, both kept ``KEEP_SECONDS``, the job acknowledged: if still its own."""
        meta, events = meta_key(generation_id), events_key(generation_id)
        for _ in range(TRIES):
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(meta)
                    status, owner = await pipe.hmget(meta, ["status", "worker"])
                    if status == "done" or owner != self.worker:
                        return False
                    pipe.multi()
                    pipe.xadd(events, end)
                    pipe.hset(meta, mapping={"status": "done", "stop_reason": stop_reason, "tokens": tokens,
                                             "ended_by": self.worker})
                    pipe.expire(meta, KEEP_SECONDS)
                    pipe.expire(events, KEEP_SECONDS)
                    pipe.xack(JOBS, GROUP, entry_id)
                    await pipe.execute()
                    return True
                except Exception as err:  # noqa: BLE001 - WatchError: the hash changed meanwhile (a reader): again
                    if not is_named(err, "WatchError"):
                        raise
        return False
