"""``python -m streamlab worker --redis URL``: a process that takes ``/generations`` jobs from Redis and generates.

Replicas started with ``serve --events URL`` only write jobs and read
events (``shared_log.py``); the model lives in the workers, each loading it
once. A worker reads the job stream as one consumer of the ``workers`` group
(``XREADGROUP``): Redis hands each job to one worker and keeps it *pending*,
under that worker's name, until the worker acknowledges it (``XACK``) with
the end event written. While it generates, the worker claims its own entry
again every ``HEARTBEAT`` seconds, which resets the entry's idle time.

A worker is a batched engine, as ``serve`` is: it holds up to
``--max-active`` jobs at once (it asks the group for as many as it has free
slots), runs each as an ``Answer`` on one line of its own, and the model
decodes them together, one forward pass a step for all
(``streamlab/model/batching.py``). A slot freed is filled at the next look,
without waiting for the others. Several workers add up: each takes what it
has room for.

A worker killed with ``kill -9`` acknowledges nothing: its entries stay
pending and stop being refreshed. Every worker, before waiting for new jobs,
takes over entries idle for ``--claim-idle`` seconds (``XAUTOCLAIM``). One
taken over mid-answer is *continued*: every piece entry carries its token
ids, and the heir generates the rest after the prompt and those tokens, into
the same stream (``continued.py``), so the readers get one answer with no
token twice, its end naming who continued it. A job no worker had started
is simply run; one whose end was written (only the acknowledgement lost) is
acknowledged and left.

A job's conversation is in the shared store (``store/shared.py``): the
replica that took the POST committed the user's message, and the worker reads
the conversation up to it (the model reads the whole exchange), opens the
answer's row and writes it as it streams, so a next turn on any replica reads
it; the heir of a dead worker continues that same row.

With every piece it appends, the worker reads the generation's hash in the
same round trip (one guarded script where Redis runs scripts, ``guarded.py``: only
the job's owner appends, so a worker that stalled past ``--claim-idle`` and
wakes after its job was taken over writes nothing; its end, too, is written
only while it owns the job): a cancel (``POST /generations/{id}/cancel`` on any replica)
or the last reader gone for ``--grace`` stops the model before its next
token. The token count at the moment of the signal (the signal's time by
Redis's clock, against each token's time, Redis's clock read with every
round trip) goes into the end event, so what ran on after it is counted as
chapter 5 counts it.

Redis gone (killed, restarting, out of reach) does not end a worker: it says
so in one line and asks again, every 0.1 s at first, doubling to every 2 s.
An answer that cannot append stops within a token (its model must not run on
for nobody); its entry stays pending under the worker's name, and once Redis
is back (with its data) this worker or another takes it over after
``--claim-idle`` and continues it.
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
import traceback
from pathlib import Path
from typing import Any, Sequence

from streamlab.net.errors import ArgumentParser, UserError
from streamlab.net.serving import on_stdin_eof
from streamlab.net.settings import Setting, Settings
from streamlab.protocol.endings import ERROR, GRACE_EXPIRED, INTERRUPTED, SERVER_SHUTDOWN, STOPPED
from streamlab.protocol.http_fields import HTTPError
from streamlab.server.config import MAX_ACTIVE, ServerConfig
from streamlab.server.answers.answer import Answer, Undeliverable
from streamlab.server.wire.formats import answer_ending, ending_data, error_body, stopped_in_line
from streamlab.server.answers.jobs import Jobs, Turn
from streamlab.server.store.conversations import Conversations, StoreUnavailable
from streamlab.server.store.database import Store
from streamlab.server.store.shared import SharedStore
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.resources.continued import Kept, WorkerSource, continued_answer, piece_entry
from streamlab.server.resources.guarded import GuardedLog
from streamlab.server.resources.shared_log import (
    ENDINGS, GROUP, JOBS, decode_entry, encode_entry, ensure_group, entry_ms, events_key, meta_key, open_client,
)
from streamlab.server.store.shared import is_redis_error

HEARTBEAT = 0.5  # s between a busy worker's claims of its own job (each resets the entry's idle time)
LOOK_INTERVAL = 0.1  # s: in a silence (reading a long prompt) the worker still looks for a cancel this often
NEW_JOB_BLOCK_MS = 500  # how long one XREADGROUP waits for a new job before looking for abandoned ones again
RETRY_FIRST, RETRY_MOST = 0.1, 2.0  # s: the wait after Redis failed, doubling up to the most
TAKE_TRIES = 10  # looks at a job's hash, each undone by a write to it meanwhile, before leaving the job for later

WORKER = Settings(
    "The worker",
    Setting("redis", None, "", "take jobs from, and write events to, this Redis (the URL the replicas' --events"
            " name)", metavar="URL", type=str, required=True),
    Setting("model", None, "", "Hugging Face id or folder to load", metavar="MODEL",
            show="$STREAMLAB_MODEL, else the embedded model"),
    Setting("precision", None, "", "the decode format the model runs in (as serve's --precision)", metavar="FORMAT",
            show="$STREAMLAB_DTYPE, else serve's default"),
    Setting("name", None, "", "this worker's consumer name in the group", type=str, metavar="NAME",
            show="host-pid"),
    Setting("max_active", MAX_ACTIVE, "generations", "take up to N jobs at once, their tokens decoded together in"
            " one batch (as serve's --max-active)"),
    Setting("claim_idle", 5.0, "s", "take over a job whose worker has not claimed it for S seconds (one killed)"),
    Setting("token_delay", 0.0, "s", "add S seconds per token (a slower model)"),
    Setting("exit_on_stdin_eof", False, "", "exit when stdin closes (the parent died)", switch=True),
)
SETTINGS = (WORKER,)


def fail_fast(redis: Any) -> None:
    """One immediate retry per command, where redis-py 8 retries ten times with backoff (seconds of waiting).

    The retry lets a pooled connection found dead (Redis restarted) connect
    again at once; a Redis that is gone fails the command within a connect,
    so an answer that cannot append stops now rather than after seconds, and
    the worker's own loop does the waiting (``RETRY_FIRST`` to ``RETRY_MOST``).
    """
    try:
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        redis.set_retry(Retry(NoBackoff(), 1))
    except Exception:  # noqa: BLE001 - a client without redis-py's retries (a stand-in) keeps its own
        pass


class Worker:
    """One consumer of the job stream: up to ``max_active`` jobs at once, each generated into its stream, then acked."""

    def __init__(self, lm: Any, redis: Any, *, name: str | None = None, claim_idle: float = 5.0,
                 max_active: int = MAX_ACTIVE, config: ServerConfig | None = None,
                 store: Conversations | None = None) -> None:
        self.source = WorkerSource(lm)
        self.redis = redis
        self.store = store  # the replicas' conversations (store/shared.py); None: a throwaway (it only appends)
        fail_fast(redis)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.log = GuardedLog(redis, self.name)  # what it appends and ends, only while the job is its own
        self.claim_idle_ms = int(claim_idle * 1000)
        self.max_active = max(1, int(max_active))
        self.config = config or ServerConfig(engine="batched")
        self.done: list[str] = []  # the generations this worker ended (generated, continued, or found abandoned)
        self.continued: list[str] = []  # those of them it continued after another worker (or itself) stopped
        self.tasks: dict[str, asyncio.Task] = {}  # entry id -> the task doing that job, while it runs
        self.answers: dict[str, Answer] = {}  # entry id -> its answer, while it generates
        self.most_at_once = 0  # the most jobs it held at once
        self._line: Jobs | None = None
        self._cursor = "0-0"  # where the next XAUTOCLAIM looks on from

    # -- the loop ------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        """Take jobs until ``stopping`` is set (those being generated are finished first); Redis lost never ends it.

        Cancelled (``InProcessWorker.crash``: what ``kill -9`` does), it stops
        at once, its generations too, acknowledging and ending nothing.
        """
        try:
            await self._serve(stopping)
            if self.tasks:
                await asyncio.wait(list(self.tasks.values()))
        except asyncio.CancelledError:
            await self._abandon()
            raise

    async def _serve(self, stopping: asyncio.Event) -> None:
        wait, lost, ready = RETRY_FIRST, False, False
        while not stopping.is_set():
            try:
                if not ready:  # first, and after Redis came back (emptied, maybe: the group made again)
                    await ensure_group(self.redis)
                    ready = True
                    if lost:
                        self.say("Redis answers again")
                        wait, lost = RETRY_FIRST, False
                await self._take_jobs()
            except Exception as err:  # noqa: BLE001 - redis-py's ConnectionError, TimeoutError, ResponseError
                if not is_redis_error(err):
                    raise
                if not lost:
                    self.say(f"Redis failed ({type(err).__name__}: {err}); asking again every {RETRY_FIRST:g} s,"
                             f" doubling to {RETRY_MOST:g} s")
                lost, ready = True, False
                try:
                    await asyncio.wait_for(stopping.wait(), wait)
                except asyncio.TimeoutError:
                    pass
                wait = min(2 * wait, RETRY_MOST)

    def say(self, line: str) -> None:
        print(f"streamlab: worker {self.name}: {line}", file=sys.stderr, flush=True)

    async def _take_jobs(self) -> None:
        """One look: with a slot free, take as many jobs as there are free slots; else wait for one to end."""
        free = self.max_active - len(self.tasks)
        if free <= 0:
            await asyncio.wait(list(self.tasks.values()), timeout=NEW_JOB_BLOCK_MS / 1000,
                               return_when=asyncio.FIRST_COMPLETED)
            return
        for entry_id, generation_id in await self.next_jobs(free):
            self.tasks[entry_id] = asyncio.ensure_future(self._job(entry_id, generation_id))
        self.most_at_once = max(self.most_at_once, len(self.tasks))

    async def next_jobs(self, count: int = 1) -> list[tuple[str, str]]:
        """Up to ``count`` jobs, ``(entry id, generation id)``: abandoned ones first, else new ones, else none.

        ``XAUTOCLAIM`` looks on from where its last look stopped (a long list
        of pending entries is read a part at a time). An entry of a job this
        worker is doing (whose claim came late) is its own: not taken again.
        """
        claimed = await self.redis.xautoclaim(JOBS, GROUP, self.name, self.claim_idle_ms, self._cursor, count=count)
        self._cursor = claimed[0] or "0-0"
        jobs = [(entry_id, fields["generation"]) for entry_id, fields in claimed[1]
                if fields and entry_id not in self.tasks]
        if jobs:
            return jobs
        found = await self.redis.xreadgroup(GROUP, self.name, {JOBS: ">"}, count=count, block=NEW_JOB_BLOCK_MS)
        return [(entry_id, fields["generation"]) for entry_id, fields in (found[0][1] if found else [])]

    async def _job(self, entry_id: str, generation_id: str) -> None:
        try:
            await self.do(entry_id, generation_id)
        except Exception as err:  # noqa: BLE001 - one job's failure must not end the others
            lost = is_redis_error(err) or isinstance(err, StoreUnavailable)  # its conversations are in Redis too
            if not lost:  # a bug: said, and the job ended with an error (not taken over for ever)
                traceback.print_exc()
                try:
                    await self.finish(entry_id, generation_id, "error", {
                        **error_body(500, f"the worker failed: {type(err).__name__}: {err}"), **self._ending(ERROR, 0)})
                except Exception:  # noqa: BLE001 - nothing more can be done for it
                    pass
            # Redis lost: the job stays pending under this worker's name, to be taken over once Redis is back.
        finally:
            self.tasks.pop(entry_id, None)
            self.answers.pop(entry_id, None)

    async def _abandon(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        for answer in list(self.answers.values()):  # no ending is written: the tasks are cancelled first
            if answer.job is not None:
                answer.job.generation.stop(SERVER_SHUTDOWN)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)

    # -- one job -------------------------------------------------------------------

    async def do(self, entry_id: str, generation_id: str) -> None:
        meta = await self.redis.hgetall(meta_key(generation_id))
        if not meta or meta["status"] == "done":
            await self.redis.xack(JOBS, GROUP, entry_id)
            return
        if meta["status"] == "running":  # its worker died mid-answer (or lost Redis)
            await self.take_over(entry_id, generation_id, meta)
            return
        if not await self._take(generation_id):
            return  # another worker took it, or a replica ended it, meanwhile
        if meta.get("cancel"):
            await self.finish(entry_id, generation_id, "end", stopped_in_line(meta.get("conversation_id"),
                                                                              worker=self.name))
            return
        await self.generate(entry_id, generation_id, meta)

    async def _take(self, generation_id: str, status: str = "queued", owner: str | None = None) -> bool:
        """``status`` -> running, under this worker's name, unless something changed it first (or another owns it).

        The hash is watched: a write to it meanwhile aborts the change, and
        the worker looks again. Most such writes change nothing that matters
        here (a reader arriving counts itself in the hash, as the worker
        takes the job its POST made); a status changed (a cancel ended it,
        another worker took it) is then seen, and the job left alone.
        """
        key = meta_key(generation_id)
        for _ in range(TAKE_TRIES):
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    now, worker = await pipe.hmget(key, ["status", "worker"])
                    if now != status or (owner is not None and worker != owner):
                        return False
                    pipe.multi()
                    pipe.hset(key, mapping={"status": "running", "worker": self.name})
                    await pipe.execute()
                    return True
                except Exception as err:  # noqa: BLE001 - redis-py's WatchError: look again
                    if type(err).__name__ != "WatchError":
                        raise
        return False

    async def take_over(self, entry_id: str, generation_id: str, meta: dict[str, str]) -> None:
        """A job taken over mid-answer: continued from the tokens in its stream (acknowledged, if it had ended).

        The hash names this worker first, then the stream is read: the worker
        it was taken from, if alive after all (stalled past ``--claim-idle``),
        sees that with its next piece and stops. That one piece, appended
        after the read, is the only one it could still add, and its tokens
        would be made again here: ``--claim-idle`` is set well above any stall.
        """
        dead = meta.get("worker")
        if not await self._take(generation_id, "running", dead):
            return  # another worker took it over first
        entries = [fields for _, fields in await self.redis.xrange(events_key(generation_id))]
        if any(decode_entry(fields)[0] in ENDINGS for fields in entries):  # it had ended; only the ack was lost
            await self.redis.hset(meta_key(generation_id), "status", "done")
            await self.redis.xack(JOBS, GROUP, entry_id)
            return
        kept = Kept.from_entries(entries)
        if kept is None:  # pieces without their token ids (an older worker's): what it kept, ended there
            tokens = max([decode_entry(fields)[2] for fields in entries] or [0])
            ending = self._ending(INTERRUPTED, tokens, interrupted_worker=dead)
            await self.finish(entry_id, generation_id, "end", ending)
            return
        if meta.get("cancel"):  # cancelled while nobody generated it
            await self.finish(entry_id, generation_id, "end", self._ending(
                STOPPED, kept.tokens, stop_signal=meta["cancel"], tokens_at_stop=kept.tokens,
                **continuing(self.name, dead, kept)))
            return
        await self.generate(entry_id, generation_id, meta, kept=kept, dead=dead)

    def line(self) -> Jobs:
        """Where this worker's answers run, up to ``max_active`` at once: the same line, jobs and record as a server's.

        Its engine is the config's (batched: one forward pass a step for all
        its answers; a model that cannot batch runs threads). Its store is
        the replicas' conversations in Redis; a worker given none (one that
        only appends: chapter 13's cost of the log) gets a throwaway of its
        own when the first job comes.
        """
        if self._line is None:
            store = self.store
            if store is None:
                folder = Path(tempfile.mkdtemp(prefix="streamlab-worker-"))
                atexit.register(shutil.rmtree, folder, True)
                store = self.store = Store(folder / "answers.db")
            # At most one piece ahead of the loop: a busy loop must not let the model run on past a cancel
            # it has not read yet (the loop's work per piece is one round trip, next to a token's forward pass).
            config = dataclasses.replace(self.config, max_active=self.max_active, max_queued=1,
                                         slow_reader_timeout=None)
            self._line = Jobs(self.source, config, store)
        return self._line

    async def generate(self, entry_id: str, generation_id: str, meta: dict[str, str], *, kept: Kept | None = None,
                       dead: str | None = None) -> None:
        """The job's answer, run as every answer is (``Answer``), its pieces and its end appended to Redis.

        Its turn is the one the replica committed (``user_message_id`` in the
        hash): the conversation up to that message is what the model reads.
        With ``kept``, it continues a taken-over answer after those tokens
        (``continued.continued_answer``), in the row the dead worker began
        (``message_id``), ``dead`` naming whose it was.
        """
        request = json.loads(meta["request"])
        conversation_id, through = meta.get("conversation_id"), meta.get("user_message_id")
        req = GenerationRequest(**{**request, "stop": tuple(request.get("stop") or ()),
                                   "conversation_id": conversation_id if through else None})
        line = self.line()
        try:
            if kept is not None:
                answer = continued_answer(line, req, kept, generation_id, through=through,
                                          answer_id=meta.get("message_id"))
            elif through:
                prompt_ids, messages = line.measure(req, through)
                turn = Turn(req.conversation_id, through, prompt_ids, messages)
                answer = Answer(line, "/generations", req, turn=turn, generation_id=generation_id)
            else:  # a job from a replica that committed no turn: the answer commits its own
                answer = Answer(line, "/generations", req, generation_id=generation_id)
        except HTTPError as err:  # it does not fit the model's context; its conversation is gone, or unreachable
            await self.finish(entry_id, generation_id, "error", {
                **error_body(err.status, err.message), **self._ending(ERROR, kept.tokens if kept else 0)})
            return
        self.answers[entry_id] = answer
        await answer.run(IntoTheLog(self, entry_id, generation_id, kept, dead), ping_interval=LOOK_INTERVAL)

    async def step(self, entry_id: str, generation_id: str, piece: Any, tokens: int,
                   heartbeat: bool = False, *, ids: Sequence[int] | None = None,
                   kept: int = 0) -> tuple[int | None, list, int]:
        """One round trip per piece: append it, count the tokens, read the hash (a cancel? readers?), Redis's time.

        Returns the appended entry's time (None without a piece, or when
        nothing was appended: the job is not this worker's any more), the
        hash's fields and now, both by Redis's clock. With ``heartbeat``, the
        job's entry is claimed again too, which tells the other workers it is
        alive. ``ids``: the piece's token ids, kept in its entry (what a worker
        that takes the answer over continues from); ``kept``: tokens a
        continued answer had before this generation, counted in the entry's
        ``n``. Guarded where Redis runs scripts (``guarded.GuardedLog``).
        """
        entry = piece_entry(piece.text, kept + piece.tokens, ids) if piece is not None else None
        appended, state, (seconds, micros) = await self.log.step(entry_id, generation_id, entry, tokens, heartbeat)
        return (entry_ms(appended) if appended else None), state, int(seconds) * 1000 + int(micros) // 1000

    def _ending(self, stored: str, tokens: int, **extra: Any) -> dict:
        """The end event's data, in the in-memory registry's words (where it is stored, when given), and its worker."""
        return ending_data(stored, tokens, worker=self.name, **extra)

    async def finish(self, entry_id: str, generation_id: str, name: str, data: dict) -> bool:
        """The end event, the hash's final state and the acknowledgement, at once, while the job is this worker's.

        A worker that stalled and wakes after its job was taken over (or
        ended) writes nothing (``guarded.GuardedLog.finish``). Whether it wrote.
        """
        written = await self.log.finish(entry_id, generation_id, encode_entry(name, data, data.get("tokens", 0)),
                                        data["stop_reason"], data["tokens"])
        if written:
            self.done.append(generation_id)
        return written


def continuing(worker: str, dead: str | None, kept: Kept) -> dict[str, Any]:
    """What a continued answer's end says of it: who continued it, from whom, after how many tokens."""
    return {"continued_by": worker, "continued_from": dead, "kept_tokens": kept.tokens}


