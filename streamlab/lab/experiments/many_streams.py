"""Many streams at once, the server alone: a load driver and the side-by-side runs of chapter 11.

How many readers can one process stream to, and what does each cost? A model
would answer first (it makes ~20 tokens/s in all on this CPU), so the servers
here serve a *scripted source* instead (no model: the same words at a fixed
rate, see :mod:`streamlab.server.answers.scripted`), and the figures are the server's
own: events delivered per second, the gaps between a stream's events against
its schedule (50 ms at 20 tokens/s), server CPU seconds per 10,000 events,
memory per open stream.

The load comes from another process, :func:`drive` (``python -m
streamlab.lab.experiments.many_streams drive ...``, printing JSON), so that the driver's CPU
is not counted as the server's (psutil reads the server's ``cpu_times`` from
outside). It opens N connections from one process with raw asyncio protocols
(an HTTP client library costs more per event than the server being measured),
spread over ``spread`` seconds so that 5,000 connects do not arrive in one
burst, and notes the arrival time of every event of every stream. The
streams are counted SSE events (``\\n\\n``) or WebSocket messages (decoded
by :mod:`streamlab.protocol.websocket`); nothing else is parsed.

:func:`compare` runs, one server process per run, streamlab's ``/stream``
and ``/ws`` and the rivals of :mod:`streamlab.lab.outside.rivals` (uvicorn + Starlette,
uvicorn + sse-starlette, the websockets library) at the same levels, and
returns one row per run; ``benchmarks/many_streams.py`` prints them. Every
server, and the driver, run on one event loop (uvloop where installed, else
asyncio's): two loops would measure the loops. ``rounds`` repeats the whole
set, interleaved, so that a neighbour's burst of work lands on every server
alike and the spread between rounds shows what one figure is worth.

Both processes share the machine: on 2 cores, a driver reading 20,000 events
a second takes a good part of one. Its own CPU is in every row
(``driver_cpu_s``) so that a saturated driver is seen, not mistaken for a slow
server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from streamlab.client.metrics import percentile
from streamlab.net.processes import raise_open_files_limit
from streamlab.protocol import websocket as ws, websocket_frames, websocket_handshake

PROMPT = "Tell me about the keeper of the lighthouse."
SCHEDULE_NOTE = "scripted source (no model): a fixed text at a fixed token rate"
WARMUP_STREAMS = 10  # short streams before measuring: lazy imports, first-use caches
WARMUP_TOKENS = 3
SAMPLE_EVERY = 0.1  # seconds between readings of the server's CPU time and memory
GAP_SAMPLE = 2000  # gaps kept per run for a distribution chart
GRACE = 30.0  # seconds past the schedule before the streams still open are cut and counted failed

# server name -> (protocol, path, how to start it)
SERVERS = {
    "streamlab": ("sse", "/stream"),
    "streamlab-ws": ("ws", "/ws"),
    "uvicorn+starlette": ("sse", "/stream"),
    "uvicorn+sse-starlette": ("sse", "/stream"),
    "websockets": ("ws", "/ws"),
}
SSE_SERVERS = ("streamlab", "uvicorn+starlette", "uvicorn+sse-starlette")
WS_SERVERS = ("streamlab-ws", "websockets")
RIVAL_KINDS = {"uvicorn+starlette": "starlette", "uvicorn+sse-starlette": "sse-starlette", "websockets": "websockets"}
LOOPS = ("asyncio", "uvloop")


def default_loop() -> str:
    """uvloop where it is installed (what uvicorn picks by itself), else asyncio: one loop for every server."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


# --------------------------------------------------------------------------
# One stream, as a protocol: arrival times of events, and how it ended
# --------------------------------------------------------------------------


