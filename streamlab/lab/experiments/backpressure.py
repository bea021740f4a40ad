"""A reader that takes 1 KB/s: where its bytes wait, and what each backpressure policy does (chapter 11).

The model makes ~15 tokens/s; streamed as OpenAI ``chat.completion.chunk``
events (~270 bytes each on the wire), that is ~4 KB/s. A reader that takes
1 KB/s (a phone on a poor link, a client busy elsewhere) falls behind from the
first second, and the bytes it has not read wait somewhere. In order:

1. its own kernel receive buffer (``SO_RCVBUF``, small here: 4 KB, set before
   connecting so that the window it announces is small from the start);
2. the server's kernel send buffer (``kernel_unsent``: written to the socket,
   not yet acknowledged). Linux sizes it from the segment size: over loopback
   (64 KB segments) it grows to megabytes and would swallow any answer, so the
   reader announces an Ethernet-sized MSS (1448 bytes, ``TCP_MAXSEG`` before
   connecting), as a reader across a network would; the buffer then starts
   near 50 KB and grows, as the kernel tunes it, to ~220 KB;
3. asyncio's transport buffer (``write_buffer``): above 64 KiB,
   ``ClientConnection.send`` waits in ``drain()`` and the streaming loop takes
   no more pieces;
4. the generation's queue of pieces (``queued``), unbounded unless the server
   runs with ``--max-queued``.

:func:`run` starts a server per policy (the real model in a process of its own
by default, or any model object in this process, e.g. the tests' fake one),
connects such a reader, asks for a long answer (``ignore_eos``), and samples
``GET /debug/queues`` every ``interval`` seconds: tokens generated, pieces
queued, the transport's and the kernel's buffered bytes, the server's resident
memory, and from the reader's side the bytes and pieces it has read. The
policies (:func:`policies`): unbounded; bounded at ``max_queued`` pieces (the
generation waits); bounded with a short ``slow_reader_timeout`` (it is stopped,
``slow_reader``). The write timeout is off in all three (``write_timeout=0``):
at 1 KB/s each ``drain()`` needs ~48 s to empty 48 KiB, so the default 30 s
would abort the reader in every run and hide the policy being measured
(:func:`default_policy` keeps it, to show exactly that).

:func:`report` turns the result into a :class:`streamlab.lab.results.measures.Report`
(figures per policy, one table, the time series in ``report.data``);
``benchmarks/backpressure.py`` prints and saves it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import tempfile
import termios
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from streamlab.client.timed import get_json_sync, wait_log
from streamlab.client.wire import post_request
from streamlab.net.aio import run_sync
from streamlab.client.tracing import ResponseRecorder, Trace

READ_RATE = 1024  # bytes per second the reader takes
READ_SIP = 256  # ... in sips of this many bytes (one recv each), ~4 a second
RCVBUF = 4096  # the reader's SO_RCVBUF (Linux doubles it for its own bookkeeping)
MSS = 1448  # the segment size the reader announces: Ethernet's, as across a network
INTERVAL = 0.25  # seconds between samples
ROUTE = "/v1/chat/completions"  # the fattest events: ~270 bytes each, ~4 KB/s at 15 tokens/s
ROUTES = ("/v1/chat/completions", "/stream")  # the routes that honour ignore_eos
PROMPT = "Tell me a long story about the keeper of a lighthouse and the ships he watched."
MAX_TOKENS = 2400
DURATION = 150.0  # seconds per policy: the buffers in front of the queue (~290 KB) take ~90-105 s to fill
DEMO_QUEUE = 256  # the bounded policies' max_queued (the server's default, MAX_QUEUED)
DEMO_TIMEOUT = 10.0  # the stopping policy's slow_reader_timeout: short, to be seen within the run
TICK = 0.05  # the reader's clock


@dataclass(frozen=True)
class Policy:
    """One way to serve the slow reader: the server options that differ between the runs."""

    name: str
    max_queued: int | None = None
    slow_reader_timeout: float | None = None
    write_timeout: float = 0.0  # 0: never (see the module's docstring)

    def flags(self) -> list[str]:
        """``python -m streamlab serve`` options for this policy."""
        return ["--max-queued", str(self.max_queued or 0),
                "--slow-reader-timeout", f"{self.slow_reader_timeout or 0:g}",
                "--write-timeout", f"{self.write_timeout:g}"]

    def config(self) -> dict[str, Any]:
        """The same as ``ServerConfig`` fields (for a server in this process)."""
        return {"max_queued": self.max_queued, "slow_reader_timeout": self.slow_reader_timeout,
                "write_timeout": self.write_timeout}


def policies(max_queued: int = DEMO_QUEUE, slow_reader_timeout: float = DEMO_TIMEOUT) -> list[Policy]:
    """The three runs: unbounded, bounded (the generation waits), bounded with a short slow-reader timeout."""
    return [
        Policy("unbounded"),
        Policy("bounded", max_queued),
        Policy("bounded_timeout", max_queued, slow_reader_timeout),
    ]


def default_policy() -> Policy:
    """The server's defaults as shipped, write timeout included: what happens to a 1 KB/s reader today."""
    from streamlab.server.config import MAX_QUEUED, SLOW_READER_TIMEOUT, ServerConfig

    return Policy("defaults", MAX_QUEUED, SLOW_READER_TIMEOUT, ServerConfig().write_timeout)


