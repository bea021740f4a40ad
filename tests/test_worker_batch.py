"""The worker as a batched engine, an answer taken over and continued, a worker that outlives its Redis (issue 31).

The helpers first (no Redis): what a piece entry carries, what a stream kept, the text a stop check held
back. Then against Debian's redis-server (skipped where there is none), with the scripted model where
batching is not the point: a worker holds up to --max-active jobs at once; a taken-over answer goes on
where its stream stopped, one answer and no token twice; a Redis killed and started again leaves the
worker serving. The real model where only it can tell: one batch of four, and a worker process killed
mid-answer whose heir's greedy continuation is, token for token, the uninterrupted answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from fakes import ASSISTANT_ID, ByteTokenizer, FakeLM
from inprocess import generation_done, serving

from streamlab.book import bench
from streamlab.client import timed
from streamlab.client.tracing import Trace, last_id
from streamlab.lab.outside.redis_server import find_redis, run_redis
from streamlab.lab.setups.replicas import InProcessWorker, start_worker, start_workers, worker_in_process
from streamlab.net.processes import die_with_parent, free_port, stop_process, wait_for_port
from streamlab.server.config import ServerConfig
from streamlab.server.resources import shared_log
from streamlab.server.resources.continued import (
    IDS, AfterKept, Continuation, Kept, WorkerSource, entry_ids, held_back, piece_entry,
)

needs_redis = pytest.mark.skipif(find_redis() is None and not os.environ.get("CI"), reason="no redis-server here")
SCRIPT = "One answer, many servers, and a worker that may die in the middle of it. " * 3  # 219 characters


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def text_of(*traces: Trace) -> str:
    return "".join(e.text for trace in traces for e in trace.text_events)


def ending(trace: Trace) -> dict:
    return next(e.data for e in trace.events if e.kind == "end")


def ended_at(trace: Trace) -> float:
    return trace.sent + next(e.t for e in trace.events if e.kind == "end")


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``check`` until it holds; the seconds it took (an AssertionError past ``timeout``)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"not within {timeout} s: {what}"
        time.sleep(0.02)
    return time.monotonic() - started


async def stream_fields(url: str, generation_id: str) -> list[dict[str, str]]:
    redis = shared_log.open_client(url)
    try:
        return [fields for _, fields in await redis.xrange(shared_log.events_key(generation_id))]
    finally:
        await redis.aclose()


def token_ids(entries: list[dict[str, str]]) -> list[int]:
    """Every token id the stream's pieces carry, in order."""
    return [i for fields in entries if fields["e"] == "message" for i in entry_ids(fields)]


# --------------------------------------------------------------------------
# What a piece carries, what a stream kept, what a stop check held back
# --------------------------------------------------------------------------


def test_a_piece_entry_carries_its_token_ids_and_a_reader_gets_the_same_event() -> None:
    entry = piece_entry("Hel", 3, [72, 101, 108])
    assert entry[IDS] == "72,101,108"
    assert {k: v for k, v in entry.items() if k != IDS} == shared_log.encode_entry("message", {"text": "Hel"}, 3)
    as_read = {k: str(v) for k, v in entry.items()}  # Redis gives every field back as text
    assert shared_log.decode_entry(as_read) == ("message", {"text": "Hel"}, 3)
    assert entry_ids(as_read) == [72, 101, 108] and entry_ids({IDS: ""}) == []
    assert entry_ids(shared_log.encode_entry("message", {"text": "x"}, 1)) is None
    assert IDS not in piece_entry("x", 1, None)  # the shared-log benchmark's appends: what they were


def test_what_a_stream_kept_is_its_pieces_ids_and_text_or_nothing_when_they_do_not_add_up() -> None:
    def as_read(*entries: dict) -> list[dict[str, str]]:
        return [{k: str(v) for k, v in e.items()} for e in entries]

    one, two = piece_entry("On", 2, [79, 110]), piece_entry("e", 3, [101])
    assert Kept.from_entries(as_read(one, two)) == Kept((79, 110, 101), "One")
    assert Kept.from_entries([]) == Kept((), "")
    assert Kept.from_entries(as_read(one, shared_log.encode_entry("message", {"text": "e"}, 3))) is None  # no ids
    assert Kept.from_entries(as_read(one, piece_entry("e", 4, [101]))) is None  # says 4 tokens, holds 3


