"""Backpressure: the bound on pieces ahead of the reader, the slow-reader stop, and the experiment at its tiny size.

Everything here runs over the fake model, in process: a generation that waits
for its reader (and resumes), one stopped for a reader too slow (the stop in
``/log``, the store and each format's ending), the relay obeying the same
bound, ``stop()`` waking a blocked hand-over, ``has_room()`` for an engine that
steps many answers, and ``benchmarks/backpressure.py --tiny``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import time
from types import SimpleNamespace

import pytest

from streamlab.net.errors import UserError
from fakes import FakeLM
from inprocess import serving
from streamlab.client import timed as client
from streamlab.client import wire
from streamlab.model.backlog import Backlog
from streamlab.lab.results.measures import parse_line
from streamlab.model.generation import Generation, PieceQueue, PieceStream
from streamlab.model.lifecycle import GenerationResult, Piece
from streamlab.server.wire.anthropic_api import MessagesFormat
from streamlab.server.config import MAX_QUEUED, SLOW_READER_TIMEOUT, config_from_args, parse_args
from streamlab.server.wire.formats import StreamlabFormat
from streamlab.server.answers.answer import Job
from streamlab.server.answers.jobs import LogRecord
from streamlab.server.wire.openai_api import ChatCompletionFormat
from streamlab.server.answers.upstream import UpstreamGeneration
from streamlab.protocol.endings import INCOMPLETE_REASONS, MAX_TOKENS, SLOW_READER, STOP_REASONS, STOPPED, stop_reason_for
from streamlab.server.store.schema import CUT_OFF_WORDS
from streamlab.client.tracing import ResponseRecorder, Trace

pytestmark = pytest.mark.timeout(60)

SCRIPT = "The keeper wrote in his log every evening. "


def fake(decode_seconds: float = 0.001) -> FakeLM:
    return FakeLM(SCRIPT, decode_seconds=decode_seconds, context_length=8192)


def generation(lm: FakeLM, max_tokens: int = 400) -> Generation:
    return Generation(lm, "Tell me about the keeper.", max_tokens=max_tokens, ignore_eos=True)


async def until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        await asyncio.sleep(0.005)


# --------------------------------------------------------------------------
# The policy in one place: Backlog, PieceStream, Generation
# --------------------------------------------------------------------------


def test_a_bounded_generation_waits_for_its_reader_and_resumes_when_it_reads():
    async def main() -> None:
        gen = generation(fake()).set_backpressure(max_queued=5)
        pieces = gen.pieces()
        await anext(pieces)  # starts it; the reader took one piece
        await until(lambda: gen.backlog.wait_began is not None)
        assert gen.backlog.queued == 5 and gen.backlog.handed == 6
        held = gen.tokens
        await asyncio.sleep(0.2)
        assert gen.tokens == held, "a waiting generation makes no tokens"
        for _ in range(10):
            await anext(pieces)
        await until(lambda: gen.backlog.handed == 16 and gen.backlog.wait_began is not None)
        assert gen.tokens > held and gen.backlog.queued == 5
        assert gen.backlog.most_queued == 5 and gen.backlog.waits >= 2 and gen.backlog.waited > 0.15
        gen.stop()
        async for _ in pieces:
            pass
        assert (await gen.wait()).stop_reason == STOPPED

    asyncio.run(main())


def test_an_unbounded_generation_runs_on_however_far_behind_its_reader_is():
    async def main() -> None:
        gen = generation(fake(0.0), max_tokens=300)  # nobody reads a piece
        result = await asyncio.wait_for(gen.wait(), 10)
        assert result.stop_reason == MAX_TOKENS and result.tokens == 300
        assert gen.backlog.queued == gen.backlog.most_queued >= 250 and gen.backlog.waits == 0

    asyncio.run(main())


def test_a_generation_kept_waiting_too_long_stops_itself_as_slow_reader():
    async def main() -> None:
        gen = generation(fake()).set_backpressure(max_queued=3, slow_reader_timeout=0.3)
        started = time.monotonic()
        result = await asyncio.wait_for(gen.wait(), 10)  # nobody reads
        assert result.stop_reason == STOPPED and gen.stopped_by == SLOW_READER
        assert 0.3 <= time.monotonic() - started < 3
        assert gen.backlog.handed <= 5 and result.tokens < 10
        waited = gen.backlog.snapshot()["waited"]
        assert 0.3 <= waited < 1.0 and gen.backlog.wait_began is None
        await asyncio.sleep(0.2)
        assert gen.backlog.snapshot()["waited"] == waited  # stopped: no longer counted as waiting

    asyncio.run(main())


def test_stop_wakes_a_hand_over_blocked_for_room():
    async def main() -> None:
        gen = generation(fake()).set_backpressure(max_queued=2)  # no timeout: it would wait for ever
        gen.start()
        await until(lambda: gen.backlog.wait_began is not None)
        asked = time.monotonic()
        gen.stop("cancel")
        result = await asyncio.wait_for(gen.wait(), 5)
        assert time.monotonic() - asked < 0.5
        assert result.stop_reason == STOPPED and gen.stopped_by == "cancel"

    asyncio.run(main())


def test_a_reader_that_leaves_lifts_the_bound_so_a_naive_generation_runs_on_for_nobody():
    async def main() -> None:
        gen = generation(fake(0.0), max_tokens=200).set_backpressure(max_queued=2, slow_reader_timeout=5)
        pieces = gen.pieces()
        await anext(pieces)
        await pieces.aclose()  # the reader is gone; nobody stops the generation (as on a --naive server)
        result = await asyncio.wait_for(gen.wait(), 10)
        assert result.stop_reason == MAX_TOKENS and result.tokens == 200 and gen.backlog.released

    asyncio.run(main())


class ManualSource(PieceStream):
    """A source driven by hand, as a batching engine would drive one: it asks ``has_room()`` first."""

    def __init__(self) -> None:
        self.stopped_by: str | None = None
        self._stopping = False

    def start(self, loop=None) -> "ManualSource":
        if self._queue is None:
            self._queue, self.done = PieceQueue(), asyncio.Event()
        return self

    def stop(self, source: str = STOPPED) -> None:
        self.stopped_by = self.stopped_by or source
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    def hand(self, text: str) -> None:
        self.backlog.put()
        self._queue.put_nowait(Piece(text, time.perf_counter(), 0))


def test_has_room_leaves_a_source_out_while_its_reader_is_behind_then_stops_it():
    async def main() -> None:
        source = ManualSource().set_backpressure(max_queued=2, slow_reader_timeout=0.2).start()
        pieces = source.pieces()
        assert source.has_room()
        source.hand("a")
        source.hand("b")
        assert not source.has_room() and source.backlog.wait_began is not None  # the wait begins when it is asked
        assert not source.has_room() and source.backlog.waits == 1  # still the same wait
        assert (await anext(pieces)).text == "a"
        assert source.has_room() and source.backlog.wait_began is None  # a take ends the wait
        source.hand("c")
        assert not source.has_room()
        await asyncio.sleep(0.25)  # past the timeout, all waits together
        assert source.has_room(), "stopped: step it once more, so that it ends"
        assert source.stopped_by == SLOW_READER and source.stopping
        assert source.backlog.wait_began is None and 0.2 <= source.backlog.waited < 0.4  # the waiting is over
        unbounded = ManualSource().start()
        for _ in range(1000):
            unbounded.hand("x")
        assert unbounded.has_room() and unbounded.backlog.queued == 1000

    asyncio.run(main())


def test_the_timeout_counts_every_wait_together():
    backlog = Backlog(max_queued=1, slow_reader_timeout=0.3)
    backlog.put()
    assert not backlog.check()
    time.sleep(0.2)
    backlog.take()  # the reader took one: the first wait ended after 0.2 s
    assert backlog.waited >= 0.2 and not backlog.overdue()
    backlog.put()
    assert not backlog.check()
    time.sleep(0.12)
    assert backlog.overdue() and backlog.total_waited() >= 0.3
    assert backlog.wait(lambda: False) is False  # overdue: a blocking wait returns at once
    with pytest.raises(ValueError):
        Backlog(max_queued=0)
    with pytest.raises(ValueError):
        Backlog(slow_reader_timeout=0)


# --------------------------------------------------------------------------
# The stop reason, everywhere stops are mapped
# --------------------------------------------------------------------------


def test_slow_reader_is_a_stop_reason_of_its_own_and_an_incomplete_one():
    assert stop_reason_for(STOPPED, SLOW_READER) == SLOW_READER
    assert SLOW_READER in STOP_REASONS and SLOW_READER in INCOMPLETE_REASONS and SLOW_READER in CUT_OFF_WORDS


def slow_reader_job() -> Job:
    result = GenerationResult(tokens=7, stop_reason=STOPPED, text="The keeper")
    record = LogRecord(id="1", path="/stream", tokens=7, stop_signal=SLOW_READER, stored_reason=SLOW_READER)
    return Job(SimpleNamespace(result=result, stopped_by=SLOW_READER), record, answer=None)  # type: ignore[arg-type]


def test_each_format_ends_a_slow_reader_stop_as_incomplete():
    job = slow_reader_job()
    ours = StreamlabFormat().ending(job)
    assert ours[0].name == "end" and ours[0].data["stop_reason"] == SLOW_READER and ours[0].data["incomplete"]
    openai = ChatCompletionFormat("fake").ending(job)
    assert len(openai) == 1 and "slow_reader" in openai[0].data["error"]["message"]  # an error, no [DONE]
    anthropic = MessagesFormat("fake").ending(job)
    assert [e.name for e in anthropic] == ["error"] and "slow_reader" in anthropic[0].data["error"]["message"]


# --------------------------------------------------------------------------
# The server: options, /debug/queues, the stop in /log and the store
# --------------------------------------------------------------------------


def test_the_policy_is_a_server_option_with_named_defaults():
    config = config_from_args(parse_args([]))
    assert (config.max_queued, config.slow_reader_timeout) == (MAX_QUEUED, SLOW_READER_TIMEOUT)
    config = config_from_args(parse_args(["--max-queued", "0", "--slow-reader-timeout", "0"]))
    assert (config.max_queued, config.slow_reader_timeout) == (None, None)  # 0: no limit
    config = config_from_args(parse_args(["--max-queued", "32", "--slow-reader-timeout", "2.5"]))
    assert (config.max_queued, config.slow_reader_timeout) == (32, 2.5)
    with pytest.raises(UserError):  # one line, exit 2, from the cli wrapper
        parse_args(["--max-queued", "-1"])


def slow_socket(port: int, path: str, body: dict) -> socket.socket:
    """A reader that does not read: a small window and an Ethernet MSS, so the server's buffers stay small."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1448)
    sock.connect(("127.0.0.1", port))
    sock.sendall(wire.post_request(port, path, body))
    return sock