def request_body(route: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A long answer on ``route``: ``ignore_eos``, so that it is exactly ``max_tokens`` long."""
    if route == "/v1/chat/completions":
        return {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True, "seed": 0, "temperature": 0.7}
    if route == "/stream":
        return {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "seed": 0}
    raise ValueError(f"route must be one of {ROUTES}: the others cannot ask for ignore_eos")


class SlowReader:
    """A raw-socket client that reads ``rate`` bytes a second, with a small window, in a thread of its own.

    ``SO_RCVBUF`` and ``TCP_MAXSEG`` are set before ``connect``: the window a
    TCP connection announces, and the segment size, are agreed in the
    handshake. What it reads goes through :class:`streamlab.client.tracing.ResponseRecorder`,
    so ``trace`` holds the pieces of text and how the answer ended.
    """

    def __init__(self, port: int, request: bytes, *, rate: float = READ_RATE, rcvbuf: int = RCVBUF,
                 mss: int | None = MSS, host: str = "127.0.0.1") -> None:
        self.rate = float(rate)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if mss:
            try:
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
            except (OSError, AttributeError):  # not on every platform
                pass
        self.sock.connect((host, port))
        self.local_port = self.sock.getsockname()[1]
        self.trace = Trace("stream")
        self.recorder = ResponseRecorder(self.trace)
        self.bytes_read = 0
        self.eof = False
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self.trace.sent = time.perf_counter()
        self.sock.sendall(request)
        self._thread = threading.Thread(target=self._read, name="slow-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        self.sock.settimeout(TICK)
        started = time.perf_counter()
        while not self._closing.is_set():
            allowance = int(self.rate * (time.perf_counter() - started)) - self.bytes_read
            if allowance < READ_SIP:
                self._closing.wait(TICK)
                continue
            try:
                data = self.sock.recv(min(allowance, 4 * READ_SIP))
            except socket.timeout:
                continue
            except OSError:
                data = b""
            with self._lock:
                if not data:
                    self.eof = True
                    self.recorder.eof()
                    self.trace.finish()
                    return
                self.bytes_read += len(data)
                self.recorder.feed(data, self.trace.now())

    @property
    def pieces(self) -> int:
        """Pieces of text read so far (a piece is a token, but for the odd character split across two)."""
        with self._lock:
            return len(self.trace.text_events)

    @property
    def ended(self) -> bool:
        """Whether the reader has the whole response (its ending, or the connection's end)."""
        with self._lock:
            return self.eof or self.recorder.done

    def unread(self) -> int | None:
        """Bytes that arrived in the reader's kernel buffer and are not read yet (FIONREAD; Linux)."""
        try:
            raw = fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, struct.pack("i", 0))
        except (OSError, ValueError):
            return None
        return struct.unpack("i", raw)[0]

    def close(self) -> None:
        """Leave: stop reading and close (the server sees EOF, or a reset with bytes unread)."""
        self._closing.set()
        self._thread.join(5)
        self.sock.close()


@contextmanager
def _server(policy: Policy, lm: Any = None, server_args: Sequence[str] = ()) -> Iterator[int]:
    """A server with the policy's options on a free port: the real one in a process, or ``lm`` in this one."""
    folder = tempfile.mkdtemp(prefix="streamlab-backpressure-")
    db = os.path.join(folder, "streamlab.db")  # a throwaway store: these answers are nobody's
    if lm is None:
        from streamlab.lab.setups import runner

        with runner.serve(*policy.flags(), "--db", db, *server_args) as running:
            yield running.port
        return
    from streamlab.lab.setups.runner import serve_in_process

    with serve_in_process(lm, db_path=db, **policy.config()) as server:
        yield server.port


def _ours(snapshot: dict[str, Any], reader: SlowReader, route: str) -> tuple[dict | None, dict | None]:
    """The reader's connection and its generation, in a ``/debug/queues`` answer."""
    connection = next((c for c in snapshot["connections"] if c["peer"].endswith(f":{reader.local_port}")), None)
    request_id = reader.trace.request_id
    generations = snapshot["generations"]
    generation = next((g for g in generations if request_id is not None and g["id"] == request_id), None)
    if generation is None:
        generation = next((g for g in generations if g["path"] == route), None)
    return connection, generation


def run_policy(
    policy: Policy,
    *,
    lm: Any = None,
    server_args: Sequence[str] = (),
    route: str = ROUTE,
    prompt: str = PROMPT,
    max_tokens: int = MAX_TOKENS,
    duration: float = DURATION,
    rate: float = READ_RATE,
    rcvbuf: int = RCVBUF,
    mss: int | None = MSS,
    interval: float = INTERVAL,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One server, one slow reader, ``duration`` seconds of samples; then the reader leaves.

    Returns ``{"policy", "samples", "summary", "log"}``: a sample a row (``t``
    in seconds since the request), the summary of :func:`summarize`, and the
    server's ``/log`` record once it has finished with the request.
    """
    samples: list[dict[str, Any]] = []
    with _server(policy, lm, server_args) as port:
        reader = SlowReader(port, post_request(port, route, request_body(route, prompt, max_tokens)),
                            rate=rate, rcvbuf=rcvbuf, mss=mss)
        started = reader.trace.sent
        seen: dict[str, Any] = {}  # the last view of our generation (it leaves /debug/queues once finished)
        try:
            while (t := time.perf_counter() - started) < duration:
                snapshot = get_json_sync(port, "/debug/queues")
                connection, generation = _ours(snapshot, reader, route)
                seen = generation or seen
                samples.append({
                    "t": round(t, 3),
                    "tokens": seen.get("tokens", 0),
                    "queued": generation["queued"] if generation else 0,
                    "waiting": bool(generation and generation["waiting_for"] > 0),
                    "waited": seen.get("waited", 0.0),
                    "stopped_by": seen.get("stopped_by"),
                    "generation_ended": bool(seen.get("ended")),
                    "connected": connection is not None,  # False once the server has closed it (a write timeout)
                    "transport_bytes": connection["write_buffer"] if connection else 0,
                    "kernel_bytes": (connection["kernel_unsent"] or 0) if connection else 0,
                    "server_sent_bytes": connection["bytes_sent"] if connection else None,
                    "reader_unread_bytes": reader.unread() or 0,
                    "read_bytes": reader.bytes_read,
                    "read_pieces": reader.pieces,
                    "rss_bytes": snapshot["rss_bytes"],
                })
                if reader.ended:
                    break
                if progress is not None and len(samples) % max(1, int(10 / interval)) == 0:
                    s = samples[-1]
                    progress(f"{policy.name}: {t:5.1f} s  tokens {s['tokens']:5d}  read {s['read_pieces']:5d}"
                             f"  queued {s['queued']:4d}  transport {s['transport_bytes'] // 1024:3d} KiB"
                             f"  kernel {s['kernel_bytes'] // 1024:4d} KiB")
                time.sleep(max(0.0, started + len(samples) * interval - time.perf_counter()))
        finally:
            reader.close()
        request_id = reader.trace.request_id
        log = run_sync(wait_log(port, request_id, timeout=30)) if request_id else None
    return {"policy": policy.__dict__, "samples": samples, "summary": summarize(policy, samples, reader, log),
            "log": log}


def summarize(policy: Policy, samples: list[dict[str, Any]], reader: SlowReader, log: dict | None) -> dict[str, Any]:
    """One row: what was generated against what was read, the peaks of each buffer, how it ended."""
    last = samples[-1] if samples else {}
    # From the first token on: loading the model and its first forward pass are not the reader's doing.
    rss = [s["rss_bytes"] for s in samples if s["rss_bytes"] and s["tokens"] > 0]
    stopped_at = next((s["t"] for s in samples if s["stopped_by"]), None)
    was_connected = False
    cut_at = None
    for s in samples:
        if s["connected"]:
            was_connected = True
        elif was_connected:
            cut_at = s["t"]
            break
    return {
        "policy": policy.name,
        "max_queued": policy.max_queued or 0,
        "slow_reader_timeout": policy.slow_reader_timeout or 0,
        "write_timeout": policy.write_timeout,
        "seconds": last.get("t", 0.0),
        "tokens_generated": last.get("tokens", 0),
        "pieces_read": reader.pieces,
        "bytes_read": reader.bytes_read,
        "peak_queued": max((s["queued"] for s in samples), default=0),
        "peak_transport_kib": max((s["transport_bytes"] for s in samples), default=0) / 1024,
        "peak_kernel_kib": max((s["kernel_bytes"] for s in samples), default=0) / 1024,
        "rss_growth_mib": (max(rss) - rss[0]) / 2**20 if rss else 0.0,
        "waited_s": last.get("waited", 0.0),
        "stopped_at_s": stopped_at,
        "closed_at_s": cut_at,
        "stop_signal": (log or {}).get("stop_signal"),
        "stored_reason": (log or {}).get("stored_reason"),
        "reader_got_ending": reader.trace.complete or reader.trace.error is not None,
    }


def run(
    runs: Sequence[Policy] | None = None,
    *,
    lm: Any = None,
    progress: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Every policy (default :func:`policies`), each on a fresh server; ``kwargs`` go to :func:`run_policy`.

    Scripted servers (``--scripted-rate`` in ``server_args``) run side by side,
    each in its own process with one slow reader: every figure is per process
    and per connection, and a scripted source leaves the cores mostly idle.
    Model servers take turns, so that one's generating does not slow another's.
    """
    chosen = list(runs if runs is not None else policies())

    def one(policy: Policy) -> dict[str, Any]:
        if progress is not None:
            progress(f"{policy.name}: server {' '.join(policy.flags())}")
        return run_policy(policy, lm=lm, progress=progress, **kwargs)

    if lm is None and "--scripted-rate" in kwargs.get("server_args", ()) and len(chosen) > 1:
        with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
            results = list(pool.map(one, chosen))
    else:
        results = [one(policy) for policy in chosen]
    params = {k: v for k, v in kwargs.items() if k != "server_args"}
    return {"params": params, "model": "in-process" if lm is not None else "process", "runs": results}


SERIES = ("t", "tokens", "read_pieces", "queued", "transport_bytes", "kernel_bytes", "reader_unread_bytes",
          "read_bytes", "rss_bytes")


def report(result: dict[str, Any], *, params: dict[str, Any] | None = None, quiet: bool = False) -> Any:
    """The runs as a :class:`streamlab.lab.results.measures.Report` named ``backpressure``.

    Per policy: tokens generated and pieces read at the end (and their ratio,
    how far the model ran ahead), the peak queue, the peak transport and
    kernel buffers, the growth of the server's memory, the seconds it waited
    for its reader. One table of all of it; each run's time series in
    ``report.data["series"][policy]`` for the charts.
    """
    from streamlab.lab.results.measures import Report

    rep = Report("backpressure", params={**result["params"], **(params or {})}, quiet=quiet)
    rows = []
    rep.data["series"] = {}
    for one in result["runs"]:
        s = one["summary"]
        name = s["policy"]
        rep.figure(f"{name}.tokens_generated", s["tokens_generated"], "tokens")
        rep.figure(f"{name}.pieces_read", s["pieces_read"], "pieces")
        if s["pieces_read"]:
            rep.ratio(f"{name}.generated_per_read", s["tokens_generated"] / s["pieces_read"])
        rep.figure(f"{name}.peak_queued", s["peak_queued"], "pieces")
        rep.figure(f"{name}.peak_transport", s["peak_transport_kib"], "KiB")
        rep.figure(f"{name}.peak_kernel", s["peak_kernel_kib"], "KiB")
        rep.figure(f"{name}.rss_growth", s["rss_growth_mib"], "MiB")
        rep.figure(f"{name}.waited", s["waited_s"], "s")
        rows.append(s)
        rep.data["series"][name] = {key: [sample[key] for sample in one["samples"]] for key in SERIES}
        rep.data.setdefault("logs", {})[name] = one["log"]
    rep.table("policies", rows)
    return rep

