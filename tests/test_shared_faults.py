"""The shared log when things go wrong, against the real redis-server: a queue, Redis killed, a replica killed.

What issue #31 asks of a replica with ``serve --events``, each asserted where it could fail:

- the shared queue behaves like the line in memory: a reader waiting for a worker gets its head at once,
  ``queued`` ``{"ahead": N}`` at every change and keep-alives; past ``--max-waiting`` a POST is 503;
- Redis killed: ``/health`` says so (503), new work is 503 with ``Retry-After`` in the error body, the replica
  stays up and serves again once Redis is back on its port; a reader resumes across a restart that kept the
  log, and is told when Redis came back without it; with the append-only file a restart loses nothing answered;
- a reader on a replica killed with SIGKILL stops counting once its lease runs out, and the grace period
  then stops the worker.

Every stream here is read with ``ResponseRecorder``, which knows whether the chunked body ended with its last
chunk: a stream cut off reads as ``whole`` False. Workers run in this process over the fake model (the
model's speed is not what is tested; ``--token-delay`` is the worker's ``ServerConfig.token_delay``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import threading
import time
from typing import Any

import pytest

from fakes import FakeLM
from inprocess import generation_done, serving

from streamlab.client import timed
from streamlab.client.tracing import ResponseRecorder, Trace
from streamlab.lab.experiments.redis_restart import restart_loss, restartable_redis
from streamlab.lab.outside.redis_server import find_redis, run_redis
from streamlab.lab.setups.replicas import start_replicas, worker_in_process
from streamlab.server.config import RETRY_AFTER, RETRY_MS, ServerConfig
from streamlab.server.resources.shared_log import (
    decode_entry, encode_entry, events_key, lease_seconds, live_readers, meta_key, open_client, redis_ms,
)
from streamlab.server.resources.worker import Worker
from streamlab.server.wire.formats import text_data

pytestmark = [pytest.mark.skipif(find_redis() is None and not os.environ.get("CI"), reason="no redis-server here"),
              pytest.mark.timeout(180)]

SCRIPT = "Queued, then served: every piece through one shared log. " * 4


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


class Read:
    """One reader's stream, read in a thread of its own: its trace, whether its body ended whole, when it began."""

    def __init__(self, port: int, path: str, *, last_event_id: str | None = None, timeout: float = 60.0) -> None:
        self.trace = Trace(way="events")
        self.whole = False
        self.error: BaseException | None = None
        self.began = time.perf_counter()
        self.thread = threading.Thread(target=self._read, args=(port, path, last_event_id, timeout), daemon=True)
        self.thread.start()

    def _read(self, port: int, path: str, last_event_id: str | None, timeout: float) -> None:
        try:
            self.whole = asyncio.run(self._stream(port, path, last_event_id, timeout))
        except BaseException as err:  # noqa: BLE001 - what the test reports
            self.error = err

    async def _stream(self, port: int, path: str, last_event_id: str | None, timeout: float) -> bool:
        reading = ResponseRecorder(self.trace, "GET", last_event_id=last_event_id)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\nConnection: close\r\n"
            if last_event_id:
                head += f"Last-Event-ID: {last_event_id}\r\n"
            self.trace.sent = time.perf_counter()
            writer.write((head + "\r\n").encode("latin-1"))
            deadline = time.monotonic() + timeout
            while not reading.done:
                data = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - time.monotonic()))
                if not data:
                    reading.eof()
                    break
                reading.feed(data, self.trace.got_bytes(len(data)))
        finally:
            writer.close()
        return reading.done

    def join(self, timeout: float = 60.0) -> "Read":
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the stream did not end"
        assert self.error is None, self.error
        return self

    def kinds(self, kind: str) -> list[Any]:
        return [e for e in self.trace.events if e.kind == kind]

    def places(self) -> list[int]:
        return [e.data["ahead"] for e in self.kinds("queued")]

    def until(self, test: Any, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not test(self):
            assert time.monotonic() < deadline, f"not seen within {timeout} s: {self.trace.events}"
            time.sleep(0.02)


def post(port: int, body: dict | None = None) -> timed.Reply:
    return run(timed.fetch(port, "POST", "/generations", body=body or {"prompt": "hi", "max_tokens": 20}))


def assert_busy(reply: timed.Reply, *words: str) -> None:
    """503, ``Retry-After``, and the server's JSON error body: a limit or an outage, never a 500."""
    assert reply.status == 503, (reply.status, reply.body)
    assert reply.headers.get("retry-after") == str(RETRY_AFTER), reply.headers
    body = reply.json()
    assert set(body) == {"error"} and body["error"]["status"] == 503, body
    assert all(word in body["error"]["message"] for word in words), body


def slow_worker(url: str, token_delay: float) -> Any:
    """One worker over the fake model, slowed as ``worker --token-delay S`` slows the real one, one job at a time."""
    options: dict[str, Any] = {"config": ServerConfig(token_delay=token_delay)}  # the worker's command's config
    if "max_active" in inspect.signature(Worker).parameters:  # a batched worker takes several jobs: one here
        options["max_active"] = 1
    return worker_in_process(FakeLM(SCRIPT), url, **options)


# -- the shared queue, like the line in memory --------------------------------------------------


def test_eight_readers_queued_behind_one_slow_worker_keep_their_streams_and_are_told_their_places() -> None:
    """The issue's report: a reader queued for more than 5 s was cut off with no byte of body (the default
    ping interval, 15 s, is longer than redis-py's default read timeout, 5 s). Eight readers, one worker at
    about 1 s a job: the last ones wait 6-7 s, with nothing generated for them meanwhile."""
    with run_redis() as redis, serving(events=redis.url) as replica:
        created = [run(timed.create_generation(replica.port, {"prompt": "hi", "max_tokens": 20}))
                   for _ in range(8)]
        readers = [Read(replica.port, c["events"]) for c in created]
        for reader in readers:
            reader.until(lambda r: r.places())  # every one connected and placed before any job is taken
        with slow_worker(redis.url, 0.05):
            for reader in readers:
                reader.join(60)
    waited = []
    for i, reader in enumerate(readers):
        trace = reader.trace
        assert trace.status == 200 and reader.whole, f"reader {i} was cut off: {trace.events}"
        assert trace.first_byte is not None and trace.first_byte < 1.0, "the head goes out at once, in line or not"
        end = next(e.data for e in trace.events if e.kind == "end")
        assert end["stop_reason"] == "max_tokens" and end["tokens"] == 20 and trace.text == SCRIPT[:20]
        assert reader.places() == list(range(i, -1, -1)), f"reader {i}: every place, at every change"
        assert trace.retry == RETRY_MS, "the first event, its place, carries retry: as in memory"
        first_text = trace.text_events[0].t
        assert all(e.t <= first_text for e in reader.kinds("queued")), "places come before the answer"
        waited.append(first_text)
    assert sum(w > 5.0 for w in waited) >= 2, f"the readers' waits: {waited}: none tested the 5 s cut"


def test_readers_waiting_for_a_worker_get_keep_alives_every_ping_interval() -> None:
    ping = 0.5
    with run_redis() as redis, serving(events=redis.url, ping_interval=ping) as replica:
        created = [run(timed.create_generation(replica.port, {"prompt": "hi", "max_tokens": 30}))
                   for _ in range(3)]
        readers = [Read(replica.port, c["events"]) for c in created]
        for reader in readers:
            reader.until(lambda r: r.places())
        time.sleep(1.2)  # nobody moves: only keep-alives can be sent meanwhile
        with slow_worker(redis.url, 0.05):
            for reader in readers:
                reader.join(60)
    last = readers[-1]
    first_text = last.trace.text_events[0].t
    waiting = [e.t for e in last.trace.events if e.kind in ("queued", "ping") and e.t < first_text]
    gaps = [b - a for a, b in zip([last.trace.first_byte, *waiting], waiting)]
    assert first_text > 3.0 and len(last.kinds("ping")) >= 4, last.trace.events
    # The replica sends a keep-alive once a ping interval passed with nothing sent: 0.4 s of tolerance is
    # for a loaded machine's scheduling (two cores running Redis, the replica, the worker and this reader).
    assert max(gaps) <= ping + 0.4, gaps
    assert last.places() == [2, 1, 0] and last.whole


def test_past_max_waiting_a_new_generation_is_refused_with_retry_after() -> None:
    with run_redis() as redis, serving(events=redis.url, max_waiting=2) as replica:
        first, second = post(replica.port), post(replica.port)
        assert (first.status, second.status) == (201, 201)
        assert_busy(post(replica.port), "the shared queue is full", "2 jobs waiting for a worker", "--max-waiting 2")
        cancelled = run(timed.cancel_generation(replica.port, first.json()["id"]))
        assert cancelled["status"] == "done"
        assert post(replica.port).status == 201, "a job cancelled in line leaves the queue"
        with slow_worker(redis.url, 0.0):
            generation_done(replica.port, second.json()["id"])
        assert post(replica.port).status == 201


# -- Redis killed, and back ---------------------------------------------------------------------


def test_while_redis_is_down_the_replica_says_so_refuses_new_work_with_503_and_serves_again_once_it_is_back() -> None:
    with restartable_redis(appendonly=False) as redis:
        [replica] = start_replicas(1, events=redis.url)
        try:
            port = replica.port
            known = post(port).json()["id"]
            health = run(timed.fetch(port, "GET", "/health"))
            assert health.status == 200 and health.json()["redis"] == {"ok": True} and health.json()["ok"]

            redis.kill()
            health = run(timed.fetch(port, "GET", "/health"))
            assert health.status == 503 and health.json()["ok"] is False
            # The cause, in redis-py's words: the pooled connection "closed by server", then "refused".
            assert health.json()["redis"]["ok"] is False and "connection" in health.json()["redis"]["error"].lower()
            assert_busy(post(port), "the shared log (Redis) does not answer", "a new generation")
            assert_busy(run(timed.fetch(port, "GET", f"/generations/{known}")), "does not answer")
            assert_busy(run(timed.fetch(port, "POST", f"/generations/{known}/cancel", body={})), "a cancel")
            assert_busy(run(timed.fetch(port, "GET", f"/generations/{known}/events")), "does not answer")
            time.sleep(1.0)
            assert replica.process.poll() is None, "the replica exits on a lost connection"

            redis.start()  # the same port, nothing kept: no generation, no queue, no group
            back = time.monotonic()
            while (reply := post(port)).status != 201:
                assert time.monotonic() - back < 10.0, (reply.status, reply.body)
                time.sleep(0.1)
            assert run(timed.fetch(port, "GET", "/health")).status == 200
            fresh = reply.json()
            with slow_worker(redis.url, 0.0):
                state = generation_done(port, fresh["id"])
            assert state["text"] == SCRIPT[:20] and state["stop_reason"] == "max_tokens"
            assert replica.process.poll() is None
        finally:
            replica.stop()


def test_once_redis_answers_again_the_replica_serves_the_first_request_on_every_pooled_connection() -> None:
    """Connections pooled before a restart were closed by it: a command on one is sent again on a new one, not a 503."""
    with restartable_redis(appendonly=True) as redis, serving(events=redis.url) as replica:
        known = run(timed.create_generation(replica.port, {"prompt": "hi"}))["id"]

        async def at_once(n: int) -> list:  # n requests in flight together: n connections taken from the pool
            return await asyncio.gather(*(timed.fetch(replica.port, "GET", f"/generations/{known}") for _ in range(n)))

        assert [r.status for r in run(at_once(4))] == [200] * 4
        redis.kill()
        redis.start()  # the same port and file: the generation is still there
        replies = [*run(at_once(4)), post(replica.port), run(timed.fetch(replica.port, "GET", "/health"))]
    assert [r.status for r in replies] == [200] * 4 + [201, 200], [(r.status, r.body[:120]) for r in replies]


async def _append(url: str, generation_id: str, *texts: str, end: bool = False, status: str = "running") -> None:
    """What a worker writes: its pieces, then its end (the test stands in for the worker, to time the kill)."""
    redis = open_client(url)
    try:
        await redis.hset(meta_key(generation_id), mapping={"status": status, "worker": "the-test"})
        for text in texts:
            await redis.xadd(events_key(generation_id), encode_entry("message", text_data(text)))
        if end:
            data = {"stop_reason": "completed", "tokens": 5, "incomplete": False}
            await redis.xadd(events_key(generation_id), encode_entry("end", data))
            await redis.hset(meta_key(generation_id), "status", "done")
    finally:
        await redis.aclose()


def test_a_reader_resumes_where_it_was_across_a_redis_restart_that_kept_the_log() -> None:
    with restartable_redis(appendonly=True) as redis, serving(events=redis.url, ping_interval=0.5) as replica:
        created = run(timed.create_generation(replica.port, {"prompt": "hi"}))
        run(_append(redis.url, created["id"], "one ", "two ", "three "))
        reader = Read(replica.port, created["events"])
        reader.until(lambda r: len(r.trace.text_events) == 3)
        redis.kill()
        time.sleep(0.5)  # down for half a second, a reader waiting meanwhile
        redis.start()
        run(_append(redis.url, created["id"], "four ", "five", end=True))
        reader.join(30)
    trace = reader.trace
    assert reader.whole and not reader.kinds("error"), trace.events
    assert trace.text == "one two three four five"
    ids = [e.id for e in trace.text_events]
    assert len(set(ids)) == 5 and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert next(e.data for e in trace.events if e.kind == "end")["stop_reason"] == "completed"


def test_a_reader_is_told_when_redis_comes_back_without_its_log() -> None:
    with restartable_redis(appendonly=False) as redis, serving(events=redis.url, ping_interval=0.5) as replica:
        created = run(timed.create_generation(replica.port, {"prompt": "hi"}))
        run(_append(redis.url, created["id"], "said before the restart"))
        reader = Read(replica.port, created["events"])
        reader.until(lambda r: r.trace.text_events)
        killed = time.perf_counter()
        redis.kill()
        redis.start()
        reader.join(30)
    [error] = reader.kinds("error")
    assert reader.whole, "an error event, then the body's last chunk"
    assert error.data["error"]["status"] == 503 and "lost generation" in error.data["error"]["message"]
    assert error.data["id"] == created["id"]
    assert reader.trace.sent + error.t - killed < 5.0


def test_with_the_append_only_file_a_redis_killed_with_sigkill_loses_at_most_a_second_of_events() -> None:
    kept = restart_loss(events=200, rate=100.0, appendonly=True)
    # appendfsync everysec: Redis writes each command to the file before it answers, and fsyncs once a
    # second; a killed process loses none of what it answered, a machine that loses power up to ~1 s.
    assert kept["events"] == 200 and kept["lost_s"] <= 1.0, kept
    assert kept["lost"] == 0, kept
    gone = restart_loss(events=50, rate=100.0, appendonly=False)
    assert gone["kept"] == 0 and gone["lost"] == 50, "without the file a restart comes back empty"


# -- reader leases -------------------------------------------------------------------------------


async def _hash(url: str, generation_id: str) -> dict[str, Any]:
    redis = open_client(url)
    try:
        state = await redis.hgetall(meta_key(generation_id))
        now = await redis_ms(redis)
        return {**state, "live": await live_readers(redis, generation_id, now), "now_ms": now}
    finally:
        await redis.aclose()


def test_a_reader_on_a_replica_killed_with_sigkill_stops_counting_within_its_lease_and_the_grace_then_stops_the_job() -> None:
    grace = 1.0
    lease = lease_seconds(grace)
    assert lease == 1.0
    with run_redis() as redis, serving(events=redis.url, grace=grace) as survivor, \
            worker_in_process(FakeLM(SCRIPT, decode_seconds=0.02), redis.url):
        [doomed] = start_replicas(1, events=redis.url, grace=grace)
        try:
            body = {"prompt": "hi", "max_tokens": 2000, "ignore_eos": True}  # 40 s at 0.02 s a token
            created = run(timed.create_generation(survivor.port, body))
            reader = Read(doomed.port, created["events"])
            reader.until(lambda r: len(r.trace.text_events) >= 5)
            assert run(_hash(redis.url, created["id"]))["readers"] == "1"
            killed = time.monotonic()
            os.kill(doomed.process.pid, signal.SIGKILL)
            doomed.process.wait(10)
            while (state := run(_hash(redis.url, created["id"])))["readers"] != "0":
                # Its lease (1 s) runs out at most 1 s after its last renewal; the survivor's sweep, every
                # third of a lease, counts it out; 1 s more for a loaded machine.
                assert time.monotonic() - killed < lease + lease / 3 + 1.0, state
                time.sleep(0.05)
            assert state["live"] == 0
            stopped = generation_done(survivor.port, created["id"], timeout=15)
            took = time.monotonic() - killed
            end = run(_last_entry(redis.url, created["id"]))
        finally:
            doomed.stop()
        reader.thread.join(10)  # its replica is gone: its stream ended with the connection
    assert stopped["stop_reason"] == "client_left" and stopped["tokens"] < 2000, stopped
    assert end["stop_signal"] == "grace_expired", end
    # Counted out within lease + a sweep, then the grace period, then the worker's next piece: 1.5 s of slack.
    assert took < lease + lease / 3 + grace + 1.5, took


async def _last_entry(url: str, generation_id: str) -> dict:
    redis = open_client(url)
    try:
        [(_, fields)] = await redis.xrevrange(events_key(generation_id), count=1)
        return decode_entry(fields)[1]
    finally:
        await redis.aclose()