@dataclass(eq=False)
class StreamReading:
    """What one connection saw: when it began, when each text event arrived, and how it ended."""

    started: float = 0.0  # perf_counter when the connection was asked for
    times: list[float] = field(default_factory=list)  # each text event's arrival
    ended: bool = False  # the end event ("end" / "done") arrived
    closed: float | None = None  # when the connection was lost
    failure: str | None = None
    done: asyncio.Future | None = None
    text: list[str] | None = None  # the text itself, for one stream of a run (None: not kept)

    def fail(self, why: str) -> None:
        if self.failure is None and not self.ended:
            self.failure = why


class _Stream(asyncio.Protocol):
    def __init__(self, reading: StreamReading, request: bytes) -> None:
        self.reading = reading
        self.request = request
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.write(self.request)  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        reading = self.reading
        reading.closed = time.perf_counter()
        if not reading.ended:
            reading.fail(f"{type(exc).__name__}" if exc else "closed before the end")
        if reading.done is not None and not reading.done.done():
            reading.done.set_result(None)


class SSEStream(_Stream):
    """Counts Server-Sent Events: a text event is ``data: {"text"...``; the end is ``event: end``."""

    def __init__(self, reading: StreamReading, request: bytes) -> None:
        super().__init__(reading, request)
        self.buffer = b""
        self.head_checked = False

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buffer = self.buffer + data
        if not self.head_checked:
            if len(buffer) < 12:
                self.buffer = buffer
                return
            self.head_checked = True
            if not buffer.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
                self.reading.fail(f"status {buffer[9:12].decode('latin-1')}")
                self.transport.close()  # type: ignore[union-attr]
                return
        parts = buffer.split(b"\n\n")
        self.buffer = parts.pop()
        for part in parts:
            if b'data: {"text"' in part:
                self.reading.times.append(now)
                if self.reading.text is not None:
                    self.reading.text.append(json.loads(part[part.index(b"data: ") + 6:])["text"])
            elif b"event: end" in part:
                self.reading.ended = True
            elif b"event: error" in part:
                self.reading.fail("error event")


class WSStream(_Stream):
    """Speaks the client side of a WebSocket: the upgrade, one masked request message, then counts messages."""

    def __init__(self, reading: StreamReading, request: bytes, message: str) -> None:
        super().__init__(reading, request)
        self.message = message
        self.conn: ws.Connection | None = None
        self.head = b""

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        transport = self.transport
        assert transport is not None
        if self.conn is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            if not self.head.startswith(b"HTTP/1.1 101"):
                self.reading.fail(f"status {self.head[9:12].decode('latin-1')}")
                transport.close()
                return
            data, self.head = self.head[end + 4:], b""
            self.conn = ws.Connection(client=True)
            transport.write(self.conn.send_text(self.message))
            if not data:
                return
        try:
            events = self.conn.receive(data)
        except websocket_frames.ProtocolError as err:
            self.reading.fail(f"protocol error {err.code}")
            transport.abort()
            return
        for event in events:
            if isinstance(event, ws.TextMessage):
                if event.text.startswith('{"text"'):
                    self.reading.times.append(now)
                    if self.reading.text is not None:
                        self.reading.text.append(json.loads(event.text)["text"])
                elif '"done": true' in event.text:
                    self.reading.ended = True
                elif '"error"' in event.text:
                    self.reading.fail("error message")
            elif isinstance(event, ws.Ping):
                transport.write(self.conn.send_pong(event.payload))
            elif isinstance(event, ws.CloseReceived):
                if not self.conn.close_sent:
                    transport.write(self.conn.send_close(event.code if websocket_frames.is_valid_close_code(event.code) else 1000))
                # The server closes TCP once it has our CLOSE.


