"""/generations in a shared log (serve --events): replicas and workers in this process, over a fake Redis.

fakeredis stands in for redis-server (tests/test_shared_log_redis.py runs the real one, with worker
processes): two in-process replicas share one fake Redis, and an in-process worker generates with the
fake model. What is asserted is what chapter 13 claims: a reader resumes on another replica with nothing
lost or repeated, a cancel or a departed reader stops a worker elsewhere within two tokens, a worker that
dies mid-answer leaves its job to another, which continues it: one answer, no token twice.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

fakeredis = pytest.importorskip("fakeredis")

from fakes import FakeLM  # noqa: E402
from inprocess import generation_done, serving  # noqa: E402

from streamlab import cli  # noqa: E402
from streamlab.client import timed  # noqa: E402
from streamlab.client import tracing  # noqa: E402
from streamlab.client.tracing import last_id  # noqa: E402
from streamlab.lab.setups import replicas  # noqa: E402
from streamlab.server.resources import shared_log, worker  # noqa: E402
from streamlab.server.store import shared as shared_store  # noqa: E402

URL = "redis://fake"
SCRIPT = "One answer, many servers: every piece in one shared log. " * 4


@pytest.fixture
def fake_redis(monkeypatch: pytest.MonkeyPatch) -> object:
    server = fakeredis.FakeServer()

    def open_client(url: str, longest_block: float = 0) -> object:
        return fakeredis.FakeAsyncRedis(server=server, decode_responses=True)

    for module in (shared_log, worker, replicas):
        monkeypatch.setattr(module, "open_client", open_client)
    # The conversations in the same fake Redis, through redis-py's synchronous client (store/shared.py).
    monkeypatch.setattr(shared_store, "open_store_client",
                        lambda url: fakeredis.FakeRedis(server=server, decode_responses=True))
    return server


def run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def text_of(*traces: tracing.Trace) -> str:
    return "".join(e.text for trace in traces for e in trace.text_events)


def ending(trace: tracing.Trace) -> dict:
    return next(e.data for e in trace.events if e.kind == "end")


def test_a_reconnect_to_another_replica_resumes_where_it_left(fake_redis: object) -> None:
    lm = FakeLM(SCRIPT, decode_seconds=0.005)
    with serving(events=URL) as a, serving(events=URL) as b, replicas.worker_in_process(lm, URL):
        created = run(timed.create_generation(a.port, {"prompt": "hi", "max_tokens": 60}))
        first = run(timed.events(a.port, created["events"], stop_after=7))
        assert re.fullmatch(r"[0-9]+-[0-9]+", last_id(first) or ""), "the stream entry id is the SSE id"
        second = run(timed.events(b.port, created["events"], last_event_id=last_id(first)))
        whole = generation_done(b.port, created["id"])
        assert second.complete and len(first.text_events) == 7
        assert text_of(first, second) == whole["text"] == SCRIPT[:60]
        assert whole["stop_reason"] == "max_tokens" and whole["tokens"] == 60
        again = run(timed.events(a.port, created["events"], last_event_id=last_id(second)))
        assert again.status == 204, "a reader that has the end is told there is nothing more, on any replica"


def test_a_cancel_sent_to_one_replica_stops_the_worker_within_two_tokens(fake_redis: object) -> None:
    lm = FakeLM(SCRIPT, decode_seconds=0.02)
    with serving(events=URL) as a, serving(events=URL) as b, replicas.worker_in_process(lm, URL) as w:
        created = run(timed.create_generation(a.port, {"prompt": "hi", "max_tokens": 200, "ignore_eos": True}))

        async def read_and_cancel() -> tracing.Trace:
            reading = asyncio.ensure_future(timed.events(a.port, created["events"]))
            while run_tokens(await timed.get_json(b.port, f"/generations/{created['id']}")) < 10:
                await asyncio.sleep(0.02)
            answer = await timed.cancel_generation(b.port, created["id"])
            assert answer["status"] == "done"
            return await reading

        trace = run(read_and_cancel())
        end = ending(trace)
        assert end["stop_reason"] == "stopped" and end["stop_signal"] == "cancel" and end["worker"] == w.name
        assert 10 <= end["tokens_at_stop"] < 200
        assert end["tokens"] - end["tokens_at_stop"] <= 2, end


def run_tokens(state: dict) -> int:
    return int(state["tokens"])


def test_a_reader_who_leaves_stops_the_worker_after_the_grace_period(fake_redis: object) -> None:
    lm = FakeLM(SCRIPT, decode_seconds=0.02)
    with serving(events=URL, grace=0.2) as a, replicas.worker_in_process(lm, URL):
        created = run(timed.create_generation(a.port, {"prompt": "hi", "max_tokens": 200, "ignore_eos": True}))
        first = run(timed.events(a.port, created["events"], stop_after=5))
        state = generation_done(a.port, created["id"])
        assert state["stored_reason"] == "client_left" and first.left
        entries = run(_entries(created["id"]))
        end = entries[-1]
        assert end["stop_signal"] == "grace_expired" and end["tokens"] < 200
        assert end["tokens"] - end["tokens_at_stop"] <= 2, end


async def _entries(generation_id: str) -> list[dict]:
    redis = shared_log.open_client(URL)
    try:
        rows = await redis.xrange(shared_log.events_key(generation_id))
        return [shared_log.decode_entry(fields)[1] for _, fields in rows]
    finally:
        await redis.aclose()


def test_a_worker_that_dies_mid_answer_leaves_its_job_to_another_which_continues_it(fake_redis: object) -> None:
    lm = FakeLM(SCRIPT, decode_seconds=0.02)
    with serving(events=URL) as a:
        first_worker = replicas.InProcessWorker(lm, URL, name="first", claim_idle=0.3)
        created = run(timed.create_generation(a.port, {"prompt": "hi", "max_tokens": 200, "ignore_eos": True}))
        before = run(timed.events(a.port, created["events"], stop_after=8))
        first_worker.crash()  # acknowledges nothing, ends nothing
        with replicas.worker_in_process(lm, URL, name="second", claim_idle=0.3) as second_worker:
            after = run(timed.events(a.port, created["events"], last_event_id=last_id(before)))
            state = generation_done(a.port, created["id"])
        assert second_worker.worker.done == [created["id"]]
        end = ending(after)
        assert end["stop_reason"] == "max_tokens" and end["continued_from"] == "first"
        assert end["worker"] == end["continued_by"] == "second" and 8 <= end["kept_tokens"] < 200
        # One answer: every piece the first worker appended, then the rest after them, nothing made twice.
        assert state["text"] == text_of(before, after) == SCRIPT[:200] and end["tokens"] == 200


def test_a_job_no_worker_took_yet_is_cancelled_by_the_replica_and_skipped_by_workers(fake_redis: object) -> None:
    lm = FakeLM(SCRIPT)
    with serving(events=URL) as a:
        created = run(timed.create_generation(a.port, {"prompt": "hi", "max_tokens": 20}))
        assert run(timed.cancel_generation(a.port, created["id"]))["status"] == "done"
        with replicas.worker_in_process(lm, URL) as w:
            trace = run(timed.events(a.port, created["events"]))
            time.sleep(0.3)
            assert w.worker.done == []
        end = ending(trace)
        assert end["stop_reason"] == "stopped" and end["tokens"] == 0 and end["left_queue"] is True


def test_what_the_shared_log_refuses_and_does_not_know(fake_redis: object) -> None:
    with serving(events=URL) as a:
        with pytest.raises(timed.ClientError) as refused:
            run(timed.create_generation(a.port, {"prompt": "hi", "conversation_id": "abc"}))
        assert refused.value.status == 404 and "no conversation 'abc'" in str(refused.value)
        with pytest.raises(timed.ClientError) as missing:
            run(timed.get_json(a.port, "/generations/nothing-here"))
        assert missing.value.status == 404


@pytest.mark.parametrize("argv, says", [
    (["worker"], "worker needs --redis URL"),
    (["worker", "--redis", "localhost:6379"], "give a Redis URL"),
    (["worker", "--redis", "redis://127.0.0.1:1", "--claim-idle", "0"], "--claim-idle must be positive"),
    (["serve", "--events", "localhost:6379"], "--events takes a Redis URL"),
])
def test_command_line_mistakes_are_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_worker_help_names_its_flags(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["worker", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in ("--redis URL", "--claim-idle S", "--model MODEL"))


def test_the_kill_chart_can_be_read_at_the_notebooks_width() -> None:
    from test_plots import drawn, outside, overlaps

    from streamlab.book import style
    from streamlab.book.replica_plots import received_through_a_kill

    resumed = [(0.1 * i, i, 0) for i in range(1, 13)] + [(2.4 + 0.05 * i, 12 + i, 1) for i in range(1, 29)]
    lost = [(0.03 * i, i, 0) for i in range(1, 13)]
    fig = drawn(lambda: received_through_a_kill({"shared log": resumed, "in memory": lost},
                                                killed_at={"shared log": 1.25, "in memory": 0.37}, answer_events=40,
                                                notes={"in memory": "then 404: the rest lost"}))
    ax = fig.axes[0]
    assert fig.get_figwidth() <= style.NOTEBOOK_WIDTH + 1e-9 and overlaps(fig) == [] and outside(fig) == []
    notes = [t.get_text() for t in ax.texts]
    assert "reconnected: +1.20 s" in notes and "then 404: the rest lost" in notes
    assert len(ax.get_lines()) >= 4 and ax.get_xlabel() and ax.get_ylabel()  # two readers, two kills, the answer


def test_a_redis_client_waits_longer_than_the_longest_block_it_sends() -> None:
    """redis-py 8 reads with a 5 s timeout: a reader's XREAD BLOCK of a 15 s ping interval died at 5 s of silence."""
    def timeout(client: object) -> object:
        return client.connection_pool.connection_kwargs["socket_timeout"]

    assert timeout(shared_log.open_client(URL, 15.0)) == 15.0 + shared_log.ANSWER_MARGIN
    assert timeout(shared_log.open_client(URL)) == shared_log.CANCEL_WAIT + shared_log.ANSWER_MARGIN
    assert timeout(shared_log.open_client(URL, 0)) is None, "XREAD BLOCK 0 waits for ever: so does its read"



