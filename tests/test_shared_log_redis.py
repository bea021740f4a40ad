"""The shared log against the real redis-server: replicas in this process, a worker process with the real model.

tests/test_shared_log.py covers the behaviour over fakeredis in milliseconds; this checks the same
commands against Debian's redis-server (the stream ids, XREADGROUP, XAUTOCLAIM and the clock the
worker's counts rely on), with a worker that is a real process killed with SIGKILL, and runs the
shared-log benchmark at its tiny size. Skipped where redis-server is not installed (CI installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from fakes import FakeLM
from inprocess import generation_done, serving

from streamlab.book import bench
from streamlab.client import timed
from streamlab.client.tracing import last_id
from streamlab.lab.outside.redis_server import find_redis, run_redis
from streamlab.lab.setups.replicas import start_worker, worker_in_process

pytestmark = [pytest.mark.skipif(find_redis() is None and not os.environ.get("CI"), reason="no redis-server here")]


def run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


@pytest.mark.model
def test_a_worker_process_killed_mid_answer_is_continued_and_a_reader_moves_replicas() -> None:
    with run_redis() as redis, serving(events=redis.url) as a, serving(events=redis.url) as b:
        worker = start_worker(redis.url, "--name", "real", "--claim-idle", "0.5")
        heir = None
        try:
            body = {"prompt": "Count slowly from one to fifty.", "max_tokens": 60, "ignore_eos": True, "seed": 3}
            created = run(timed.create_generation(a.port, body))
            first = run(timed.events(a.port, created["events"], stop_after=6))
            assert re.fullmatch(r"[0-9]+-[0-9]+", last_id(first) or "")
            assert first.headers.get("x-served-by") == a.url
            os.kill(worker.process.pid, signal.SIGKILL)
            worker.process.wait(10)
            heir = start_worker(redis.url, "--name", "heir", "--claim-idle", "0.5")  # the same model, loaded again
            rest = run(timed.events(b.port, created["events"], last_event_id=last_id(first)))
            state = generation_done(b.port, created["id"], timeout=30.0)
        finally:
            worker.stop()
            if heir is not None:
                heir.stop()
        end = next(e.data for e in rest.events if e.kind == "end")
        assert end["stop_reason"] == "max_tokens" and end["continued_from"] == "real" and end["worker"] == "heir"
        assert 6 <= end["kept_tokens"] < 60 and end["tokens"] == 60  # what the killed worker wrote, then the rest
        got = "".join(e.text for e in [*first.text_events, *rest.text_events])
        assert got == state["text"]
        ids = [e.id for e in [*first.text_events, *rest.text_events]]
        assert len(ids) == len(set(ids))


def test_a_cancel_on_one_replica_stops_a_worker_elsewhere_within_two_tokens_on_real_redis() -> None:
    script = "Every piece goes through Redis on its way to the reader. " * 6
    with run_redis() as redis, serving(events=redis.url) as a, serving(events=redis.url) as b, \
            worker_in_process(FakeLM(script, decode_seconds=0.02), redis.url) as w:
        created = run(timed.create_generation(a.port, {"prompt": "hi", "max_tokens": 300, "ignore_eos": True}))
        first = run(timed.events(a.port, created["events"], stop_after=10))
        assert run(timed.cancel_generation(b.port, created["id"]))["status"] == "done"
        rest = run(timed.events(a.port, created["events"], last_event_id=last_id(first)))
        end = next(e.data for e in rest.events if e.kind == "end")
        assert end["stop_reason"] == "stopped" and end["worker"] == w.name
        assert end["tokens"] - end["tokens_at_stop"] <= 2, end
        assert 10 <= end["tokens_at_stop"] < 300


def test_the_shared_log_benchmark_runs_at_its_tiny_size(tmp_path) -> None:
    done = subprocess.run([sys.executable, str(bench.SCRIPTS / "shared_log.py"), "--tiny"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "STREAMLAB_BENCH_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / "shared_log.json").read_text())
    figures = {m["key"]: m["value"] for m in saved["measures"]}
    assert 2.0 <= figures["round_trips_per_event"] < 2.3  # the worker's one, and the reader's XREAD
    assert figures["cpu_redis_over_memory"] > 1 and len(saved["tables"]["rounds"]) == 2


def test_a_reader_whose_log_goes_away_is_told_and_its_body_ends_properly() -> None:
    """Redis killed while a reader waits on the shared queue: an ``error`` event saying why, then the last chunk.

    httpx raises on a chunked body that stops without its last chunk ("incomplete chunked read"): reading the
    stream to its end without an exception is the proof that the body ended as HTTP says a body ends.
    """
    import threading
    import time

    import httpx

    with run_redis() as redis, serving(events=redis.url) as a:
        created = run(timed.create_generation(a.port, {"prompt": "hi", "max_tokens": 5}))  # no worker: it waits
        lines: list[str] = []
        outcome: dict[str, object] = {}

        def read() -> None:
            try:
                with httpx.stream("GET", f"{a.url}{created['events']}", timeout=30) as response:
                    for line in response.iter_lines():
                        lines.append(line)
                outcome["ended"] = time.monotonic()
            except Exception as err:  # noqa: BLE001 - what the test reports
                outcome["error"] = err

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(1.0)
        killed = time.monotonic()
        redis.process.kill()
        reader.join(30)
    assert "error" not in outcome, outcome
    assert outcome["ended"] - killed < 5, outcome["ended"] - killed
    assert "event: error" in lines and any("the shared log cannot be read" in line for line in lines), lines