class IntoTheLog:
    """A worker's answer as the generation's Redis stream: a ``message`` entry per piece, then its end.

    One round trip per piece (and one per silence of ``LOOK_INTERVAL``):
    append, read the hash. A cancel or the grace period found there stops
    the answer, with the moment of the signal by Redis's clock; a job taken
    over by another worker is given up without an end (that worker writes
    it), and so is one whose Redis cannot be reached: its generation stops at
    once, its job pending until Redis is back and someone takes it over.
    ``kept``: a continued answer's tokens before this generation, counted in.
    """

    def __init__(self, worker: Worker, entry_id: str, generation_id: str, kept: Kept | None = None,
                 dead: str | None = None) -> None:
        self.worker = worker
        self.entry_id = entry_id
        self.generation_id = generation_id
        self.kept = kept.tokens if kept is not None else 0
        self.continuing = continuing(worker.name, dead, kept) if kept is not None else {}
        self.sent = 0  # this generation's tokens whose ids are in the stream
        self.clock = 0.0  # Redis's clock minus ours, in ms (off by one round trip)
        self.stop_signal: str | None = None
        self.signal_ms = 0
        self.lost = False
        self.beat = time.monotonic()

    async def place(self, answer: Answer, ahead: int | None) -> None:
        return None  # never in line: the worker takes no more jobs than its line has slots

    async def opening(self, answer: Answer) -> bool:
        """Where the answer is stored, in the hash (``GET /generations/{id}`` names it; an heir continues that row)."""
        try:
            await self.worker.redis.hset(meta_key(self.generation_id), "message_id", answer.job.answer.message_id)
        except Exception as err:  # noqa: BLE001 - redis-py's ConnectionError: as a step that cannot append
            if not is_redis_error(err):
                raise
            self._give_up(answer)
            return False
        return True

    async def piece(self, answer: Answer, piece: Any) -> None:
        await self._step(answer, piece)

    async def silence(self, answer: Answer) -> None:
        await self._step(answer, None)

    async def _step(self, answer: Answer, piece: Any) -> None:
        heartbeat = time.monotonic() - self.beat >= HEARTBEAT
        self.beat = time.monotonic() if heartbeat else self.beat
        generation = answer.job.generation
        ids = None
        if piece is not None:
            ids, self.sent = generation.token_ids[self.sent : piece.tokens], piece.tokens
        try:
            _, state, now = await self.worker.step(self.entry_id, self.generation_id, piece,
                                                   self.kept + generation.tokens, heartbeat, ids=ids, kept=self.kept)
        except Exception as err:  # noqa: BLE001 - redis-py's ConnectionError, TimeoutError...
            if not is_redis_error(err):
                raise
            self._give_up(answer)  # nothing can be appended: the model stops within a token
            raise Undeliverable from err
        self.clock = now - time.perf_counter() * 1000
        status, owner, cancel, cancel_ms, readers, orphaned, grace = state
        if status == "done" or owner != self.worker.name:  # taken over: another worker writes the rest
            self._give_up(answer)
            raise Undeliverable
        if self.stop_signal is None and cancel:
            self.stop_signal, self.signal_ms = cancel, int(cancel_ms)
        elif self.stop_signal is None and int(readers) <= 0 and now >= int(orphaned) + int(grace):
            self.stop_signal, self.signal_ms = GRACE_EXPIRED, int(orphaned) + int(grace)
        if self.stop_signal is not None and not generation.stopping:
            answer.stop(self.stop_signal)

    def _give_up(self, answer: Answer) -> None:
        """Stop generating and write nothing more: the job is someone else's now, or Redis's when it returns."""
        self.lost = True
        answer.stop(SERVER_SHUTDOWN)  # nobody asked: stored (in the worker's throwaway store) as interrupted

    async def ending(self, answer: Answer) -> None:
        if self.lost:
            return
        name, ending = answer_ending(answer)
        result = answer.job.generation.result
        ending = {**ending, **self.worker._ending(ending["stop_reason"], self.kept + result.tokens,
                                                  **answer.job.ids(), **self.continuing)}
        if self.stop_signal is not None:  # the tokens made by the signal's moment, each token's time on Redis's clock
            ending["tokens_at_stop"] = self.kept + sum(
                1 for t in result.token_times if t * 1000 + self.clock <= self.signal_ms)
            ending["stop_signal"] = self.stop_signal
        await self.worker.finish(self.entry_id, self.generation_id, name, ending)
        if self.continuing:
            self.worker.continued.append(self.generation_id)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m streamlab worker",
                       description="Take /generations jobs from Redis (what serve --events URL queues) and generate"
                                   " them with the model, up to --max-active at once in one batch.")
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
               exit_on_stdin_eof: bool, max_active: int = MAX_ACTIVE) -> int:
    redis = open_client(url)
    store = SharedStore.open(url, flush_interval=config.flush_interval)  # the replicas' conversations
    try:
        worker = Worker(lm, redis, name=name, claim_idle=claim_idle, config=config, max_active=max_active,
                        store=store)
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
        store.close()
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
    if args.max_active < 1:
        raise UserError(f"{WORKER.flag('max_active')} must be at least 1")
    asyncio.run(reachable(args.redis))
    from streamlab.server.answers.sources import load_and_say

    lm = load_and_say(args.model, f"batched, up to {args.max_active} at once", args.precision)
    config = ServerConfig(engine="batched", token_delay=args.token_delay)
    return asyncio.run(work(lm, args.redis, name=args.name, claim_idle=args.claim_idle, config=config,
                            exit_on_stdin_eof=args.exit_on_stdin_eof, max_active=args.max_active))


if __name__ == "__main__":
    sys.exit(main())