def test_the_text_a_stop_check_held_back_is_found_and_ends_the_continued_answer_at_the_stop() -> None:
    """"Hello " was sent, "wor" held (it might begin "world"): the heir finds "world" across the cut, sends nothing."""
    tokenizer = ByteTokenizer()
    prompt = [*tokenizer.encode("user: hi"), ASSISTANT_ID]
    kept = Kept(tuple(tokenizer.encode("Hello wor")), "Hello ")
    assert held_back(tokenizer, prompt, kept, ("world",)) == "wor"
    assert held_back(tokenizer, prompt, kept, ()) == ""
    source, config = WorkerSource(FakeLM("Hello world, and then more.")), ServerConfig(engine="threads")
    messages = ({"role": "user", "content": "hi"},)
    prompt_ids = source.prompt_ids(messages, chat=True)

    async def continued(held: str) -> Any:
        req = Continuation(prompt="hi", max_tokens=20, stop=("world",), kept_ids=kept.ids, held=held)
        generation = source.generation(req, [*prompt_ids, *kept.ids], messages, config, lambda n: None)
        pieces = [piece.text async for piece in generation]
        return pieces, await generation.wait()

    pieces, result = run(continued("wor"))
    assert (pieces, result.stop_reason, result.text) == ([], "stop_sequence", "")
    pieces, result = run(continued(""))  # without it the rest of the stop sequence is text: "ld, and then more."
    assert "".join(pieces).startswith("ld, and")


def test_a_continued_answers_repetition_penalty_sees_the_kept_tokens() -> None:
    seen: list[list[int]] = []

    def sampler(logits: Any, previous: Any = ()) -> int:
        seen.append(list(previous))
        return 0

    sampler.window = 2  # type: ignore[attr-defined]
    after = AfterKept(sampler, [1, 2, 3])
    after(None, [4])
    assert seen == [[2, 3, 4]] and after.window == 2  # the last `window` kept, then this generation's


# --------------------------------------------------------------------------
# Against redis-server, with the scripted model
# --------------------------------------------------------------------------


@needs_redis
@pytest.mark.parametrize("max_active", [4, 2])
def test_a_worker_runs_up_to_max_active_jobs_at_once(max_active: int) -> None:
    lm = FakeLM(SCRIPT, decode_seconds=0.02)  # 30 tokens: 0.6 s a job
    with run_redis() as redis, serving(events=redis.url) as replica, \
            worker_in_process(lm, redis.url, max_active=max_active) as w:
        async def four() -> list[Trace]:
            created = [await timed.create_generation(replica.port, {"prompt": f"hi {i}", "max_tokens": 30})
                       for i in range(4)]
            return list(await asyncio.gather(*(timed.events(replica.port, c["events"]) for c in created)))

        traces = run(four())
        wait_until(lambda: len(w.worker.done) == 4, 5, "the worker's own count of the jobs it ended")
        assert w.worker.most_at_once == max_active
    assert all(t.complete for t in traces) and all(text_of(t) == SCRIPT[:30] for t in traces)
    firsts = sorted(t.sent + t.text_events[0].t for t in traces)
    first_end = min(ended_at(t) for t in traces)
    if max_active == 4:
        assert firsts[-1] < first_end, "every job's first piece came before any job ended: all four at once"
    else:
        assert firsts[1] < first_end < firsts[2], "two at once; the third began once one of them ended"