def test_a_reader_waiting_for_a_worker_is_told_its_place_at_every_change(fake_redis: object) -> None:
    """The shared queue words it as the line in memory: ``queued`` ``{"ahead": N}``, unnumbered, then the pieces."""
    with serving(events=URL, ping_interval=0.3) as a:
        created = [run(timed.create_generation(a.port, {"prompt": "hi", "max_tokens": 12})) for _ in range(3)]

        async def read_while_the_line_moves() -> tuple[tracing.Trace, asyncio.Future]:
            trace = tracing.Trace(way="events")
            reading = asyncio.ensure_future(timed.events(a.port, created[2]["events"], trace=trace))
            for cancelled, ahead in ((0, 2), (1, 1)):
                while not any(e.kind == "queued" and e.data == {"ahead": ahead} for e in trace.events):
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.4)  # a ping interval with nothing new: a keep-alive
                await timed.cancel_generation(a.port, created[cancelled]["id"])
            while not any(e.kind == "queued" and e.data == {"ahead": 0} for e in trace.events):
                await asyncio.sleep(0.02)
            return trace, reading

        trace, reading = run(_with_worker_after(read_while_the_line_moves))
        places = [e.data["ahead"] for e in trace.events if e.kind == "queued"]
        assert places == [2, 1, 0], trace.events
        assert all(e.id is None for e in trace.events if e.kind == "queued"), "a place is not part of the answer"
        kinds = [e.kind for e in trace.events]
        assert kinds.index("ping") < kinds.index("text") and kinds[-1] == "end", kinds
        assert trace.text == SCRIPT[:12]


