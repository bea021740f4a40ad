"""Chapter 13's experiments: kill what serves a reader, and see what the reader keeps.

``cluster()`` starts everything at once (Redis, replicas with the shared
log, the same number without it, the workers, two nginx), and each
experiment below uses it and returns plain rows:

- ``replica_killed``: a reader on replica X, X killed with SIGKILL after
  ``kill_after`` text events; the reader (an ``EventSource``) reconnects
  through nginx and goes on, or not;
- ``websocket_turns``: a second turn of a WebSocket conversation on a new
  connection through nginx, and on the same replica (what a sticky session gives);
- ``worker_killed``: the worker generating an answer killed mid-answer;
- ``stop_elsewhere``: a cancel sent to another replica, and a reader who
  leaves, counted in tokens run on after the signal (as chapter 5 counts).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamlab.client import timed
from streamlab.client.event_source import EventSourceRun, event_source
from streamlab.client.timed_websocket import websocket
from streamlab.hops.nginx import NginxProcess
from streamlab.lab.outside.redis_server import RedisProcess, run_redis
from streamlab.lab.setups.replicas import run_balancer, start_replicas, start_workers
from streamlab.lab.setups.runner import RunningServer

PROMPT = "Write a short note to a friend about a walk by the sea."


@dataclass
class Cluster:
    redis: RedisProcess
    shared: list[RunningServer]  # replicas whose /generations live in Redis
    alone: list[RunningServer]  # replicas that each keep their own, in memory
    workers: list[RunningServer]
    balancer: NginxProcess  # in front of the shared replicas
    balancer_alone: NginxProcess  # in front of the others
    killed: list[tuple[str, float]] = field(default_factory=list)  # (url, perf_counter) of each process killed

    def replica(self, url: str) -> RunningServer:
        return next(r for r in [*self.shared, *self.alone] if r.url == url)

    def kill(self, process: RunningServer) -> None:
        """SIGKILL: no end event, no goodbye, no acknowledgement."""
        os.kill(process.process.pid, signal.SIGKILL)
        self.killed.append((process.url, time.perf_counter()))
        process.process.wait(10)

    def live_shared(self) -> list[RunningServer]:
        return [r for r in self.shared if r.process.poll() is None]


@contextmanager
def cluster(replicas: int = 3, alone: int = 2, workers: int = 2, *, grace: float = 1.0,
            claim_idle: float = 1.0, model: str | None = None) -> Iterator[Cluster]:
    """Redis, ``replicas`` model-less replicas sharing the log and ``alone`` without it, ``workers`` workers, two nginx.

    The replicas with the shared log keep their conversations in a SQLite file each, as replicas on
    machines apart would; the others share one file, as replicas on one machine can (chapter 7's store).
    """
    with ExitStack() as stack:
        redis = stack.enter_context(run_redis())
        folder = Path(tempfile.mkdtemp(prefix="streamlab-replicas-"))
        stack.callback(shutil.rmtree, folder, True)
        own = [str(folder / f"replica-{i + 1}.db") for i in range(replicas)]  # a store each, as on machines apart
        one = [str(folder / "one.db")] * alone  # one file for all, as replicas on one machine could share
        with ThreadPoolExecutor(max_workers=3) as pool:
            shared_f = pool.submit(start_replicas, replicas, events=redis.url, grace=grace, dbs=own)
            alone_f = pool.submit(start_replicas, alone, grace=grace, dbs=one)
            workers_f = pool.submit(start_workers, redis.url, workers, "--claim-idle", str(claim_idle),
                                    *(["--model", model] if model else []))
            started = []
            for future in (shared_f, alone_f, workers_f):
                try:
                    started.append(future.result())
                except Exception:  # noqa: BLE001 - stop what did start, then say why
                    for f in (shared_f, alone_f, workers_f):
                        if f.done() and f.exception() is None:
                            for running in f.result():
                                running.stop()
                    raise
        shared, alone, working = started
        stack.callback(_stop_all, [*shared, *alone, *working])
        balancer = stack.enter_context(run_balancer([r.port for r in shared]))
        balancer_alone = stack.enter_context(run_balancer([r.port for r in alone]))
        yield Cluster(redis, shared, alone, working, balancer, balancer_alone)


def _stop_all(processes: list[RunningServer]) -> None:
    """Stop them all at once: each takes up to a second to let its connections go."""
    with ThreadPoolExecutor(max_workers=max(1, len(processes))) as pool:
        list(pool.map(lambda running: running.stop(), processes))


async def _watch_and_kill(run: EventSourceRun, kill_after: int, kill: Any) -> str | None:
    """Wait until the reader has ``kill_after`` text events, then kill what serves it; who was killed."""
    while not run.traces or sum(len(t.text_events) for t in run.traces) < kill_after:
        if run.outcome:
            return None
        await asyncio.sleep(0.005)
    done = kill(run.traces[-1])
    return await done if inspect.isawaitable(done) else done


def reader_row(label: str, run: EventSourceRun, whole: str | None, tokens_generated: int | None,
               max_tokens: int) -> dict:
    """What one reader lived through, in one row (``whole``: the uninterrupted text, where there is one)."""
    ids = [e.id for t in run.traces for e in t.text_events]
    broken = [t for t in run.traces[:-1] if not any(e.kind == "end" for e in t.events)]
    after = run.traces[run.traces.index(broken[0]) + 1] if broken else None
    return {
        "log": label,
        "connections": len(run.traces),
        "outcome": run.outcome,
        "got_end": run.ended,
        "text_events": len(ids),
        "of_answer": max_tokens,
        "events_twice": len(ids) - len(set(ids)),
        "same_text": run.text == whole if whole is not None else None,
        "gap_s": run.gap(),
        "retry_s": after.sent - (broken[0].sent + (broken[0].end or 0.0)) if after is not None else None,
        "tokens_generated": tokens_generated,
        "served_by": [t.headers.get("x-served-by") for t in run.traces if t.status == 200],
    }


def body(max_tokens: int, seed: int = 7) -> dict:
    return {"prompt": PROMPT, "max_tokens": max_tokens, "seed": seed, "ignore_eos": True}


async def uninterrupted(c: Cluster, max_tokens: int) -> tuple[EventSourceRun, dict]:
    created = await timed.create_generation(c.balancer.port, body(max_tokens))
    run = await event_source(c.balancer.port, created["events"])
    return run, await timed.get_json(c.balancer.port, f"/generations/{created['id']}")


async def replica_killed(c: Cluster, max_tokens: int, kill_after: int) -> tuple[EventSourceRun, dict, str | None]:
    """With the shared log: the replica a reader is on killed mid-answer; the reader goes on through nginx."""
    created = await timed.create_generation(c.balancer.port, body(max_tokens))

    def kill(trace: Any) -> str:
        url = trace.headers.get("x-served-by")
        c.kill(c.replica(url))
        return url

    run = EventSourceRun(created["events"])
    reading = asyncio.ensure_future(_read_into(run, c.balancer.port))
    killed = await _watch_and_kill(run, kill_after, kill)
    await reading
    return run, await timed.get_json(c.balancer.port, f"/generations/{created['id']}"), killed


async def _read_into(run: EventSourceRun, port: int, first_port: int | None = None) -> None:
    """``event_source`` into a run the caller watches (the first connection to ``first_port``, if given)."""
    await event_source(port, run.path, first_port=first_port, run=run)


async def alone_killed(c: Cluster, max_tokens: int, kill_after: int) -> tuple[EventSourceRun, EventSourceRun, str]:
    """Without the shared log: through nginx from the start, and stuck to one replica until it is killed.

    The first reader does what the page would: POST, then GET the events,
    both through nginx. The second starts on the replica that made its
    generation, as a sticky session would send it, and reconnects through
    nginx once that replica is killed.
    """
    created = await timed.create_generation(c.balancer_alone.port, body(max_tokens))
    through = await event_source(c.balancer_alone.port, created["events"])
    home = c.alone[0]
    created = await timed.create_generation(home.port, body(max_tokens))
    sticky = EventSourceRun(created["events"])
    reading = asyncio.ensure_future(_read_into(sticky, c.balancer_alone.port, first_port=home.port))
    await _watch_and_kill(sticky, kill_after, lambda trace: c.kill(home))
    await reading
    return through, sticky, home.url


async def websocket_turns(c: Cluster) -> list[dict]:
    """A conversation's second turn on a new WebSocket: through nginx, on the first turn's replica, and through
    nginx to replicas that share one store."""
    rows = []
    for label, nginx, sticky in (("a store each, through nginx", c.balancer, False),
                                 ("a store each, same replica (sticky)", c.balancer, True),
                                 ("one shared store, through nginx", c.balancer_alone, False)):
        seen = len(_ws_upstreams(nginx))
        first = await websocket(nginx.port, "Hello! My name is Ada.", 8)
        conversation = _conversation_id(first)
        first_upstream = _ws_upstreams(nginx, seen + 1)[-1]
        port = int(first_upstream.rsplit(":", 1)[1]) if sticky else nginx.port
        second = await websocket(port, "What is my name?", 8, extra={"conversation_id": conversation})
        second_upstream = first_upstream if sticky else _ws_upstreams(nginx, seen + 2)[-1]
        error = next((e.data for e in second.events if e.kind == "error"), None)
        message = error.get("error", {}).get("message") if isinstance(error, dict) else error
        rows.append({
            "second turn": label, "first replica": first_upstream, "second replica": second_upstream,
            "same replica": first_upstream == second_upstream, "continued": bool(second.complete and error is None),
            "what the second replica said": message or "the answer, in the same conversation",
        })
    return rows


def _conversation_id(trace: Any) -> str | None:
    for e in trace.events:
        if isinstance(e.data, dict) and e.data.get("conversation_id"):
            return e.data["conversation_id"]
    return None


def _ws_upstreams(nginx: NginxProcess, at_least: int = 0) -> list[str]:
    """The replicas nginx sent each WebSocket to, in order (its access log names them once a connection ends)."""
    deadline = time.monotonic() + 5
    while True:
        found = re.findall(r'"GET /ws HTTP/1.1" \d+ .*upstream=(\S+)', nginx.access_log())
        if len(found) >= at_least or time.monotonic() > deadline:
            return found


async def worker_killed(c: Cluster, max_tokens: int, kill_after: int) -> dict:
    """The worker generating an answer killed mid-answer: who continues it, from where, and how long the reader waited."""
    created = await timed.create_generation(c.balancer.port, body(max_tokens))
    run = EventSourceRun(created["events"])
    reading = asyncio.ensure_future(_read_into(run, c.balancer.port))
    killed_at: list[float] = []

    async def kill(trace: Any) -> str:
        name = (await timed.get_json(c.balancer.port, f"/generations/{created['id']}"))["worker"]
        worker = next(w for w in c.workers if f"worker {name} ready" in " ".join(w.stdout_lines))
        c.kill(worker)
        killed_at.append(time.perf_counter())
        return name

    name = await _watch_and_kill(run, kill_after, kill)
    await reading
    ends = [(t.sent + e.t, e) for t in run.traces for e in t.events if e.kind == "end"]
    end_time, end = ends[0] if ends else (None, None)
    state = await timed.get_json(c.balancer.port, f"/generations/{created['id']}")
    data = (end.data or {}) if end else {}
    rows = run.timeline()
    ids = [e.id for t in run.traces for e in t.text_events]
    return {
        "killed": name, "ended_by": data.get("worker"), "continued_from": data.get("continued_from"),
        "kept_tokens": data.get("kept_tokens"),
        "stop_reason": state["stored_reason"], "tokens": state["tokens"] if end is None else data["tokens"],
        "reader_text_is_kept_text": run.text == state["text"], "chars": len(state["text"]),
        "events_twice": len(ids) - len(set(ids)),
        "seconds_to_end": end_time - killed_at[0] if end_time is not None and killed_at else None,
        # The reader's longest wait between two pieces: the kill, the claim-idle, the heir's prefill.
        "longest_gap_s": max((b[0] - a[0] for a, b in zip(rows, rows[1:])), default=None),
        "text_events": len(rows),
    }


async def stop_elsewhere(c: Cluster, max_tokens: int, after: int) -> list[dict]:
    """A cancel sent to a replica the reader is not on, and a reader who leaves: tokens run on after each signal."""
    rows = []
    created = await timed.create_generation(c.balancer.port, body(max_tokens))
    run = EventSourceRun(created["events"])
    reading = asyncio.ensure_future(_read_into(run, c.balancer.port))

    async def cancel_elsewhere(trace: Any) -> str:
        reader_on = trace.headers.get("x-served-by")
        other = next(r for r in c.live_shared() if r.url != reader_on)
        await timed.cancel_generation(other.port, created["id"])
        return other.url

    cancelled_on = await _watch_and_kill(run, after, cancel_elsewhere)
    await reading
    rows.append(_stop_row("cancel sent to another replica", run, cancelled_on))
    created = await timed.create_generation(c.balancer.port, body(max_tokens))
    left = await timed.events(c.balancer.port, created["events"], stop_after=after)
    state = await _until_done(c.balancer.port, created["id"])
    end = await _end_of(c, created["id"])
    rows.append({"signal": "the reader left (then the grace period)", "where": left.headers.get("x-served-by"),
                 "stop_reason": state["stored_reason"], "tokens": end["tokens"],
                 "tokens_at_stop": end.get("tokens_at_stop"),
                 "run_on": end["tokens"] - end["tokens_at_stop"] if "tokens_at_stop" in end else None})
    return rows


def _stop_row(label: str, run: EventSourceRun, where: str | None) -> dict:
    end = next((e.data for t in run.traces for e in t.events if e.kind == "end"), {}) or {}
    return {"signal": label, "where": where, "stop_reason": end.get("stop_reason"), "tokens": end.get("tokens"),
            "tokens_at_stop": end.get("tokens_at_stop"),
            "run_on": end["tokens"] - end["tokens_at_stop"] if "tokens_at_stop" in end else None}


async def _until_done(port: int, generation_id: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = await timed.get_json(port, f"/generations/{generation_id}")
        if state["status"] == "done" or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.05)


async def _end_of(c: Cluster, generation_id: str) -> dict:
    from streamlab.server.resources.shared_log import decode_entry, events_key, open_client

    redis = open_client(c.redis.url)
    try:
        rows = await redis.xrevrange(events_key(generation_id), count=1)
        return decode_entry(rows[0][1])[1] if rows else {}
    finally:
        await redis.aclose()