@needs_redis
def test_a_worker_crashed_mid_answer_is_continued_by_another_one_answer_no_token_twice() -> None:
    lm = FakeLM(SCRIPT, decode_seconds=0.02)
    with run_redis() as redis, serving(events=redis.url) as replica:
        first_worker = InProcessWorker(lm, redis.url, name="first", claim_idle=0.3)
        created = run(timed.create_generation(replica.port, {"prompt": "hi", "max_tokens": 150}))
        before = run(timed.events(replica.port, created["events"], stop_after=8))
        first_worker.crash()  # acknowledges nothing, ends nothing
        with worker_in_process(lm, redis.url, name="second", claim_idle=0.3) as heir:
            after = run(timed.events(replica.port, created["events"], last_event_id=last_id(before)))
            state = generation_done(replica.port, created["id"])
            entries = run(stream_fields(redis.url, created["id"]))
            wait_until(lambda: heir.worker.continued == [created["id"]], 5, "the heir's own count")
        assert heir.worker.done == heir.worker.continued == [created["id"]]
    end = ending(after)
    assert end["continued_from"] == "first" and end["continued_by"] == end["worker"] == "second"
    assert 8 <= end["kept_tokens"] < 150 and end["tokens"] == 150 and end["stop_reason"] == "max_tokens"
    assert end["incomplete"] is True  # max_tokens, as an uninterrupted answer of 150 tokens would be
    assert text_of(before, after) == state["text"] == SCRIPT[:150]
    assert token_ids(entries) == list(SCRIPT[:150].encode())  # the tokens once each, in order
    ids = [e.id for e in [*before.text_events, *after.text_events]]
    assert len(ids) == len(set(ids))


async def abandoned(url: str, case: str) -> str:
    """A job as a worker named ``ghost`` leaves it by dying after 3 tokens, "One": pending under its name, running."""
    redis = shared_log.open_client(url)
    try:
        await shared_log.ensure_group(redis)
        generation_id = f"left-{case}"
        meta = {"request": json.dumps({"prompt": "hi", "max_tokens": 50, "ignore_eos": True}), "status": "running",
                "worker": "ghost", "readers": 0, "orphaned_ms": await shared_log.redis_ms(redis), "grace_ms": 30_000,
                "tokens": 3, **({"cancel": "cancel", "cancel_ms": 0} if case == "cancelled" else {})}
        await redis.hset(shared_log.meta_key(generation_id), mapping=meta)
        await redis.xadd(shared_log.JOBS, {"generation": generation_id})
        await redis.xreadgroup(shared_log.GROUP, "ghost", {shared_log.JOBS: ">"}, count=1)
        events = shared_log.events_key(generation_id)
        for text, tokens in (("On", 2), ("e", 3)):
            ids = None if case == "no ids" else list(text.encode())
            await redis.xadd(events, piece_entry(text, tokens, ids))
        if case == "ended":
            await redis.xadd(events, shared_log.encode_entry("end", {"stop_reason": "max_tokens", "tokens": 3}, 3))
        return generation_id
    finally:
        await redis.aclose()


@needs_redis
@pytest.mark.parametrize("case", ["continued", "no ids", "cancelled", "ended"])
def test_what_a_worker_does_with_a_job_left_running(case: str) -> None:
    with run_redis() as redis:
        generation_id = run(abandoned(redis.url, case))
        with worker_in_process(FakeLM(SCRIPT), redis.url, name="heir", claim_idle=0.2) as w:
            wait_until(lambda: w.worker.done == [generation_id] if case != "ended" else not run(pending(redis.url)),
                       10, f"the job left {case} handled")
            entries = run(stream_fields(redis.url, generation_id))
            assert run(pending(redis.url)) == 0  # acknowledged
    decoded = [shared_log.decode_entry(fields) for fields in entries]
    ends = [data for name, data, _ in decoded if name == "end"]
    text = "".join(data["text"] for name, data, _ in decoded if name == "message")
    assert len(ends) == 1, decoded
    if case == "continued":
        assert text == SCRIPT[:50] and token_ids(entries) == list(SCRIPT[:50].encode())
        assert ends[0]["tokens"] == 50 and ends[0]["kept_tokens"] == 3 and ends[0]["continued_from"] == "ghost"
    elif case == "no ids":  # an older worker's pieces: what they hold cannot be continued exactly
        assert text == "One" and ends[0]["stop_reason"] == "interrupted" and ends[0]["interrupted_worker"] == "ghost"
    elif case == "cancelled":
        assert text == "One" and ends[0]["stop_reason"] == "stopped" and ends[0]["tokens_at_stop"] == 3
        assert ends[0]["continued_from"] == "ghost" and ends[0]["tokens"] == 3
    else:
        assert len(entries) == 3 and ends[0] == {"stop_reason": "max_tokens", "tokens": 3}  # left as it was


