"""The scripted source, the rivals, and the many-streams benchmark at its tiny size.

Timings are never asserted as figures (the machines are shared): the
scripted source's schedule is checked within loose bounds, and the
benchmark only has to run end to end and print what parses.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from inprocess import serving
from streamlab.client import timed as client
from streamlab.book.bench import SCRIPTS
from streamlab.lab.results.measures import parse_line
from streamlab.lab.setups import runner
from streamlab.client.metrics import percentile
from streamlab.lab.experiments.many_streams import StreamReading, default_loop, server_command, summarize
from streamlab.net.errors import UserError
from streamlab.server.command import loop_factory, run_on_loop
from streamlab.server.transport.events import Event
from streamlab.server.wire.formats import StreamlabFormat, TextPiece
from streamlab.server.answers.sources import source_for
from streamlab.server.answers.scripted import ScriptedEngine, ScriptedGeneration, script_text
from streamlab.protocol.endings import MAX_TOKENS, STOP_SEQUENCE, STOPPED


def test_pieces_come_on_an_absolute_schedule():
    counted: list[int] = []

    async def main() -> tuple[list[float], float, ScriptedGeneration]:
        gen = ScriptedGeneration(rate=50, max_tokens=10, on_token=counted.append)
        started = time.perf_counter()
        times = [piece.time async for piece in gen.pieces()]
        await gen.wait()
        return times, started, gen

    times, started, gen = asyncio.run(main())
    assert gen.result.text == script_text(10) and gen.result.tokens == 10
    assert gen.result.stop_reason == MAX_TOKENS and counted == list(range(1, 11))
    assert len(times) == 10
    # Piece i is due at start + i/50 s: each within loose bounds, and no drift at the end.
    for i, t in enumerate(times, 1):
        assert -0.005 < t - started - i * 0.02 < 0.25
    assert times[-1] - started < 0.2 + 0.25


def test_stop_ends_it_at_once_with_stopped():
    async def main() -> ScriptedGeneration:
        gen = ScriptedGeneration(rate=100, max_tokens=1000)
        async for piece in gen.pieces():
            if piece.tokens == 3:
                gen.stop("eof")
        await gen.wait()
        return gen

    gen = asyncio.run(main())
    assert gen.result.stop_reason == STOPPED and gen.result.tokens == 3 and gen.stopped_by == "eof"
    assert gen.result.text == script_text(3) and gen.stopping


def test_a_stop_sequence_ends_it_as_a_model_would():
    async def main() -> ScriptedGeneration:
        gen = ScriptedGeneration(rate=200, max_tokens=50, stop_sequences=[" of"])
        await gen.wait()
        return gen

    gen = asyncio.run(main())
    assert gen.result.text == "The keeper" and gen.result.stop_reason == STOP_SEQUENCE


def test_the_engine_says_scripted_wherever_its_name_shows():
    engine = ScriptedEngine(20)
    assert engine.name == "scripted-20-tok/s" and engine.kind == "scripted"
    assert source_for(engine) is engine
    with serving(ScriptedEngine(100)) as server:
        health = client.get_json_sync(server.port, "/health")
        assert health["model"] == "scripted-100-tok/s" and health["engine"] == "scripted"
        models = client.get_json_sync(server.port, "/v1/models")
        assert models["data"][0]["id"] == "scripted-100-tok/s"
        trace = client.stream_sync(server.port, "Tell me", 8)
        assert trace.status == 200 and trace.text == script_text(8)
        ws_trace = client.websocket_sync(server.port, "Tell me", 5)
        assert ws_trace.text == script_text(5)
        record = client.wait_log_sync(server.port, trace.request_id)
        assert record["tokens"] == 8 and record["stop_reason"] == MAX_TOKENS and record["prompt_tokens"] == 2


def test_the_figures_of_a_run():
    readings = [StreamReading(started=0.0, times=[0.05, 0.10, 0.16], ended=True),
                StreamReading(started=0.01, times=[0.06, 0.11, 0.17], ended=True),
                StreamReading(started=0.02, times=[0.07], failure="ConnectionResetError")]
    samples = [(0.0, 1.0, 100 << 20), (0.1, 1.5, 103 << 20), (0.2, 2.0, 101 << 20)]
    row = summarize(readings, samples, tokens=3, rate=20, idle=samples[0], end=samples[-1])
    assert row["completed"] == 2 and row["failed"] == 1 and row["failures"] == {"ConnectionResetError": 1}
    assert row["events"] == 7 and row["gap_p50_ms"] == pytest.approx(55, abs=1)
    assert row["cpu_s_per_10k_events"] == pytest.approx(1.0 / 7 * 10_000)
    assert row["kb_per_stream"] == pytest.approx(3 * 1024 / 3)
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0 and percentile([], 99) != percentile([], 99)  # NaN


def test_the_benchmark_runs_at_its_tiny_size(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPTS / "many_streams.py"), "--tiny"], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "STREAMLAB_BENCH_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [line for line in done.stdout.splitlines() if " = " in line]
    figures = [parse_line(line) for line in printed]
    assert printed and all(figures), [line for line, f in zip(printed, figures) if not f]
    saved = json.loads((tmp_path / "many_streams.json").read_text())
    assert len(figures) == len(saved["measures"])
    keys = {m["key"] for m in saved["measures"]}
    assert {"sse_5_p99_gap_over_schedule_ms", "cpu_per_event_vs_starlette_5"} <= keys
    (rows,) = saved["tables"].values()
    assert {r["server"] for r in rows} == {"streamlab", "uvicorn+starlette", "uvicorn+sse-starlette",
                                         "streamlab-ws", "websockets"}
    assert all(r["completed"] == 5 and r["failed"] == 0 for r in rows), rows
    # The rivals started, and every server streamed the same scripted words.
    assert {r["sample_text"] for r in saved["data"]["rows"]} == {script_text(10)}
    assert "scripted" in saved["params"]["source"] and saved["data"]["gaps_ms"]
    # One loop for every server of the run: uvloop where it is installed.
    assert {r["loop"] for r in saved["data"]["rows"]} == {saved["params"]["loop"]} == {default_loop()}
    assert {r["round"] for r in saved["data"]["rows"]} == {1}


def test_a_burst_beyond_asyncios_default_backlog_waits_in_the_kernel():
    """While the loop is busy, 300 connections complete their handshake and wait to be accepted.

    asyncio's default listen backlog is 100: past it the kernel drops the
    SYNs and each client retries after 1 s, 3 s, 7 s. The server asks for
    ``LISTEN_BACKLOG`` (2048).
    """
    import select
    import socket
    import threading

    from streamlab.server.config import LISTEN_BACKLOG, config_from_args, parse_args

    assert config_from_args(parse_args([])).backlog == LISTEN_BACKLOG >= 1000
    assert config_from_args(parse_args(["--backlog", "4096"])).backlog == 4096
    with serving(ScriptedEngine(100)) as server:
        busy, release = threading.Event(), threading.Event()
        server.loop.call_soon_threadsafe(lambda: (busy.set(), release.wait(20)))  # the loop accepts nothing now
        assert busy.wait(5)
        sockets = []
        try:
            for _ in range(300):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", server.port))
                sockets.append(s)
            connected: set[socket.socket] = set()
            deadline = time.monotonic() + 3
            while len(connected) < len(sockets) and time.monotonic() < deadline:
                _, writable, _ = select.select([], [s for s in sockets if s not in connected], [], 0.2)
                connected.update(w for w in writable if w.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
            assert len(connected) == 300
        finally:
            for s in sockets:
                s.close()
            release.set()
            time.sleep(1.0)  # the loop accepts the closed connections and lets them go before shutdown


# --------------------------------------------------------------------------
# One event loop for every stack
# --------------------------------------------------------------------------


def loaded_uvloop(pid: int) -> bool:
    """Whether process ``pid`` has uvloop's extension mapped: it runs on uvloop, not on asyncio's own loop."""
    with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
        return any("uvloop" in line for line in maps)


def test_a_loop_is_named_never_guessed(monkeypatch: pytest.MonkeyPatch):
    assert loop_factory("asyncio") is None
    assert run_on_loop(asyncio.sleep(0, "done")) == "done"
    with pytest.raises(UserError, match="asyncio and uvloop"):
        loop_factory("trio")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    with pytest.raises(UserError, match="not installed"):
        loop_factory("uvloop")
    assert default_loop() == "asyncio"


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc")
@pytest.mark.parametrize("server", ["streamlab", "uvicorn+starlette", "websockets"])
def test_every_stack_runs_on_the_loop_it_is_given(tmp_path, server: str):
    pytest.importorskip("uvloop")
    for loop in ("uvloop", "asyncio"):
        running = runner.start_process(server_command(server, 100, 10, str(tmp_path / f"{loop}.db"), loop),
                                       name=f"loop-{server}", ready_timeout=120)
        try:
            assert loaded_uvloop(running.process.pid) == (loop == "uvloop"), (server, loop)
            if server == "websockets":
                assert client.websocket_sync(running.port, "Tell me", 3).text == script_text(3)
            else:
                assert client.stream_sync(running.port, "Tell me", 3).text == script_text(3)
        finally:
            running.stop()


# --------------------------------------------------------------------------
# The per-event path's shortcuts say what the long way says
# --------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", " keeper", 'a "quote" and a \\ backslash', "two\nlines\r\n", "\u2028 é ☃ 🚀",
                                  "\x00\x1f\x7f", "</script>"])
def test_a_text_piece_is_the_bytes_of_the_general_event(text: str):
    piece = StreamlabFormat().piece(text)
    assert isinstance(piece, TextPiece) and isinstance(piece, Event) and piece.name == "message"
    assert piece.encode() == Event({"text": text}).encode()
    assert json.loads(piece.data) == {"text": text}