def sse_request(host: str, port: int, path: str, tokens: int) -> bytes:
    body = json.dumps({"prompt": PROMPT, "max_tokens": tokens}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body


def _new_stream(protocol: str, host: str, port: int, path: str, tokens: int, reading: StreamReading) -> _Stream:
    if protocol == "sse":
        return SSEStream(reading, sse_request(host, port, path, tokens))
    handshake = websocket_handshake.client_handshake(f"{host}:{port}", path, websocket_handshake.new_key())
    return WSStream(reading, handshake, json.dumps({"prompt": PROMPT, "max_tokens": tokens}))


async def _open(protocol: str, host: str, port: int, path: str, tokens: int, reading: StreamReading,
                transports: list[asyncio.BaseTransport]) -> None:
    loop = asyncio.get_running_loop()
    reading.started = time.perf_counter()
    try:
        transport, _ = await loop.create_connection(
            lambda: _new_stream(protocol, host, port, path, tokens, reading), host, port)
    except OSError as exc:
        reading.fail(f"connect: {type(exc).__name__}")
        reading.closed = time.perf_counter()
        assert reading.done is not None
        if not reading.done.done():
            reading.done.set_result(None)
        return
    transports.append(transport)


async def _run_streams(protocol: str, host: str, port: int, path: str, n: int, tokens: int, spread: float,
                       deadline: float) -> list[StreamReading]:
    """Open ``n`` streams spread evenly over ``spread`` seconds; wait for all of them (or the deadline)."""
    loop = asyncio.get_running_loop()
    readings = [StreamReading(done=loop.create_future()) for _ in range(n)]
    if readings:
        readings[0].text = []  # one stream's text, to check that every server says the same
    transports: list[asyncio.BaseTransport] = []
    opening: list[asyncio.Task] = []
    t0 = time.perf_counter()
    for i, reading in enumerate(readings):
        due = t0 + spread * i / n
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        opening.append(asyncio.ensure_future(_open(protocol, host, port, path, tokens, reading, transports)))
    left = deadline - time.perf_counter()
    await asyncio.wait([r.done for r in readings if r.done is not None], timeout=max(left, 0.1))
    for transport in transports:
        if not transport.is_closing():
            transport.abort()
    for task in opening:
        task.cancel()
    for reading in readings:
        if reading.closed is None:
            reading.fail("timed out")
    return readings


# --------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------


def _at(samples: list[tuple[float, float, int]], t: float, index: int) -> float:
    """A sampled series (time, cpu, rss) read at time ``t``, linearly between the samples around it."""
    before = [s for s in samples if s[0] <= t]
    after = [s for s in samples if s[0] >= t]
    if not before:
        return float(samples[0][index])
    if not after:
        return float(samples[-1][index])
    a, b = before[-1], after[0]
    if b[0] == a[0]:
        return float(a[index])
    return a[index] + (b[index] - a[index]) * (t - a[0]) / (b[0] - a[0])


def summarize(readings: list[StreamReading], samples: list[tuple[float, float, int]], *, tokens: int,
              rate: float, idle: tuple[float, float, int] | None, end: tuple[float, float, int] | None,
              gap_sample: int = GAP_SAMPLE) -> dict[str, Any]:
    """The figures of one run from every stream's arrival times and the server's sampled CPU and memory."""
    n = len(readings)
    failures: dict[str, int] = {}
    completed = 0
    for r in readings:
        if r.failure is None and r.ended and len(r.times) == tokens:
            completed += 1
        else:
            why = r.failure or ("short" if r.ended else "no end")
            failures[why] = failures.get(why, 0) + 1
    gaps = [(b - a) * 1000 for r in readings for a, b in zip(r.times, r.times[1:])]
    gaps.sort()
    firsts = sorted((r.times[0] - r.started) * 1000 for r in readings if r.times)
    events = sum(len(r.times) for r in readings)
    with_events = [r for r in readings if r.times]
    # The steady window: every stream has begun and none has ended (N streams open at once).
    w0 = max((r.times[0] for r in with_events), default=0.0)
    w1 = min((r.times[-1] for r in with_events), default=0.0)
    steady = w1 - w0 >= 0.25
    if not steady:  # too short to have one (a tiny run): the whole span
        w0 = min((r.times[0] for r in with_events), default=0.0)
        w1 = max((r.times[-1] for r in with_events), default=0.0)
    in_window = sum(1 for r in with_events for t in r.times if w0 <= t <= w1)
    span = max(w1 - w0, 1e-9)
    row: dict[str, Any] = {
        "streams": n,
        "completed": completed,
        "failed": n - completed,
        "failures": failures,
        "events": events,
        "expected_events": n * tokens,
        "events_per_s": in_window / span if with_events else 0.0,
        "expected_events_per_s": n * rate,
        "window_s": span,
        "steady_window": steady,
        "schedule_ms": 1000 / rate,
        "gap_p50_ms": percentile(gaps, 50),
        "gap_p99_ms": percentile(gaps, 99),
        "gap_max_ms": gaps[-1] if gaps else float("nan"),
        "gap_p99_over_schedule_ms": percentile(gaps, 99) - 1000 / rate,
        "first_event_p50_ms": percentile(firsts, 50),
        "first_event_p99_ms": percentile(firsts, 99),
    }
    sample = random.Random(0).sample(gaps, min(len(gaps), gap_sample)) if gaps else []
    row["gaps_ms_sample"] = [round(g, 3) for g in sample]
    row["sample_text"] = "".join(readings[0].text or []) if readings else ""
    if samples and idle is not None and end is not None:
        cpu = end[1] - idle[1]
        row["server_cpu_s"] = cpu
        row["cpu_s_per_10k_events"] = cpu / events * 10_000 if events else float("nan")
        steady_cpu = _at(samples, w1, 1) - _at(samples, w0, 1)
        row["cpu_s_per_10k_steady"] = steady_cpu / in_window * 10_000 if in_window else float("nan")
        open_rss = [s[2] for s in samples if w0 <= s[0] <= w1] or [int(_at(samples, (w0 + w1) / 2, 2))]
        row["rss_idle_mb"] = idle[2] / 2**20
        row["rss_open_mb"] = max(open_rss) / 2**20
        row["kb_per_stream"] = (max(open_rss) - idle[2]) / n / 1024 if n else float("nan")
    return row


# --------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------


async def drive(
    port: int,
    *,
    host: str = "127.0.0.1",
    protocol: str = "sse",
    path: str = "/stream",
    streams: int = 100,
    tokens: int = 60,
    rate: float = 20.0,
    spread: float = 1.0,
    server_pid: int | None = None,
    warmup: int = WARMUP_STREAMS,
    gap_sample: int = GAP_SAMPLE,
) -> dict[str, Any]:
    """Open ``streams`` streams against a server and measure them; returns the figures (see ``summarize``).

    With ``server_pid``, the server's CPU time and RSS are read every
    ``SAMPLE_EVERY`` seconds: idle (after ``warmup`` short streams), while
    the streams run, and once they are all closed.
    """
    if protocol not in ("sse", "ws"):
        raise ValueError("protocol is 'sse' or 'ws'")
    raise_open_files_limit()
    if warmup:
        await _run_streams(protocol, host, port, path, warmup, WARMUP_TOKENS, 0.0,
                           time.perf_counter() + WARMUP_TOKENS / rate + GRACE)
        await asyncio.sleep(0.3)
    process = None
    if server_pid is not None:
        import psutil

        process = psutil.Process(server_pid)
    samples: list[tuple[float, float, int]] = []

    def read() -> tuple[float, float, int]:
        assert process is not None
        times, memory = process.cpu_times(), process.memory_info()
        sample = (time.perf_counter(), times.user + times.system, memory.rss)
        samples.append(sample)
        return sample

    async def sampler() -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY)
            read()

    idle = read() if process is not None else None
    idle_times = process.cpu_times() if process is not None else None
    driver_cpu = time.process_time()
    sampling = asyncio.ensure_future(sampler()) if process is not None else None
    deadline = time.perf_counter() + spread + tokens / rate + GRACE
    try:
        readings = await _run_streams(protocol, host, port, path, streams, tokens, spread, deadline)
    finally:
        if sampling is not None:
            sampling.cancel()
    end = read() if process is not None else None
    row = summarize(readings, samples, tokens=tokens, rate=rate, idle=idle, end=end, gap_sample=gap_sample)
    if process is not None and idle_times is not None:
        end_times = process.cpu_times()  # user: Python and the parsers; system: the kernel's share, the writes
        row["server_user_s"] = end_times.user - idle_times.user
        row["server_system_s"] = end_times.system - idle_times.system
    row.update(protocol=protocol, path=path, tokens=tokens, rate=rate, spread_s=spread,
               driver_cpu_s=time.process_time() - driver_cpu)
    return row