def read_all(sock: socket.socket) -> Trace:
    trace = Trace("stream")
    recorder = ResponseRecorder(trace)
    sock.settimeout(15)
    while data := sock.recv(65536):
        recorder.feed(data, 0.0)
    recorder.eof()
    return trace


def _compact(queues: dict) -> str:
    """One line of a /debug/queues snapshot: the first generation's backlog and the first connection's buffers."""
    gen = (queues["generations"] or [{}])[0]
    conn = (queues["connections"] or [{}])[0]
    return (f"t={queues['time']:.2f} gen tokens={gen.get('tokens')} sent={gen.get('pieces_sent')} "
            f"queued={gen.get('queued')} most={gen.get('most_queued')} handed={gen.get('handed')} "
            f"taken={gen.get('taken')} waiting_for={gen.get('waiting_for')} waited={gen.get('waited')} "
            f"stopped_by={gen.get('stopped_by')} ended={gen.get('ended')} | conn buffer={conn.get('write_buffer')} "
            f"unsent={conn.get('kernel_unsent')} sent={conn.get('bytes_sent')}")


def _failed(seen: list[str], log: list[dict]) -> str:
    """Every 20th snapshot and the last, then the log's records, each field: short enough that pytest shows it all."""
    shown = [*seen[::20], seen[-1]] if seen else []
    records = [json.dumps({k: v for k, v in r.items() if k not in ("prompt", "text")}, default=str) for r in log]
    return "\n".join(["not stopped in 30 s; the queues:", *shown, "the log:", *records])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_reader_too_slow_is_stopped_and_the_reason_reaches_log_store_and_ending(path):
    messages = [{"role": "user", "content": "Tell me about the keeper."}]
    body = {"messages": messages, "max_tokens": 4000, "stream": True}
    if path == "/v1/chat/completions":
        body["ignore_eos"] = True
    lm = FakeLM(SCRIPT * 200, decode_seconds=0.0005, context_length=8192)  # ~9,000 bytes of answer without EOS
    with serving(lm, max_queued=16, slow_reader_timeout=0.5, write_timeout=0) as server:
        sock = slow_socket(server.port, path, body)
        try:
            deadline, seen, caught, stopped = time.monotonic() + 30, [], None, False
            most_queued = most_buffered = 0
            while not stopped:  # the kernel's and asyncio's buffers fill first, then the queue, then it waits
                queues = client.get_json_sync(server.port, "/debug/queues")
                generations, connections = queues["generations"], queues["connections"]
                most_queued = max([most_queued, *(g["most_queued"] for g in generations)])
                most_buffered = max([most_buffered, *(c["write_buffer"] for c in connections)])
                if generations and generations[0]["stopped_by"] == SLOW_READER:
                    caught, stopped = generations[0], True
                    continue
                seen.append(_compact(queues))
                # Where asyncio's buffer was under its 64 KiB when the stop came, the ending went straight in, the
                # job ended and the server closed its side within one poll: the log then says it was stopped
                # (a clean-clone run beside other workers: stopped 1.8 s in, gone before the next poll).
                log = client.get_json_sync(server.port, "/log")
                stopped = any(r.get("stop_signal") == SLOW_READER and r.get("done") for r in log)
                assert stopped or time.monotonic() < deadline, _failed(seen, log)
                time.sleep(0.05)
            # The bound on the queue, whenever it was seen; and, where the stop was caught running, the wait it
            # took and asyncio's buffer full (the ending then waits for the reader).
            assert most_queued <= 16 + 2
            if caught is not None:
                assert caught["waited"] >= 0.5 and most_buffered >= 64 * 1024
            trace = read_all(sock)  # the reader catches up: every piece made, then the ending
        finally:
            sock.close()
        record = client.wait_log_sync(server.port, trace.request_id)
    assert record["stop_signal"] == SLOW_READER and record["stored_reason"] == SLOW_READER
    assert not record["client_left"] and record["tokens"] < 4000
    assert trace.error is not None and "slow_reader" in json.dumps(trace.error)
    assert not trace.complete  # no [DONE], no message_stop: the SDKs raise instead of ending quietly