async def pending(url: str) -> int:
    redis = shared_log.open_client(url)
    try:
        return (await redis.xpending(shared_log.JOBS, shared_log.GROUP))["pending"]
    finally:
        await redis.aclose()


async def idle(w: InProcessWorker) -> bool:
    """No job held and nothing generating (read on the worker's own loop)."""
    return not w.worker.tasks and not w.worker.line().running


def start_redis(port: int, folder: Path, *, keep: bool) -> subprocess.Popen:
    """redis-server on ``port`` (to start it again there); ``keep``: its data on disk, every write synced first."""
    binary = find_redis()
    assert binary is not None
    keeping = ["--appendonly", "yes", "--appendfsync", "always"] if keep else ["--appendonly", "no"]
    process = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", *keeping, "--dir", str(folder),
         "--logfile", str(folder / "redis.log"), "--daemonize", "no"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)

    def pongs(sock: Any) -> bool:
        sock.sendall(b"PING\r\n")
        return sock.recv(64).startswith(b"+PONG")

    assert wait_for_port(process, port, 10, answers=pongs) is None, (folder / "redis.log").read_text()[-2000:]
    return process


@needs_redis
def test_a_worker_outlives_its_redis_and_continues_the_answer_it_was_generating(tmp_path: Path, capsys) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}"
    redis = start_redis(port, tmp_path, keep=True)
    try:
        lm = FakeLM(SCRIPT, decode_seconds=0.03)
        with serving(events=url) as replica, worker_in_process(lm, url, name="steady", claim_idle=0.5) as w:
            created = run(timed.create_generation(replica.port, {"prompt": "hi", "max_tokens": 150}))
            before = run(timed.events(replica.port, created["events"], stop_after=5))
            redis.kill()
            redis.wait(10)
            # Nothing can be appended: its generation stops, its slot is free (the job pending under its name).
            stopped_in = wait_until(lambda: w._call(idle(w)), 3.0, "the job given up")
            time.sleep(1.0)
            assert not w.task.done(), "the worker's loop ended with its Redis"
            redis = start_redis(port, tmp_path, keep=True)
            back = time.monotonic()
            fresh = run(timed.create_generation(replica.port, {"prompt": "again", "max_tokens": 20}))
            new = run(timed.events(replica.port, fresh["events"], timeout=10))
            served_in = time.monotonic() - back
            after = run(timed.events(replica.port, created["events"], last_event_id=last_id(before)))
            entries = run(stream_fields(url, created["id"]))
            assert not w.task.done()
    finally:
        stop_process(redis, 5)
    err = capsys.readouterr().err
    assert err.count("worker steady: Redis failed") == 1 and err.count("worker steady: Redis answers again") == 1, err
    assert stopped_in < 1.0 and new.complete and text_of(new) == SCRIPT[:20] and served_in < 10, served_in
    end = ending(after)
    assert end["continued_from"] == end["continued_by"] == "steady" and end["tokens"] == 150
    assert text_of(before, after) == SCRIPT[:150] and token_ids(entries) == list(SCRIPT[:150].encode())


# --------------------------------------------------------------------------
# The real model
# --------------------------------------------------------------------------

PROMPTS = ("Tell me about ferries.", "How does a bicycle stay upright?", "Describe the sound of rain on a tin roof.",
           "Write a haiku about the sea.")


