"""Chapter 13's experiments: kill what serves a reader, and see what the reader keeps.

``cluster()`` starts everything at once (Redis, replicas with the shared
log, the same number without it, the workers, two nginx), and each
experiment below uses it and returns plain rows:

- ``replica_killed``: a reader on replica X, X killed with SIGKILL after
  ``kill_after`` text events; the reader (an ``EventSource``) reconnects
  through nginx and goes on, or not;
- ``websocket_turns``: a second turn of a WebSocket conversation on a new
  connection through nginx, with the conversations in Redis and with a store
  per replica, and on the same replica (what a sticky session gives);
- ``worker_killed``: the worker generating an answer killed mid-answer;
- ``stop_elsewhere``: a cancel sent to another replica, and a reader who
  leaves, counted in tokens run on after the signal (as chapter 5 counts);
- ``redis_outage``: Redis itself killed mid-answer, then started again on its
  port (its append-only file on): what the reader saw, ``/health`` and a new
  ``POST`` meanwhile, how long until new work streams, and the answer it cut.

The cluster's Redis keeps its append-only file (``appendfsync everysec``), so
that a restart finds what it had (``redis_restart.py`` measures what a kill
loses).
"""

from __future__ import annotations

import asyncio
import inspect
import math
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
from streamlab.client.tracing import Trace, TraceEvent, last_id
from streamlab.hops.nginx import NginxProcess
from streamlab.lab.experiments.redis_restart import RestartableRedis, restartable_redis
from streamlab.lab.setups.replicas import run_balancer, start_replicas, start_workers
from streamlab.lab.setups.runner import RunningServer, all_started, start_server
from streamlab.server.store.schema import CUT_OFF_MARKER, CUT_OFF_WORDS

PROMPT = "Write a short note to a friend about a walk by the sea."


@dataclass
class Cluster:
    redis: RestartableRedis  # killed and started again on its port by redis_outage
    shared: list[RunningServer]  # replicas whose /generations and conversations live in Redis
    alone: list[RunningServer]  # replicas that each keep their own, in memory and in a SQLite file each
    workers: list[RunningServer]
    balancer: NginxProcess  # in front of the shared replicas
    balancer_alone: NginxProcess  # in front of the others
    plain: RunningServer  # one plain serve with the model, no Redis: what the shared log is weighed against
    grace: float = 1.0  # the replicas' and workers' --grace
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
    """Redis, ``replicas`` model-less replicas sharing it and ``alone`` without it, ``workers`` workers, two nginx,
    and one plain ``serve`` with the model (the shared log's throughput is weighed against it).

    Every replica has a SQLite file of its own, as replicas on machines apart would: those with the
    shared log keep their conversations in Redis instead, the others in that file.
    """
    with ExitStack() as stack:
        redis = stack.enter_context(restartable_redis(appendonly=True))
        folder = Path(tempfile.mkdtemp(prefix="streamlab-replicas-"))
        stack.callback(shutil.rmtree, folder, True)
        own = [str(folder / f"replica-{i + 1}.db") for i in range(replicas + alone)]  # a store each
        model_flags = ["--model", model] if model else []
        with ThreadPoolExecutor(max_workers=4) as pool:  # all at once; if one fails, the others are stopped
            shared, alone_ones, working, plain = all_started([
                pool.submit(start_replicas, replicas, events=redis.url, grace=grace, dbs=own[:replicas]),
                pool.submit(start_replicas, alone, grace=grace, dbs=own[replicas:]),
                pool.submit(start_workers, redis.url, workers, "--claim-idle", str(claim_idle), *model_flags),
                pool.submit(start_server, "--db", str(folder / "plain.db"), *model_flags)])
        stack.callback(_stop_all, [*shared, *alone_ones, *working, plain])
        balancer = stack.enter_context(run_balancer([r.port for r in shared]))
        balancer_alone = stack.enter_context(run_balancer([r.port for r in alone_ones]))
        yield Cluster(redis, shared, alone_ones, working, balancer, balancer_alone, plain, grace)


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


FIRST_TURN, SECOND_TURN = "Hello! My name is Ada.", "What is my name?"