def drive_sync(port: int, **kwargs: Any) -> dict[str, Any]:
    """:func:`drive` from a script or a notebook."""
    from streamlab.net.aio import run_sync
    return run_sync(drive(port, **kwargs))


# --------------------------------------------------------------------------
# Side by side: one server process per run, the driver in another
# --------------------------------------------------------------------------


def server_command(server: str, rate: float, streams: int, db: str, loop: str = "asyncio") -> list[str]:
    """How each contender is started (``--port 0``, ready line on stdout), on the event loop ``loop``."""
    if server in ("streamlab", "streamlab-ws"):
        from streamlab.lab.setups.runner import server_command as streamlab_command

        room = str(max(10_000, 2 * streams))
        return streamlab_command("--scripted-rate", f"{rate:g}", "--max-active", room, "--max-connections", room,
                                 "--db", db, "--loop", loop)
    return [sys.executable, "-m", "streamlab.lab.outside.rivals", RIVAL_KINDS[server], "--port", "0", "--rate", f"{rate:g}",
            "--exit-on-stdin-eof", "--loop", loop]


def run_one(server: str, streams: int, *, tokens: int = 60, rate: float = 20.0, spread: float = 1.0,
            warmup: int = WARMUP_STREAMS, gap_sample: int = GAP_SAMPLE, loop: str = "asyncio") -> dict[str, Any]:
    """Start ``server`` fresh, drive ``streams`` streams at it from another process, stop it; one row.

    A fresh process per run: memory once allocated stays with a Python
    process, so a run after a bigger one would look cheaper than it is.
    """
    from streamlab.lab.setups.runner import _child_env, start_process

    protocol, path = SERVERS[server]
    with tempfile.TemporaryDirectory(prefix="streamlab-many-") as folder:
        running = start_process(server_command(server, rate, streams, os.path.join(folder, "bench.db"), loop),
                                name=f"many-{server}", ready_timeout=120)
        try:
            cmd = [sys.executable, "-m", "streamlab.lab.experiments.many_streams", "drive", "--port", str(running.port),
                   "--protocol", protocol, "--path", path, "--streams", str(streams), "--tokens", str(tokens),
                   "--rate", f"{rate:g}", "--spread", f"{spread:g}", "--server-pid", str(running.process.pid),
                   "--warmup", str(warmup), "--gap-sample", str(gap_sample), "--loop", loop]
            limit = spread + tokens / rate + GRACE + 60
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=_child_env(None))
            if done.returncode != 0:
                raise RuntimeError(f"the driver failed ({done.returncode}):\n{done.stderr[-4000:]}")
            row = json.loads(done.stdout)
            alive = running.process.poll() is None
        finally:
            running.stop()
    if not alive:
        row["failures"]["server died"] = 1
    return {"server": server, "loop": loop, **row}