@needs_redis
@pytest.mark.model
def test_a_batched_worker_decodes_four_jobs_in_one_batch() -> None:
    from streamlab.model.loading import load_model

    lm = load_model()
    with run_redis() as redis, serving(events=redis.url) as replica, \
            worker_in_process(lm, redis.url, max_active=4) as w:
        async def four() -> list[Trace]:
            warm = await timed.create_generation(replica.port, {"prompt": "Hi", "max_tokens": 2})
            await timed.events(replica.port, warm["events"], timeout=120)  # the first passes pay for warming up
            created = await asyncio.gather(*(timed.create_generation(
                replica.port, {"prompt": p, "max_tokens": 32, "ignore_eos": True, "seed": i})
                for i, p in enumerate(PROMPTS)))
            return list(await asyncio.gather(*(timed.events(replica.port, c["events"], timeout=120) for c in created)))

        traces = run(four())
        engine = w.worker.source.engine
    assert engine is not None and engine.stats.max_batch == 4, engine and engine.stats
    assert all(t.complete and ending(t)["tokens"] == 32 for t in traces)
    assert max(t.sent + t.text_events[0].t for t in traces) < min(ended_at(t) for t in traces)


@needs_redis
@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_worker_process_killed_mid_answer_is_continued_token_for_token() -> None:
    """Greedy, float32: the heir's continuation is exactly the uninterrupted answer's tokens, each once."""
    body = {"prompt": "Write a short story about a lighthouse keeper.", "max_tokens": 40, "ignore_eos": True,
            "temperature": 0}
    with run_redis() as redis, serving(events=redis.url) as replica:
        workers = start_workers(redis.url, 2, "--claim-idle", "0.5", "--precision", "float32", "--token-delay", "0.05")
        try:
            whole = run(timed.create_generation(replica.port, body))
            reference = run(timed.events(replica.port, whole["events"], timeout=120))
            created = run(timed.create_generation(replica.port, body))
            before = run(timed.events(replica.port, created["events"], stop_after=6))
            killed = run(timed.get_json(replica.port, f"/generations/{created['id']}"))["worker"]
            doomed = next(p for p in workers if f"worker {killed} ready" in " ".join(p.stdout_lines))
            os.kill(doomed.process.pid, signal.SIGKILL)
            doomed.process.wait(10)
            after = run(timed.events(replica.port, created["events"], last_event_id=last_id(before), timeout=120))
            reference_ids = token_ids(run(stream_fields(redis.url, whole["id"])))
            continued_ids = token_ids(run(stream_fields(redis.url, created["id"])))
        finally:
            for process in workers:
                process.stop()
    end = ending(after)
    assert reference.complete and after.complete
    assert end["continued_from"] == killed and end["continued_by"] == end["worker"] != killed
    assert 6 <= end["kept_tokens"] < 40 and end["tokens"] == 40 and end["stop_reason"] == "max_tokens"
    assert len(reference_ids) == 40 and continued_ids == reference_ids  # no token twice, none other
    assert text_of(before, after) == text_of(reference)
    ids = [e.id for e in [*before.text_events, *after.text_events]]
    assert len(ids) == len(set(ids))


@needs_redis
@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_worker_process_outlives_a_redis_killed_and_started_again(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}"
    redis = start_redis(port, tmp_path, keep=False)
    try:
        with serving(events=url) as replica:
            worker = start_worker(url, "--name", "survivor", "--claim-idle", "0.5")
            try:
                created = run(timed.create_generation(replica.port, {"prompt": "Count to fifty.", "max_tokens": 60,
                                                                     "ignore_eos": True}))
                run(timed.events(replica.port, created["events"], stop_after=3, timeout=120))
                redis.kill()
                redis.wait(10)
                time.sleep(2.0)
                assert worker.process.poll() is None, worker.stderr()
                redis = start_redis(port, tmp_path, keep=False)  # empty: the job queue and its group made again
                back = time.monotonic()
                fresh = run(timed.create_generation(replica.port, {"prompt": "Hi", "max_tokens": 8, "ignore_eos": True}))
                new = run(timed.events(replica.port, fresh["events"], timeout=10))
                served_in = time.monotonic() - back
                assert worker.process.poll() is None
            finally:
                worker.stop()
    finally:
        stop_process(redis, 5)
    err = worker.stderr()
    assert new.complete and ending(new)["tokens"] == 8 and served_in < 10, (served_in, err)
    assert err.count("worker survivor: Redis failed") == 1 and "worker survivor: Redis answers again" in err, err