async def websocket_turns(c: Cluster, tokens: int = 8) -> list[dict]:
    """A conversation's second turn on a new WebSocket: through nginx with the conversations in Redis, through
    nginx with a store per replica, and on the first turn's replica (what a sticky session gives).

    ``prompt words`` is what the second answer's prompt was, read from the replica that made it (``/log``:
    a scripted replica counts a prompt's words), against ``conversation words``, the first turn's
    exchange and the second prompt: equal when the history was kept.
    """
    rows = []
    for label, nginx, sticky in (("conversations in Redis, through nginx", c.balancer, False),
                                 ("a store each, through nginx", c.balancer_alone, False),
                                 ("a store each, same replica (sticky)", c.balancer_alone, True)):
        seen = len(_ws_upstreams(nginx))
        first = await websocket(nginx.port, FIRST_TURN, tokens)
        conversation, done = _conversation_id(first), _done(first)
        first_upstream = _ws_upstreams(nginx, seen + 1)[-1]
        port = int(first_upstream.rsplit(":", 1)[1]) if sticky else nginx.port
        second = await websocket(port, SECOND_TURN, tokens, extra={"conversation_id": conversation})
        second_upstream = first_upstream if sticky else _ws_upstreams(nginx, seen + 2)[-1]
        error = next((e.data for e in second.events if e.kind == "error"), None)
        message = error.get("error", {}).get("message") if isinstance(error, dict) else error
        answer = "".join(e.text for e in first.text_events)
        if done.get("incomplete"):  # the model reads a cut-off answer with the note that says so
            answer += CUT_OFF_MARKER.format(reason=CUT_OFF_WORDS.get(done["stop_reason"], done["stop_reason"]))
        expected = sum(len(text.split()) for text in (FIRST_TURN, answer, SECOND_TURN))
        read = None
        if error is None and second.complete:
            record = await timed.get_json(int(second_upstream.rsplit(":", 1)[1]), f"/log/{_done(second)['id']}")
            read = record["prompt_tokens"]
        rows.append({
            "second turn": label, "first replica": first_upstream, "second replica": second_upstream,
            "same replica": first_upstream == second_upstream, "continued": bool(second.complete and error is None),
            "first incomplete": bool(done.get("incomplete")), "prompt words": read, "conversation words": expected, "history kept": read == expected,
            "what the second replica said": message or "the answer, in the same conversation",
        })
    return rows


def _done(trace: Any) -> dict:
    return next((e.data for e in trace.events if e.kind == "done" and isinstance(e.data, dict)), {})


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
    read_at_kill: list[int] = []  # the reader's text events at the kill: the round trip above may bring it more

    async def kill(trace: Any) -> str:
        name = (await timed.get_json(c.balancer.port, f"/generations/{created['id']}"))["worker"]
        worker = next(w for w in c.workers if f"worker {name} ready" in " ".join(w.stdout_lines))
        read_at_kill.append(sum(len(t.text_events) for t in run.traces))
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
        "kept_tokens": data.get("kept_tokens"), "read_at_kill": read_at_kill[0] if read_at_kill else None,
        "stop_reason": state["stored_reason"], "tokens": state["tokens"] if end is None else data["tokens"],
        "reader_text_is_kept_text": run.text == state["text"], "chars": len(state["text"]),
        "events_twice": len(ids) - len(set(ids)),
        "seconds_to_end": end_time - killed_at[0] if end_time is not None and killed_at else None,
        # The reader's longest wait between two pieces: the kill, the claim-idle, the heir's prefill.
        "longest_gap_s": max((b[0] - a[0] for a, b in zip(rows, rows[1:])), default=None),
        "text_events": len(rows),
    }


FASTEST_TOKEN_S = 0.002  # under any decode step measured here (8.3 ms natively, 12.7 ms on AVX2 kernels)


def outlasting(seconds: float, tokens: int) -> int:
    """An answer's max_tokens that keeps it going ``seconds`` past its first ``tokens``, at any model's pace."""
    return min(4096, tokens + math.ceil(seconds / FASTEST_TOKEN_S))


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
    # The reader who leaves: an answer that is still being made when the grace period runs out, however fast the
    # model (at 8 ms a token natively, 96 tokens were made within a 1 s grace and the answer ended on its own).
    created = await timed.create_generation(c.balancer.port, body(outlasting(c.grace, max_tokens)))
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