def test_the_stored_answer_says_slow_reader():
    lm = FakeLM(SCRIPT * 200, decode_seconds=0.0005, context_length=8192)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with serving(lm, max_queued=8, slow_reader_timeout=0.3, write_timeout=0) as server:
        sock = slow_socket(server.port, "/v1/chat/completions", body)
        try:
            trace = read_all_after_stop(server.port, sock)
        finally:
            sock.close()
        record = client.wait_log_sync(server.port, trace.request_id)
        conversation = client.get_json_sync(server.port, f"/conversations/{record['conversation_id']}")
    answer = conversation["messages"][-1]
    assert answer["stop_reason"] == SLOW_READER and answer["incomplete"] and answer["status"] == "done"
    assert answer["content"] == trace.text  # what the reader got is what was stored


def read_all_after_stop(port: int, sock: socket.socket) -> Trace:
    deadline = time.monotonic() + 30
    while True:
        generations = client.get_json_sync(port, "/debug/queues")["generations"]
        if generations and generations[0]["stopped_by"] == SLOW_READER:
            return read_all(sock)
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_debug_queues_answers_only_this_machine():
    with serving(fake()) as server:
        queues = client.get_json_sync(server.port, "/debug/queues")
        assert set(queues) == {"time", "rss_bytes", "connections", "generations", "waiting"}  # waiting: the line
        assert queues["rss_bytes"] is None or queues["rss_bytes"] > 0


