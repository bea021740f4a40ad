"""``python -m streamlab worker --redis URL``: a process that takes ``/generations`` jobs from Redis and generates.

Replicas started with ``serve --events URL`` only write jobs and read
events (``shared_log.py``); the model lives in the workers, each loading it
once. A worker reads the job stream as one consumer of the ``workers`` group
(``XREADGROUP``): Redis hands each job to one worker and keeps it *pending*,
under that worker's name, until the worker acknowledges it (``XACK``) with
the end event written. While it generates, the worker claims its own entry
again every ``HEARTBEAT`` seconds, which resets the entry's idle time.

A worker killed with ``kill -9`` acknowledges nothing: its entry stays
pending and stops being refreshed. Every worker, before waiting for new jobs,
takes over entries idle for ``--claim-idle`` seconds (``XAUTOCLAIM``). One
taken over mid-answer is *not* generated again: its readers have the first
part already, and a second run (another sampling of the same prompt) would
not continue it. The worker ends it as ``interrupted``, its partial text kept
in the stream, where every reader finds it; a job no worker had started yet
is simply run. Nothing accepted is lost either way.

With every piece it appends, the worker reads the generation's hash in the
same round trip: a cancel (``POST /generations/{id}/cancel`` on any replica)
or the last reader gone for ``--grace`` stops the model before its next
token. The token count at the moment of the signal (the signal's time by
Redis's clock, against each token's time, Redis's clock read with every
round trip) goes into the end event, so what ran on after it is counted as
chapter 5 counts it.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streamlab.net.errors import ArgumentParser, UserError
from streamlab.net.serving import on_stdin_eof
from streamlab.net.settings import Setting, Settings
from streamlab.protocol.endings import GRACE_EXPIRED, INTERRUPTED
from streamlab.protocol.http_fields import HTTPError
from streamlab.server.config import ServerConfig
from streamlab.server.answers.answer import Answer
from streamlab.server.wire.formats import answer_ending, ending_data, error_body, stopped_in_line, text_data
from streamlab.server.answers.jobs import Jobs
from streamlab.server.store.database import Store
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.resources.shared_log import (
    ENDINGS, GROUP, JOBS, KEEP_SECONDS, decode_entry, encode_entry, ensure_group, entry_ms, events_key, meta_key,
    open_client,
)
from streamlab.server.answers.sources import ModelSource

HEARTBEAT = 0.5  # s between a busy worker's claims of its own job (each resets the entry's idle time)
LOOK_INTERVAL = 0.1  # s: in a silence (reading a long prompt) the worker still looks for a cancel this often
NEW_JOB_BLOCK_MS = 500  # how long one XREADGROUP waits for a new job before looking for abandoned ones again

WORKER = Settings(
    "The worker",
    Setting("redis", None, "", "take jobs from, and write events to, this Redis (the URL the replicas' --events"
            " name)", metavar="URL", type=str, required=True),
    Setting("model", None, "", "Hugging Face id or folder to load", metavar="MODEL",
            show="$STREAMLAB_MODEL, else the embedded model"),
    Setting("name", None, "", "this worker's consumer name in the group", type=str, metavar="NAME",
            show="host-pid"),
    Setting("claim_idle", 5.0, "s", "take over a job whose worker has not claimed it for S seconds (one killed)"),
    Setting("token_delay", 0.0, "s", "add S seconds per token (a slower model)"),
    Setting("exit_on_stdin_eof", False, "", "exit when stdin closes (the parent died)", switch=True),
)
SETTINGS = (WORKER,)


class Worker:
    """One consumer of the job stream: takes a job, generates it into the generation's stream, acknowledges it."""

    def __init__(self, lm: Any, redis: Any, *, name: str | None = None, claim_idle: float = 5.0,
                 config: ServerConfig | None = None) -> None:
        self.source = ModelSource(lm)
        self.redis = redis
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.claim_idle_ms = int(claim_idle * 1000)
        self.config = config or ServerConfig(engine="threads")
        self.done: list[str] = []  # the generations this worker ended (generated, or found abandoned)
        self._line: Jobs | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        """Take jobs until ``stopping`` is set (a job being generated is finished first)."""
        await ensure_group(self.redis)
        while not stopping.is_set():
            job = await self.next_job()
            if job is not None:
                await self.do(*job)

    async def next_job(self) -> tuple[str, str, bool] | None:
        """``(entry id, generation id, taken over)``: an abandoned job first, else a new one, else None."""
        claimed = await self.redis.xautoclaim(JOBS, GROUP, self.name, self.claim_idle_ms, "0-0", count=1)
        if claimed[1]:
            entry_id, fields = claimed[1][0]
            return entry_id, fields["generation"], True
        found = await self.redis.xreadgroup(GROUP, self.name, {JOBS: ">"}, count=1, block=NEW_JOB_BLOCK_MS)
        if not found or not found[0][1]:
            return None
        entry_id, fields = found[0][1][0]
        return entry_id, fields["generation"], False

    async def do(self, entry_id: str, generation_id: str, taken_over: bool) -> None:
        meta = await self.redis.hgetall(meta_key(generation_id))
        if not meta or meta["status"] == "done":
            await self.redis.xack(JOBS, GROUP, entry_id)
            return
        if meta["status"] == "running":  # its worker died mid-answer
            await self.interrupt(entry_id, generation_id, meta)
            return
        if not await self._take(generation_id):
            return  # another worker took it, or a replica ended it, meanwhile
        if meta.get("cancel"):
            await self.finish(entry_id, generation_id, "end", stopped_in_line(worker=self.name))
            return
        await self.generate(entry_id, generation_id, json.loads(meta["request"]))

    async def _take(self, generation_id: str) -> bool:
        """queued -> running, under this worker's name, unless something else changed it first."""
        key = meta_key(generation_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                if await pipe.hget(key, "status") != "queued":
                    return False
                pipe.multi()
                pipe.hset(key, mapping={"status": "running", "worker": self.name})
                await pipe.execute()
                return True
            except Exception as err:  # noqa: BLE001 - redis-py's WatchError
                if type(err).__name__ == "WatchError":
                    return False
                raise

    def line(self) -> Jobs:
        """Where this worker's answers run, one at a time: the same line, jobs and record as a server's.

        Its store is a throwaway of its own (the replicas' readers read the
        events in Redis, and the shared log keeps no conversations), made
        when the first job comes, so a worker that only appends (chapter 13's
        cost of the log) makes none.
        """
        if self._line is None:
            folder = Path(tempfile.mkdtemp(prefix="streamlab-worker-"))
            atexit.register(shutil.rmtree, folder, True)
            # At most one piece ahead of the loop: a busy loop must not let the model run on past a cancel
            # it has not read yet (the loop's work per piece is one round trip, next to a token's forward pass).
            config = dataclasses.replace(self.config, max_active=1, max_queued=1, slow_reader_timeout=None)
            self._line = Jobs(self.source, config, Store(folder / "answers.db"))
        return self._line

    async def generate(self, entry_id: str, generation_id: str, request: dict) -> None:
        """The job's answer, run as every answer is (``Answer``), its pieces and its end appended to Redis."""
        req = GenerationRequest(**{**request, "stop": tuple(request.get("stop") or ())})
        try:
            answer = Answer(self.line(), "/generations", req, generation_id=generation_id)
        except HTTPError as err:  # it does not fit the model's context
            await self.finish(entry_id, generation_id, "error", {**error_body(err.status, err.message),
                                                                 **self._ending("error", 0)})
            return
        await answer.run(IntoTheLog(self, entry_id, generation_id), ping_interval=LOOK_INTERVAL)

    async def step(self, entry_id: str, generation_id: str, piece: Any, tokens: int,
                   heartbeat: bool = False) -> tuple[int | None, list, int]:
        """One round trip per piece: append it, count the tokens, read the hash (a cancel? readers?), Redis's time.

        Returns the appended entry's time (None without a piece), the hash's
        fields and now, both by Redis's clock. With ``heartbeat``, the job's
        entry is claimed again too, which tells the other workers it is alive.
        """
        meta = meta_key(generation_id)
        pipe = self.redis.pipeline(transaction=False)
        if piece is not None:
            pipe.xadd(events_key(generation_id), encode_entry("message", text_data(piece.text), piece.tokens))
        pipe.hset(meta, "tokens", tokens)
        pipe.hmget(meta, ["status", "worker", "cancel", "cancel_ms", "readers", "orphaned_ms", "grace_ms"])
        pipe.time()
        if heartbeat:
            pipe.xclaim(JOBS, GROUP, self.name, 0, [entry_id], justid=True)
        replies = await pipe.execute()
        at = 1 if piece is not None else 0
        seconds, micros = replies[at + 2]
        return (entry_ms(replies[0]) if piece is not None else None), replies[at + 1], \
            int(seconds) * 1000 + int(micros) // 1000

    def _ending(self, stored: str, tokens: int, **extra: Any) -> dict:
        """The end event's data, in the in-memory registry's words (no store: no conversation), and its worker."""
        return ending_data(stored, tokens, worker=self.name, **extra)

    async def interrupt(self, entry_id: str, generation_id: str, meta: dict[str, str]) -> None:
        """A job taken over mid-answer: end it ``interrupted``, keeping the partial text its worker appended."""
        entries = await self.redis.xrange(events_key(generation_id))
        decoded = [decode_entry(fields) for _, fields in entries]
        if any(name in ENDINGS for name, _, _ in decoded):  # it had ended; only the acknowledgement was lost
            await self.redis.hset(meta_key(generation_id), "status", "done")
            await self.redis.xack(JOBS, GROUP, entry_id)
            return
        tokens = max([n for name, _, n in decoded if name == "message"] or [0])
        await self.finish(entry_id, generation_id, "end",
                          self._ending(INTERRUPTED, tokens, interrupted_worker=meta.get("worker")))

    async def finish(self, entry_id: str, generation_id: str, name: str, data: dict) -> None:
        """The end event, the hash's final state and the acknowledgement, in one transaction."""
        meta, events = meta_key(generation_id), events_key(generation_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(events, encode_entry(name, data, data.get("tokens", 0)))
        pipe.hset(meta, mapping={"status": "done", "stop_reason": data["stop_reason"], "tokens": data["tokens"],
                                 "ended_by": self.name})
        pipe.expire(meta, KEEP_SECONDS)
        pipe.expire(events, KEEP_SECONDS)
        pipe.xack(JOBS, GROUP, entry_id)
        await pipe.execute()
        self.done.append(generation_id)


class IntoTheLog:
    """A worker's answer as the generation's Redis stream: a ``message`` entry per piece, then its end.

    One round trip per piece (and one per silence of ``LOOK_INTERVAL``):
    append, read the hash. A cancel or the grace period found there stops
    the answer, with the moment of the signal by Redis's clock; a job taken
    over by another worker is given up without an end (that worker wrote it).
    """

    def __init__(self, worker: Worker, entry_id: str, generation_id: str) -> None:
        self.worker = worker
        self.entry_id = entry_id
        self.generation_id = generation_id
        self.clock = 0.0  # Redis's clock minus ours, in ms (off by one round trip)
        self.stop_signal: str | None = None
        self.signal_ms = 0
        self.lost = False
        self.beat = time.monotonic()

    async def place(self, answer: Answer, ahead: int | None) -> None:
        return None  # one job at a time: never in line

    async def opening(self, answer: Answer) -> bool:
        return True

    async def piece(self, answer: Answer, piece: Any) -> None:
        await self._step(answer, piece)

    async def silence(self, answer: Answer) -> None:
        await self._step(answer, None)

    async def _step(self, answer: Answer, piece: Any) -> None:
        heartbeat = time.monotonic() - self.beat >= HEARTBEAT
        self.beat = time.monotonic() if heartbeat else self.beat
        generation = answer.job.generation
        _, state, now = await self.worker.step(self.entry_id, self.generation_id, piece, generation.tokens, heartbeat)
        self.clock = now - time.perf_counter() * 1000
        status, owner, cancel, cancel_ms, readers, orphaned, grace = state
        if status == "done" or owner != self.worker.name:  # taken over: another worker ended it
            self.lost = True
            answer.stop(INTERRUPTED)
        elif self.stop_signal is None and cancel:
            self.stop_signal, self.signal_ms = cancel, int(cancel_ms)
        elif self.stop_signal is None and int(readers) <= 0 and now >= int(orphaned) + int(grace):
            self.stop_signal, self.signal_ms = GRACE_EXPIRED, int(orphaned) + int(grace)
        if self.stop_signal is not None and not generation.stopping:
            answer.stop(self.stop_signal)

    async def ending(self, answer: Answer) -> None:
        if self.lost:
            return
        name, ending = answer_ending(answer)
        result = answer.job.generation.result
        # The replica's store knows nothing of this answer: no conversation, no message to name.
        ending = {**ending, **self.worker._ending(ending["stop_reason"], result.tokens)}
        if self.stop_signal is not None:  # the tokens made by the signal's moment, each token's time on Redis's clock
            ending["tokens_at_stop"] = sum(1 for t in result.token_times if t * 1000 + self.clock <= self.signal_ms)
            ending["stop_signal"] = self.stop_signal
        await self.worker.finish(self.entry_id, self.generation_id, name, ending)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m streamlab worker",
                       description="Take /generations jobs from Redis (what serve --events URL queues) and generate"
                                   " them with the model, one at a time.")
    WORKER.add_to(p)
    return p


async def reachable(url: str) -> None:
    """Ask Redis for a PONG: a wrong --redis is one line, before seconds are spent loading the model."""
    redis = open_client(url)
    try:
        await redis.ping()
    except Exception as err:  # noqa: BLE001 - redis-py's ConnectionError, TimeoutError
        raise UserError(f"{WORKER.flag('redis')} {url}: no Redis answers there ({err})") from None
    finally:
        await redis.aclose()


async def work(lm: Any, url: str, *, name: str | None, claim_idle: float, config: ServerConfig,
               exit_on_stdin_eof: bool) -> int:
    redis = open_client(url)
    try:
        worker = Worker(lm, redis, name=name, claim_idle=claim_idle, config=config)
        loop, stopping = asyncio.get_running_loop(), asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        if exit_on_stdin_eof:
            on_stdin_eof(stopping.set, loop)
        await ensure_group(redis)
        print(f"streamlab: worker {worker.name} ready on {url}", flush=True)
        await worker.run(stopping)
        return 0
    finally:
        await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    redis = WORKER.flag("redis")
    if not args.redis:  # given, but empty
        raise UserError(f"worker needs {redis} URL: the Redis the replicas' serve --events names")
    if not args.redis.startswith(("redis://", "rediss://", "unix://")):
        raise UserError(f"{redis} {args.redis}: give a Redis URL, redis://HOST:PORT")
    if args.claim_idle <= 0 or args.token_delay < 0:
        raise UserError(f"{WORKER.flag('claim_idle')} must be positive and {WORKER.flag('token_delay')} cannot be"
                        " negative")
    asyncio.run(reachable(args.redis))
    from streamlab.server.answers.sources import load_and_say

    lm = load_and_say(args.model, "threads (one at a time)")
    config = ServerConfig(engine="threads", token_delay=args.token_delay)
    return asyncio.run(work(lm, args.redis, name=args.name, claim_idle=args.claim_idle, config=config,
                            exit_on_stdin_eof=args.exit_on_stdin_eof))


if __name__ == "__main__":
    sys.exit(main())