async def _with_worker_after(reading_while: Any) -> tuple[tracing.Trace, asyncio.Future]:
    """Read while the line moves, then a worker comes and serves what is left."""
    trace, reading = await reading_while()
    with replicas.worker_in_process(FakeLM(SCRIPT), URL):
        await reading
    return trace, reading


def test_a_cancelled_job_leaves_the_shared_queue_and_the_bound_counts_only_those_waiting(fake_redis: object) -> None:
    with serving(events=URL, max_waiting=1) as a:
        first = run(timed.create_generation(a.port, {"prompt": "hi"}))
        reply = run(timed.fetch(a.port, "POST", "/generations", body={"prompt": "hi"}))
        assert reply.status == 503 and reply.headers.get("retry-after") == "1"
        assert reply.json() == {"error": {"status": 503, "message": "the shared queue is full (1 job waiting for a"
                                          " worker, --max-waiting 1)"}}
        run(timed.cancel_generation(a.port, first["id"]))
        assert run(timed.fetch(a.port, "POST", "/generations", body={"prompt": "hi"})).status == 201


def test_readers_are_counted_by_leases_that_a_live_replica_renews_and_a_dead_one_lets_run_out(fake_redis: object) -> None:
    """Two replicas' registries on one Redis; one stops renewing (what ``kill -9`` does): its reader runs out."""
    from streamlab.server.answers.requests import GenerationRequest
    from streamlab.server.config import ServerConfig

    async def scenario() -> None:
        config = ServerConfig(grace=1.0)  # a lease of 1 s: renewed every third of it
        a = shared_log.SharedRegistry(shared_log.open_client(URL), config, store=shared_store.SharedStore.open(URL))
        b = shared_log.SharedRegistry(shared_log.open_client(URL), config)
        created, _ = await a.created(GenerationRequest(prompt="hi"))
        gid, redis = created["id"], a.redis

        async def state() -> tuple[int, int, int]:
            now = await shared_log.redis_ms(redis)
            fields = await redis.hmget(shared_log.meta_key(gid), ["readers", "orphaned_ms"])
            return int(fields[0]), int(fields[1]), await shared_log.live_readers(redis, gid, now)

        created_at = (await state())[1]
        mine = await a.leases.join(gid)
        theirs = await b.leases.join(gid)
        assert (await state())[0::2] == (2, 2)
        await a.leases.leave(gid, mine)
        assert await state() == (1, created_at, 1), "one reader left, one reads: not orphaned"
        for _ in range(4):  # 1.2 s: past b's first lease, renewed every 0.3 s, and swept by a each time
            await asyncio.sleep(0.3)
            await b.leases.renew()
            await a.leases.renew()
        assert await state() == (1, created_at, 1), "a renewed lease outlives its first term"
        last_renewal = await shared_log.redis_ms(redis)
        await asyncio.sleep(1.1)  # b renews no more: its replica is dead
        await a.leases.renew()
        readers, orphaned, live = await state()
        assert (readers, live) == (0, 0)
        assert last_renewal <= orphaned <= last_renewal + 1000 + 50, "the grace period counts from the lease's end"
        assert theirs in b.leases.held  # b never said goodbye
        for registry in (a, b):
            await registry.shutdown()

    run(scenario())