# --------------------------------------------------------------------------
# The relay obeys the same bound
# --------------------------------------------------------------------------


def test_the_relay_reads_no_further_from_its_upstream_while_its_reader_is_behind():
    with serving(fake()) as upstream:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2000, "ignore_eos": True}

        async def main() -> UpstreamGeneration:
            gen = UpstreamGeneration(f"http://127.0.0.1:{upstream.port}", body).set_backpressure(4, 0.3)
            await asyncio.wait_for(gen.wait(), 10)  # nobody reads
            return gen

        gen = asyncio.run(main())
        assert gen.stopped_by == SLOW_READER and gen.result.stop_reason == STOPPED
        assert gen.backlog.handed <= 5 and gen.backlog.most_queued <= 5
        deadline = time.monotonic() + 10
        while not (records := client.get_json_sync(upstream.port, "/log")) or not records[-1]["done"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert records[-1]["stored_reason"] == "client_left" and records[-1]["tokens"] < 2000  # the abort went upstream


# --------------------------------------------------------------------------
# The experiment, at its tiny size
# --------------------------------------------------------------------------


def test_the_benchmark_runs_at_its_tiny_size_and_its_lines_parse(tmp_path, capsys, monkeypatch):
    from streamlab.book import bench
    from streamlab.lab.results import measures

    monkeypatch.setattr(measures, "BENCH_DIR", tmp_path)  # where Report.save writes
    spec = importlib.util.spec_from_file_location("backpressure_benchmark", bench.SCRIPTS / "backpressure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = module.main(["--tiny"], lm=fake())
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("backpressure: ")]
    figures = [parse_line(line) for line in lines]
    figures = [f for f in figures if f]
    assert len(figures) == len(report.measures) >= 21
    keys = {f["key"] for f in figures}
    for policy in ("unbounded", "bounded", "bounded_timeout"):
        assert {f"{policy}.tokens_generated", f"{policy}.pieces_read", f"{policy}.peak_queued"} <= keys
    saved = json.loads((tmp_path / "backpressure.json").read_text())
    assert set(saved["data"]["series"]) == {"unbounded", "bounded", "bounded_timeout"}
    assert report.get("bounded.peak_queued") <= module.TINY["max_queued"]  # a bound, not a timing
    rows = saved["tables"]["policies"]
    assert [r["policy"] for r in rows] == ["unbounded", "bounded", "bounded_timeout"]


def test_the_scripted_source_obeys_the_bound_and_stops_a_slow_reader():
    """The scripted token source (many-streams benchmark, --scripted-rate) holds back at the bound like a model."""
    from streamlab.server.answers.scripted import ScriptedGeneration

    async def main():
        waiting = ScriptedGeneration(rate=200, max_tokens=100).set_backpressure(5, None)
        waiting.start()
        await asyncio.sleep(0.2)  # 40 periods: an unbounded source would have made 40
        assert waiting.tokens == 5 and waiting.backlog.queued == 5
        pieces = [p async for p in waiting.pieces()]
        assert len(pieces) == 100 and (await waiting.wait()).stop_reason == MAX_TOKENS

        stopped = ScriptedGeneration(rate=200, max_tokens=100).set_backpressure(5, 0.3)
        stopped.start()
        await asyncio.sleep(0.5)
        pieces = [p async for p in stopped.pieces()]
        assert len(pieces) == 5 and stopped.stopped_by == SLOW_READER
        assert (await stopped.wait()).tokens == 5

    asyncio.run(main())