async def redis_outage(c: Cluster, max_tokens: int, after: int, new_tokens: int = 8) -> dict:
    """Redis killed with SIGKILL while a reader follows an answer, then started again on its port (its file kept).

    What the reader saw (the event that ended its stream, how long after the kill), ``/health`` on a
    replica and a new ``POST /generations`` meanwhile, how long Redis took to answer again, how long from
    then until a new generation's first text reached its reader, and the cut answer: read on with its
    ``Last-Event-ID`` once Redis is back, continued by a worker after ``--claim-idle``.
    """
    created = await timed.create_generation(c.balancer.port, body(max_tokens))
    reading = asyncio.ensure_future(timed.events(c.balancer.port, created["events"], timeout=60))
    replica = c.live_shared()[0]
    while (await timed.get_json(replica.port, f"/generations/{created['id']}"))["tokens"] < after:
        await asyncio.sleep(0.01)
    alive = [p for p in [*c.shared, *c.workers] if p.process.poll() is None]
    killed = time.perf_counter()
    c.redis.kill()
    health = await _health_until(replica.port, 503)
    refused = await timed.fetch(c.balancer.port, "POST", "/generations", body=body(new_tokens))
    first = await reading
    ended = next((e for e in first.events if e.kind in ("error", "end")), None)
    down_s = time.perf_counter() - killed
    start_s = await asyncio.to_thread(c.redis.start)
    back = time.perf_counter()
    new, rests = await asyncio.gather(_new_work(c.balancer.port, new_tokens, back),
                                      _read_on(c.balancer.port, created["events"], last_id(first)))
    rest = _joined(rests)
    end = next((e for e in rest.events if e.kind == "end"), None)
    stored = await timed.get_json(c.balancer.port, f"/generations/{created['id']}")
    error = (ended.data or {}).get("error", {}) if ended is not None and isinstance(ended.data, dict) else {}
    refusal = refused.json() if refused.body.startswith(b"{") else {}
    return {
        "reader_event": ended.kind if ended else None, "reader_message": error.get("message"),
        "reader_told_s": first.sent + ended.t - killed if ended is not None else None,
        "reader_text_events": len(first.text_events),
        "health_status": health["status"], "health_redis": health["redis"], "health_s": health["s"],
        "post_status": refused.status, "post_retry_after": refused.headers.get("retry-after"),
        "post_message": refusal.get("error", {}).get("message"),
        "down_s": down_s, "redis_start_s": start_s,
        "new_refused": new["refused"], "new_first_text_s": new["first_text_s"], "new_instead": new["instead"],
        "rest_text_events": len(rest.text_events), "rest_end": end.data if end is not None else None,
        "rest_connections": len(rests),
        "rest_done_s": rest.sent + rest.end - back if rest.end is not None else None,
        # Whole: the reader's two reads together are the stored answer, all its tokens, no piece twice.
        "answer_whole": end is not None and end.data.get("tokens") == max_tokens
        and first.text + rest.text == stored["text"],
        # Events the reader had that Redis's file did not (appendfsync everysec: up to its last second): the
        # continuation made them again after the kept ones, so the reader's copy of them is not the stored one.
        "lost_events": max(0, len(first.text_events) - int(end.data.get("kept_tokens") or 0)) if end is not None
        else None,
        "alive_before": len(alive), "alive_after": sum(p.process.poll() is None for p in alive),
        # For a timeline, seconds from the kill: each text event the reader got, before and after; Redis's return.
        "before_s": [first.sent + e.t - killed for e in first.text_events],
        "after_s": [rest.sent + e.t - killed for e in rest.text_events], "back_s": back - killed,
    }


async def _health_until(port: int, status: int, timeout: float = 10.0) -> dict:
    """Ask ``/health`` every 50 ms until it answers ``status``: that answer's ``redis``, and the seconds it took."""
    began = time.perf_counter()
    while True:
        reply = await timed.fetch(port, "GET", "/health")
        if reply.status == status or time.perf_counter() - began > timeout:
            return {"status": reply.status, "redis": reply.json().get("redis"), "s": time.perf_counter() - began}
        await asyncio.sleep(0.05)


async def _read_on(port: int, path: str, last: str | None, timeout: float = 30.0) -> list[Trace]:
    """Read on from ``last`` once Redis is back, asking again after a refusal or an error, to the answer's end.

    Right after Redis's return a replica may not have its connection back yet:
    it refuses (503) or ends the stream with an error event. The reader waits
    the stream's ``retry`` (0.5 s without one) and asks again with its last id,
    as a page's own reconnect code would (an ``EventSource`` gives up on a 503).
    """
    traces: list[Trace] = []
    deadline = time.perf_counter() + timeout
    while True:
        trace = await timed.events(port, path, last_event_id=last, timeout=60)
        traces.append(trace)
        if any(e.kind == "end" for e in trace.events) or trace.status == 204 or time.perf_counter() > deadline:
            return traces
        last = last_id(trace) or last
        await asyncio.sleep((trace.retry or 500) / 1000)


def _joined(traces: list[Trace]) -> Trace:
    """The reads of one reader as one: the last one's clock, every read's text and events in order."""
    last = traces[-1]
    joined = Trace(way=last.way, sent=last.sent, status=last.status, end=last.end, chunks=list(last.chunks))
    for trace in traces:
        joined.events += [TraceEvent(trace.sent + e.t - last.sent, e.kind, e.text, e.nbytes, e.data, e.id)
                          for e in trace.events]
        joined.text += trace.text
    return joined


async def _new_work(port: int, tokens: int, since: float, timeout: float = 30.0) -> dict:
    """A new generation once Redis is back: POSTed until accepted (each 503 counted), then its first text."""
    refused = 0
    while True:
        reply = await timed.fetch(port, "POST", "/generations", body=body(tokens))
        if reply.status == 201 or time.perf_counter() - since > timeout:
            break
        refused += 1
        await asyncio.sleep(0.05)
    if reply.status != 201:
        return {"refused": refused, "first_text_s": None, "instead": (reply.status, reply.body[:200].decode(errors="replace"))}
    trace = await timed.events(port, reply.json()["events"], stop_after=1, timeout=timeout)
    first = trace.text_events[0].t + trace.sent - since if trace.text_events else None
    # Where no text came: what the reader got instead (the status, the event that ended its stream).
    said = None if trace.text_events else (trace.status, next((e.data for e in trace.events if e.kind in ("error", "end")),
                                                              trace.body[:200].decode(errors="replace")))
    return {"refused": refused, "first_text_s": first, "instead": said}