@needs_redis
@pytest.mark.model
@pytest.mark.timeout(600)
def test_the_shared_scale_benchmark_runs_quick(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(bench.SCRIPTS / "shared_scale.py"), "--quick"], capture_output=True,
                          text=True, timeout=540, env={**os.environ, "STREAMLAB_BENCH_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / "shared_scale.json").read_text())
    figures = {m["key"]: m for m in saved["measures"]}
    assert figures["every_reader_ended"]["value"] == 1.0
    assert figures["log_1w_vs_serve_pieces_per_s_at_2"]["target"] == 0.8
    assert {row["setup"] for row in saved["tables"]["by setup and readers (medians of the rounds)"]} == {
        "serve", "log_1w", "log_2w"}


@needs_redis
def test_a_stalled_worker_that_wakes_after_its_job_was_taken_over_writes_nothing() -> None:
    """The append is guarded (a script: the owner's, while the job runs), so a worker that stalled past
    --claim-idle and wakes after the heir took its job appends no piece twice, claims nothing back, ends nothing."""
    from streamlab.lab.outside.redis_server import run_redis
    from streamlab.model.lifecycle import Piece
    from streamlab.server.resources.worker import Worker

    async def scenario(url: str) -> None:
        redis = shared_log.open_client(url)
        try:
            await shared_log.ensure_group(redis)
            gid, meta = "stalled-job", shared_log.meta_key("stalled-job")
            await redis.hset(meta, mapping={"request": "{}", "status": "running", "worker": "stalled", "readers": 1,
                                            "orphaned_ms": 0, "grace_ms": 30000, "tokens": 0})
            entry = await redis.xadd(shared_log.JOBS, {"generation": gid})
            await redis.xreadgroup(shared_log.GROUP, "stalled", {shared_log.JOBS: ">"}, count=1)
            stalled = Worker(None, redis, name="stalled")
            at, state, _ = await stalled.step(entry, gid, Piece("One", 0.0, 1), 1, ids=[11])
            assert at is not None and stalled.log.sha, "a Redis that runs scripts: the guarded step"
            assert state[:2] == ["running", "stalled"]
            # Past --claim-idle the heir claims the entry (XAUTOCLAIM) and names itself in the hash, then reads the
            # stream: one piece, kept. The stalled worker wakes with the next piece and a heartbeat due.
            await redis.xclaim(shared_log.JOBS, shared_log.GROUP, "heir", 0, [entry], justid=True)
            await redis.hset(meta, "worker", "heir")
            at, state, _ = await stalled.step(entry, gid, Piece(" two", 0.0, 2), 2, True, ids=[12])
            assert at is None and state[:2] == ["running", "heir"], "nothing appended: it reads it is not its job"
            assert not await stalled.finish(entry, gid, "end", stalled._ending("completed", 2))
            kept = [shared_log.decode_entry(fields) for _, fields in await redis.xrange(shared_log.events_key(gid))]
            assert kept == [("message", {"text": "One"}, 1)], "no piece twice, no end from the stalled worker"
            assert await redis.hmget(meta, ["status", "tokens"]) == ["running", "1"]
            owners = await redis.xpending_range(shared_log.JOBS, shared_log.GROUP, "-", "+", 10)
            assert [p["consumer"] for p in owners] == ["heir"], "its heartbeat did not claim the job back"
            # A Redis restarted forgets its scripts: the step loads it again and goes on (NOSCRIPT, once).
            await redis.script_flush()
            heir = Worker(None, redis, name="heir")
            heir.log.sha = stalled.log.sha
            at, state, _ = await heir.step(entry, gid, Piece(" two", 0.0, 2), 2, ids=[12])
            assert at is not None and state[1] == "heir"
            assert await heir.finish(entry, gid, "end", heir._ending("completed", 2))
            assert (await redis.xpending(shared_log.JOBS, shared_log.GROUP))["pending"] == 0
        finally:
            await redis.aclose()

    with run_redis() as redis_server:
        run(scenario(redis_server.url))