def compare(
    levels: Sequence[int] = (100, 1000, 5000),
    ws_levels: Sequence[int] = (1000,),
    *,
    tokens: int = 60,
    rate: float = 20.0,
    spread: float = 1.0,
    sse_servers: Sequence[str] = SSE_SERVERS,
    ws_servers: Sequence[str] = WS_SERVERS,
    warmup: int = WARMUP_STREAMS,
    gap_sample: int = GAP_SAMPLE,
    progress: bool = True,
    loop: str | None = None,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Every SSE server at every level, every WebSocket server at every WebSocket level: one row per run.

    ``rounds`` times over, interleaved, each row with its ``round`` and its ``loop`` (None: ``default_loop()``).
    """
    loop, rows = loop or default_loop(), []
    one = [(s, n) for n in levels for s in sse_servers] + [(s, n) for n in ws_levels for s in ws_servers]
    runs = [(r, s, n) for r in range(1, rounds + 1) for s, n in one]
    for i, (round_, server, n) in enumerate(runs, 1):
        started = time.perf_counter()
        if progress:
            print(f"many_streams: [{i}/{len(runs)}] {server}, {n} streams, {loop} ...", file=sys.stderr, flush=True)
        try:
            row = run_one(server, n, tokens=tokens, rate=rate, spread=spread, warmup=warmup, gap_sample=gap_sample,
                          loop=loop)
        except Exception as exc:  # noqa: BLE001 - one failed run is a row that says so, not the end of the comparison
            row = {"server": server, "loop": loop, "protocol": SERVERS[server][0], "streams": n, "completed": 0,
                   "failed": n, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        row["round"] = round_
        if progress:
            outcome = row.get("error") or f"{row['completed']} completed, gap p99 {row['gap_p99_ms']:.1f} ms"
            print(f"many_streams: [{i}/{len(runs)}] {server}, {n} streams: {outcome} "
                  f"({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


TABLE_COLUMNS = (
    ("round", "round"), ("server", "server"), ("protocol", "protocol"), ("streams", "streams"), ("events_per_s",
    "events/s"), ("expected_events_per_s", "scheduled/s"), ("gap_p50_ms", "gap p50 ms"), ("gap_p99_ms", "gap p99 ms"),
    ("first_event_p99_ms", "first p99 ms"), ("cpu_s_per_10k_events", "CPU s/10k ev"),
    ("kb_per_stream", "KB/stream"), ("completed", "completed"), ("failed", "failed"), ("driver_cpu_s", "driver CPU s"),
)


def table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as a table to print (the columns above, rounded; the gaps sample left out)."""
    out = []
    for row in rows:
        cells: dict[str, Any] = {}
        for key, title in TABLE_COLUMNS:
            value = row.get(key, "")
            cells[title] = round(value, 3) if isinstance(value, float) else value
        out.append(cells)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamlab.lab.experiments.many_streams",
                                description="Drive many concurrent streams at a server; print the figures as JSON.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("drive", help="open N streams against a running server (run from its own process)")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, required=True)
    d.add_argument("--protocol", choices=("sse", "ws"), default="sse")
    d.add_argument("--path", default=None, help="default: /stream for SSE, /ws for WebSocket")
    d.add_argument("--streams", type=int, default=100)
    d.add_argument("--tokens", type=int, default=60)
    d.add_argument("--rate", type=float, default=20.0, help="the server's scripted rate (for the schedule)")
    d.add_argument("--spread", type=float, default=1.0, help="seconds over which the streams start")
    d.add_argument("--server-pid", type=int, default=None, help="read this process's CPU time and memory")
    d.add_argument("--warmup", type=int, default=WARMUP_STREAMS)
    d.add_argument("--gap-sample", type=int, default=GAP_SAMPLE)
    d.add_argument("--loop", choices=LOOPS, default="asyncio", help="the driver's event loop (the servers')")
    args = p.parse_args(argv)
    path = args.path or ("/stream" if args.protocol == "sse" else "/ws")
    from streamlab.server.command import run_on_loop

    row = run_on_loop(drive(args.port, host=args.host, protocol=args.protocol, path=path, streams=args.streams,
                            tokens=args.tokens, rate=args.rate, spread=args.spread, server_pid=args.server_pid,
                            warmup=args.warmup, gap_sample=args.gap_sample), args.loop)
    json.dump(row, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
