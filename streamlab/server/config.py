"""Every limit the server keeps, as a named default with a flag: the command line and ``ServerConfig``.

A server that strangers can reach must bound everything they control: how
long they may take to send a request, how much they may send, how many
connections and generations they may hold, how long a WebSocket may sit
silent. Each bound below has a name, a default, a reason and a flag (as
python-websockets has ``max_size``, ``ping_interval`` and ``ping_timeout``,
and h11 ``max_incomplete_event_size``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from streamlab.model.generation import PREFILL_CHUNK

MAX_HEAD = 16 * 1024  # a request head larger than this is refused with 431
MAX_BODY = 1 << 20  # a request body larger than this is refused with 413, before it is read
MAX_JSON_DEPTH = 32  # JSON nested deeper than this is refused with 400 (a generation request needs 2)
MAX_WS_MESSAGE = 1 << 20  # a WebSocket message larger than this closes with 1009
READ_SIZE = 65536
HEAD_TIMEOUT = 10.0  # seconds from a request's first byte to the end of its head (else 408): slowloris
BODY_TIMEOUT = 10.0  # seconds to receive the whole body once the head is in (else 408)
IDLE_TIMEOUT = 75.0  # seconds a kept-alive connection may wait for its next request
MAX_CONNECTIONS = 100  # open connections; the next one gets 503 with Retry-After
# Connections the kernel may hold completed but not yet accepted. asyncio's
# default is 100: a burst of a thousand readers overflows it, and each refused
# SYN is retried by the client's kernel after 1 s, then 3 s, 7 s (uvicorn's
# default is 2048, as here). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 2048
# Generations running at once. The bound is on each admitted reader's first
# text: a newcomer's prompt is read (in chunks, one prompt at a time) between
# the others' steps, so it waits longer the more are running. Measured in
# chapter 9 on threads (2 cores, SmolLM2-135M; idle first text 0.22 s): 2
# readers at once got theirs in 0.30 s (median) and 0.40 s (worst), 4 in
# 0.59 s and 0.90 s. The batched engine (the default since) keeps each
# reader's time per token near 160-190 ms up to 16 readers, far better than
# threads, but its first texts under a burst were no better (4 at once: 1.4 s
# median, benchmarks/load.py), since prompts are still read one at a time.
# Two keeps an admitted reader within 2x of an idle server; --max-active
# raises it (a naive server needs room for the generations it keeps running
# for nobody).
MAX_ACTIVE = 2
# How the local model runs its generations: "threads" (each its own thread,
# taking turns on the model one forward pass of one token at a time) or
# "batched" (streamlab/batching.py: one loop steps every generation together,
# one forward pass for all). Batched is the default: measured with
# `python benchmarks/load.py` (2026-12-01, 2 shared cores, SmolLM2-135M, 64
# tokens per reader; figures move ~30% between runs here), 8 readers at once
# got 45.0 tokens/s in all batched against 10.8 with threads (4.2x), each
# reader a token every 162 ms (median) instead of every 722 ms, 28% of the
# gaps over the 0.2 s a reader notices instead of all of them, the first token
# in 1.1 s instead of 1.6 s (median); 16 readers 82 against 11 tokens/s. At 1
# and 2 readers the two are even (14 vs 10, 11.5 vs 12 tokens/s).
ENGINES = ("threads", "batched")
ENGINE = "batched"
# Backpressure (streamlab/backlog.py, benchmarks/backpressure.py). A reader
# slower than the model leaves its bytes in the socket buffers first: measured
# for a reader with a 4 KB window on a 1448-byte MSS, ~50 KB in the server's
# kernel, growing to ~220 KB as the kernel tunes it, then 64 KiB in asyncio's
# transport buffer (then send() waits in drain()). Only then do pieces queue.
# MAX_QUEUED bounds that queue: 256 pieces is ~17 s of the model's output at
# 15 tokens/s (~70 KB of OpenAI chunks, the transport buffer once more), so a
# reader who pauses for less (a background tab, a busy client) never holds the
# model back, and one who falls behind for good and then leaves has cost at most
# that much compute beyond what the buffers hold. Queued pieces cost ~200 bytes
# each; what a generation running ahead really holds is its KV cache (45 KiB a
# token on SmolLM2-135M). SLOW_READER_TIMEOUT: a generation kept waiting 60 s in
# all is stopped (stored as slow_reader). A reader under ~1.6 KB/s is cut
# sooner by the 30 s write timeout (one drain() must move 48 KiB); this stops the
# one that reads steadily but stays behind, after holding a thread and a KV cache
# idle for a minute: as long as the proxies in front wait for a silent upstream
# (nginx's 60 s).
MAX_QUEUED = 256
SLOW_READER_TIMEOUT = 60.0
RETRY_AFTER = 1  # seconds, in the Retry-After of a 503
WS_PING_INTERVAL = 20.0  # an idle WebSocket is pinged after this many silent seconds (websockets' default)
WS_PING_TIMEOUT = 20.0  # ... and closed with 1011 when no pong comes back within this (websockets' default)
WS_IDLE_TIMEOUT = 60.0  # a WebSocket that sends no request for this long is closed (1001)
WS_CLOSE_WAIT = 2.0  # how long to wait for the peer's CLOSE after sending ours
LINGER_SECONDS = 1.0  # how long to keep reading after an error response (see ClientConnection.linger_and_close)
MAX_LOG_RECORDS = 1000
KEEP_GENERATIONS = 200  # /generations whose events stay in memory for resuming; the oldest ended go first
RETRY_MS = 1000  # SSE "retry:": how soon an EventSource reconnects after a drop
# The names a browser may use for this server. Any other Host is a page that
# rebound its own name to 127.0.0.1 (DNS rebinding) and must not be answered.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclass
class ServerConfig:
    """Everything the command-line flags set (see ``parse_args``)."""

    host: str = "127.0.0.1"
    port: int = 8000
    naive: bool = False
    ping_interval: float = 15.0  # SSE comment / WebSocket ping after this many silent seconds while streaming
    write_timeout: float = 30.0
    accel_header: bool = True
    pauses: dict[int, float] = field(default_factory=dict)
    fail_after: int | None = None
    token_delay: float = 0.0
    allowed_origins: tuple[str, ...] = ()  # besides the server's own origin
    allowed_hosts: tuple[str, ...] = ()  # besides the loopback names
    db_path: str | None = None  # None: the store's default (STREAMLAB_DATA, else the user's data folder)
    flush_interval: float = 1.0  # seconds of text a crash may lose
    grace: float = 30.0  # seconds a /generations answer runs on with nobody reading
    forget: bool = False  # keep no events: a reconnect to /generations starts over
    keep_generations: int = KEEP_GENERATIONS
    head_timeout: float = HEAD_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    backlog: int = LISTEN_BACKLOG
    max_active: int = MAX_ACTIVE
    prefill_chunk: int = PREFILL_CHUNK
    ws_ping_interval: float = WS_PING_INTERVAL
    ws_ping_timeout: float = WS_PING_TIMEOUT
    ws_idle_timeout: float = WS_IDLE_TIMEOUT
    max_head: int = MAX_HEAD
    max_body: int = MAX_BODY
    engine: str = ENGINE  # "threads" or "batched" (a model that cannot be batched, like the tests' fake, runs threads)
    max_queued: int | None = MAX_QUEUED  # None: unbounded, the model runs on however far behind the reader is
    slow_reader_timeout: float | None = SLOW_READER_TIMEOUT  # None: a generation may wait for its reader for ever


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m streamlab serve", description="Serve the model over HTTP, SSE and WebSocket."
    )
    add = p.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=8000, help="0 picks a free port")
    add("--model", default=None, help="Hugging Face id or folder (default: STREAMLAB_MODEL or the embedded model)")
    add("--naive", action="store_true", help="never watch for departed clients")
    add("--upstream", default=None, metavar="URL",
        help="relay to this OpenAI-compatible server (vLLM, llama.cpp, Ollama, streamlab) instead of loading a model;"
        " its API key, if it needs one, from $STREAMLAB_UPSTREAM_KEY")
    add("--upstream-model", default=None, metavar="NAME", help="the upstream's model name (default: the first it lists)")
    add("--scripted-rate", type=float, default=None, metavar="TOKENS_PER_S",
        help="load no model: answer every request with a scripted text at this many tokens/s (to measure the server alone)")
    add("--ping-interval", type=float, default=15.0, help="keep-alive after this many silent seconds (0: off)")
    add("--write-timeout", type=float, default=30.0, help="give up on a write after this many seconds (0: never)")
    add("--no-accel-header", action="store_true", help="omit 'X-Accel-Buffering: no'")
    add("--pause-after", type=int, default=None, metavar="N", help="go silent after token N ...")
    add("--pause-seconds", type=float, default=0.0, metavar="S", help="... for S seconds")
    add("--fail-after", type=int, default=None, metavar="N", help="fail every generation after N tokens")
    add("--token-delay", type=float, default=0.0, metavar="S", help="extra seconds per token (a slower model)")
    add("--allow-origin", "--allowed-origin", dest="allow_origin", action="append", default=[], metavar="ORIGIN",
        help="also accept POSTs and WebSockets from this Origin, e.g. http://localhost:3000 (repeatable)")
    add("--allow-host", action="append", default=[], metavar="NAME",
        help="also answer requests whose Host is NAME (besides 127.0.0.1, localhost, [::1]; repeatable)")
    add("--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (the parent died)")
    add("--db", default=None, metavar="PATH",
        help="SQLite file of conversations (default: $STREAMLAB_DATA/streamlab.db, else your data folder)")
    add("--flush-interval", type=float, default=1.0, metavar="S",
        help="write partial answers to the file at most every S seconds (what a crash may lose)")
    add("--grace", type=float, default=30.0, metavar="S", help="stop a /generations answer nobody has read for S seconds")
    add("--forget", action="store_true", help="keep no /generations events: every reconnect generates the answer again")
    add("--head-timeout", type=float, default=HEAD_TIMEOUT, metavar="S", help="whole request head within S seconds (408)")
    add("--body-timeout", type=float, default=BODY_TIMEOUT, metavar="S", help="whole request body within S seconds (408)")
    add("--idle-timeout", type=float, default=IDLE_TIMEOUT, metavar="S", help="close a kept-alive connection idle for S seconds")
    add("--max-connections", type=int, default=MAX_CONNECTIONS, metavar="N", help="open connections at most (503 beyond)")
    add("--backlog", type=int, default=LISTEN_BACKLOG, metavar="N",
        help="connections the kernel queues before the server accepts them")
    add("--max-active", type=int, default=MAX_ACTIVE, metavar="N", help="generations running at once (503 beyond)")
    add("--engine", choices=ENGINES, default=ENGINE,
        help="threads: a thread per generation, one token each per turn; batched: one loop, every generation in one batch")
    add("--prefill-chunk", type=int, default=PREFILL_CHUNK, metavar="N",
        help="read prompts N tokens at a time, letting other streams and stops in between (0: one pass)")
    add("--ws-ping-interval", type=float, default=WS_PING_INTERVAL, metavar="S", help="ping an idle WebSocket after S seconds")
    add("--ws-ping-timeout", type=float, default=WS_PING_TIMEOUT, metavar="S", help="close (1011) when no pong within S seconds")
    add("--ws-idle-timeout", type=float, default=WS_IDLE_TIMEOUT, metavar="S", help="close (1001) a WebSocket silent for S seconds")
    add("--max-queued", type=int, default=MAX_QUEUED, metavar="N",
        help="a generation runs at most N pieces ahead of its reader, then waits (0: unbounded)")
    add("--slow-reader-timeout", type=float, default=SLOW_READER_TIMEOUT, metavar="S",
        help="stop a generation that has waited S seconds in all for its reader to catch up (0: never)")
    args = p.parse_args(argv)
    if args.max_active < 1 or args.max_connections < 1 or args.backlog < 1:
        p.error("--max-active, --max-connections and --backlog must be at least 1")
    if args.max_queued < 0 or args.slow_reader_timeout < 0:
        p.error("--max-queued and --slow-reader-timeout cannot be negative (0: no limit)")
    if args.scripted_rate is not None and (args.scripted_rate <= 0 or args.upstream):
        p.error("--scripted-rate takes a positive number of tokens/s, and no --upstream")
    return args


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    pauses = {args.pause_after: args.pause_seconds} if args.pause_after is not None and args.pause_seconds > 0 else {}
    return ServerConfig(
        host=args.host,
        port=args.port,
        naive=args.naive,
        ping_interval=args.ping_interval,
        write_timeout=args.write_timeout,
        accel_header=not args.no_accel_header,
        pauses=pauses,
        fail_after=args.fail_after,
        token_delay=args.token_delay,
        allowed_origins=tuple(args.allow_origin),
        allowed_hosts=tuple(args.allow_host),
        db_path=args.db,
        flush_interval=args.flush_interval,
        grace=args.grace,
        forget=args.forget,
        head_timeout=args.head_timeout,
        body_timeout=args.body_timeout,
        idle_timeout=args.idle_timeout,
        max_connections=args.max_connections,
        backlog=args.backlog,
        max_active=args.max_active,
        prefill_chunk=args.prefill_chunk,
        engine=args.engine,
        ws_ping_interval=args.ws_ping_interval,
        ws_ping_timeout=args.ws_ping_timeout,
        ws_idle_timeout=args.ws_idle_timeout,
        max_queued=args.max_queued or None,
        slow_reader_timeout=args.slow_reader_timeout or None,
    )
