"""Every limit the server keeps, declared once: its name, default, unit and help; flags, ``ServerConfig`` and table follow.

A server that strangers can reach must bound everything they control: how
long they may take to send a request, how much they may send, how many
connections and generations they may hold, how long a WebSocket may sit
silent. Each bound below has a name, a default, a reason and a flag (as
python-websockets has ``max_size``, ``ping_interval`` and ``ping_timeout``,
and h11 ``max_incomplete_event_size``).

Each is a :class:`~streamlab.net.settings.Setting`, written once, with the
reason for its default beside it. ``ServerConfig``, the flags of ``python -m
streamlab serve`` (whose ``--help`` shows every default with its unit) and
the tables of ``docs/limits.md`` are all made from these declarations, and
the constants the rest of the server imports (``MAX_ACTIVE``...) are read
back from them, so a default changed here changes everywhere.
"""

from __future__ import annotations

import argparse

from streamlab.model.generation import PREFILL_CHUNK
from streamlab.net.errors import ArgumentParser
from streamlab.net.settings import Setting, Settings, config_values, fixed, flag_of, make_config

READ_SIZE = 65536  # bytes asked of the socket per read: a buffer size, not a limit
# The names a browser may use for this server. Any other Host is a page that
# rebound its own name to 127.0.0.1 (DNS rebinding) and must not be answered.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")

LISTENING = Settings(
    "Listening, and who may talk",
    Setting("host", "127.0.0.1", "", "listen on this address (127.0.0.1: this machine only; 0.0.0.0: every network)",
            metavar="ADDRESS"),
    Setting("port", 8000, "", "listen on this port (0 picks a free one, printed at start)", metavar="PORT"),
    Setting("allowed_origins", (), "", "also accept POSTs and WebSockets from this Origin, e.g. http://localhost:3000,"
            " besides the server's own (repeatable)", flag="--allow-origin", aliases=("--allowed-origin",),
            repeat=True, type=str, metavar="ORIGIN"),
    Setting("allowed_hosts", (), "", "also answer requests whose Host is NAME, besides 127.0.0.1, localhost and [::1]"
            " (repeatable)", flag="--allow-host", repeat=True, type=str, metavar="NAME"),
)

REQUESTS = Settings(
    "What a client may take and send",
    # A slowloris sends its request one byte every few seconds and holds the
    # connection for as long as the server lets it: the head and the body each
    # have a deadline from their first byte, however slowly they trickle.
    Setting("head_timeout", 10.0, "s", "the whole request head must arrive within S seconds of its first byte (408)"),
    Setting("body_timeout", 10.0, "s", "the whole body must arrive within S seconds once the head is in (408)"),
    Setting("idle_timeout", 75.0, "s", "close a kept-alive connection idle for S seconds between requests"),
    Setting("max_head", 16 * 1024, "bytes", "refuse a request head larger than N bytes (431)"),
    Setting("max_body", 1 << 20, "bytes", "refuse a request body larger than N bytes (413), before reading it"),
    Setting("max_connections", 100, "connections", "hold N open connections at most (503 with Retry-After beyond)"),
    # Connections the kernel may hold completed but not yet accepted. asyncio's
    # default is 100: a burst of a thousand readers overflows it, and each refused
    # SYN is retried by the client's kernel after 1 s, then 3 s, 7 s (uvicorn's
    # default is 2048, as here). The kernel caps it at net.core.somaxconn.
    Setting("backlog", 2048, "connections", "connections the kernel queues before the server accepts them"),
    # Generations running at once: the batch. Two dates from when generations
    # took turns on one lock (chapter 9 on threads, 2 cores, SmolLM2-135M, idle
    # first text 0.22 s: 2 readers at once got theirs in 0.30 s median, 4 in
    # 0.59 s), when more at once added no tokens/s, only waiting. The batched
    # engine (the default since) makes one forward pass for all of them. The
    # value to keep is the largest batch whose readers each stay under the 0.2 s
    # reading threshold per token on the machine that serves, with room for its
    # noise, on the slower of the two CPUs the course runs on. Measured with
    # benchmarks/load.py --engines batched --concurrency 8,16,24,32 --rounds 3
    # --tokens 64 (2026-12-02, 2 cores, quiet, the decode step of
    # model.fast_decode, each CPU's default format), the slowest reader's time
    # per token (the median of 3 rounds):
    #   native (AVX-512, int4):          34 ms at 8, 59 at 16,  74 at 24, 103 at 32
    #   AVX2 kernels (split-int4):       49 ms at 8, 92 at 16, 138 at 24, 169 at 32
    # and, as shipped with 16, beside llama.cpp (load.py --concurrency 1,8,16
    # --engines default,llama.cpp --rounds 5): 77 ms natively (63-99 over the
    # rounds) and 130 ms on AVX2 kernels (98-148). 16 stays under the threshold
    # in every round on both, a quarter of it free at the worst; 24 would not
    # keep that on AVX2. At 16 the server made 257 tokens/s natively and 167 on
    # AVX2, against 228 and 157 at 8 (on 2026-12-01, before the faster step,
    # the slowest reader at 16 took 169 ms and 8 was the value). So 16. Beyond
    # it readers wait in line (max_waiting, admission) rather than slow everyone down.
    Setting("max_active", 16, "generations", "run N generations at once; the others wait in line (or, with"
            " --admission refuse, get 503)"),
    # Ollama and vLLM queue what they cannot run yet, and so does this server: a
    # reader who asks is served, later, and told its place while it waits. The
    # line is bounded, since every waiting reader holds a connection: 64 is sized
    # for a classroom (a few dozen people asking at once), well inside the 100
    # connections a server holds.
    Setting("max_waiting", 64, "readers", "let N readers wait in line, first in, first out, for a generation"
            " to end (503 with Retry-After beyond; 0: no line)"),
    # refuse: 503 with Retry-After (WebSocket close 1013) at once to whoever
    # finds max_active generations running, as before the line existed;
    # chapter 9 compares the two.
    Setting("admission", "queue", "", "queue: past --max-active, wait in line; refuse: past --max-active,"
            " 503 at once", choices=("queue", "refuse")),
    # websockets' defaults, for an idle WebSocket (no generation streaming on it).
    Setting("ws_ping_interval", 20.0, "s", "ping an idle WebSocket after S silent seconds"),
    Setting("ws_ping_timeout", 20.0, "s", "close a WebSocket (1011) when no pong comes back within S seconds"),
    Setting("ws_idle_timeout", 60.0, "s", "close a WebSocket (1001) that sends no request for S seconds"),
)

STREAMING = Settings(
    "Streaming to a reader",
    Setting("ping_interval", 15.0, "s", "while streaming, send a keep-alive (an SSE comment, a WebSocket ping)"
            " after S silent seconds (0: off)"),
    # A reader that vanished without a word (a phone that lost its signal)
    # sends no EOF: only a write that cannot drain reveals it.
    Setting("write_timeout", 30.0, "s", "give up on a reader when one write cannot drain in S seconds (0: never)"),
    # A reader whose network vanished sends nothing: no FIN, no RST, and while the server's bytes fit in
    # the socket buffers no write fails either. At a model's pace (~2 KB/s of events) the buffers take
    # minutes to fill, so the write timeout alone notices late; the kernel, asked (TCP_USER_TIMEOUT), drops
    # the connection once sent bytes go unacknowledged this long, and keep-alive probes catch a silent one.
    # Chapter 5 measures both against a client cut off in a network namespace of its own. 30 s, as the write
    # timeout: a phone in a tunnel for less keeps its stream.
    Setting("tcp_user_timeout", 30.0, "s", "drop a connection whose sent bytes go unacknowledged for S seconds"
            " (TCP_USER_TIMEOUT; 0: the kernel's own retries, about 15 minutes)"),
    Setting("tcp_keepalive", 30.0, "s", "probe a connection silent for S seconds, and drop it when 3 probes go"
            " unanswered (TCP keep-alive; 0: off)"),
    # Backpressure (streamlab/model/backlog.py, benchmarks/backpressure.py). A reader
    # slower than the model leaves its bytes in the socket buffers first:
    # measured for a reader with a 4 KB window on a 1448-byte MSS, ~50 KB in the
    # server's kernel, growing to ~220 KB as the kernel tunes it, then 64 KiB in
    # asyncio's transport buffer (then send() waits in drain()). Only then do
    # pieces queue. max_queued bounds that queue: 256 pieces is ~17 s of the
    # model's output at 15 tokens/s (~70 KB of OpenAI chunks, the transport
    # buffer once more), so a reader who pauses for less (a background tab, a
    # busy client) never holds the model back, and one who falls behind for good
    # and then leaves has cost at most that much compute beyond what the buffers
    # hold. Queued pieces cost ~200 bytes each; what a generation running ahead
    # really holds is its KV cache (45 KiB a token on SmolLM2-135M). None:
    # unbounded, the model runs on however far behind the reader is.
    Setting("max_queued", 256, "pieces", "a generation runs at most N pieces ahead of its reader, then waits"
            " (0: unbounded)", none_at=0),
    # slow_reader_timeout: a generation kept waiting 60 s in all is stopped
    # (stored as slow_reader). A reader under ~1.6 KB/s is cut sooner by the 30 s
    # write timeout (one drain() must move 48 KiB); this stops the one that reads
    # steadily but stays behind, after holding a thread and a KV cache idle for a
    # minute: as long as the proxies in front wait for a silent upstream (nginx's
    # 60 s). None: a generation may wait for its reader for ever.
    Setting("slow_reader_timeout", 60.0, "s", "stop a generation that has waited S seconds in all for its reader"
            " to catch up (0: never)", none_at=0),
    Setting("accel_header", True, "", "omit 'X-Accel-Buffering: no', which asks nginx not to buffer the stream",
            flag="--no-accel-header", switch=True),
    Setting("naive", False, "", "never watch for departed clients: learn of one only when a write fails", switch=True),
)

GENERATING = Settings(
    "Generating, and what is kept",
    # How the local model runs its generations: "threads" (each its own thread,
    # taking turns on the model one forward pass of one token at a time) or
    # "batched" (streamlab/model/batching.py: one loop steps every generation together,
    # one forward pass for all). Batched is the default: measured with
    # `python benchmarks/load.py` (2026-12-01, 2 shared cores, SmolLM2-135M, 64
    # tokens per reader; figures move ~30% between runs here), 8 readers at once
    # got 45.0 tokens/s in all batched against 10.8 with threads (4.2x), each
    # reader a token every 162 ms (median) instead of every 722 ms, 28% of the
    # gaps over the 0.2 s a reader notices instead of all of them, the first token
    # in 1.1 s instead of 1.6 s (median); 16 readers 82 against 11 tokens/s. At 1
    # and 2 readers the two are even (14 vs 10, 11.5 vs 12 tokens/s). A model
    # that cannot be batched, like the tests' fake, runs threads.
    Setting("engine", "batched", "", "threads: a thread per generation, one token each per turn; batched: one loop,"
            " every generation in one batch", choices=("threads", "batched")),
    # The reason for 256 is PREFILL_CHUNK's, in streamlab/model/generation.py.
    Setting("prefill_chunk", PREFILL_CHUNK, "tokens", "read prompts N tokens at a time, letting other streams and"
            " stops in between (0: one pass)"),
    Setting("db_path", None, "", "the SQLite file of conversations", flag="--db", type=str, metavar="PATH",
            show="$STREAMLAB_DATA/streamlab.db, else your data folder"),
    Setting("flush_interval", 1.0, "s", "write partial answers to the file at most every S seconds"
            " (what a crash may lose)"),
    Setting("grace", 30.0, "s", "stop a /generations answer nobody has read for S seconds"),
    Setting("forget", False, "", "keep no /generations events: every reconnect generates the answer again",
            switch=True),
    Setting("keep_generations", 200, "generations", "keep the events of N /generations in memory for resuming;"
            " the oldest ended go first"),
    # Chapter 13: replicas behind a load balancer share one log, so a reconnect may land on any of them.
    Setting("events", None, "", "keep /generations in this Redis instead (redis://HOST:PORT), one log every"
            " replica shares; worker processes (python -m streamlab worker) generate them", metavar="URL",
            type=str, show="none: in this process's memory"),
)

EXPERIMENTS = Settings(
    "Faults to measure against",
    Setting("token_delay", 0.0, "s", "add S seconds per token (a slower model)"),
    Setting("fail_after", None, "tokens", "fail every generation after N tokens", type=int, show="never"),
    Setting("pause_after", None, "tokens", "go silent after token N ...", type=int, show="never", field=False),
    Setting("pause_seconds", 0.0, "s", "... for S seconds", field=False),
    Setting("pauses", {}, "", "{token: seconds} to go silent after (--pause-after and --pause-seconds set one)",
            flag=None, annotation=dict[int, float]),
)

COMMAND = Settings(
    "Where the tokens come from",
    Setting("model", None, "", "Hugging Face id or folder to load", metavar="MODEL",
            show="$STREAMLAB_MODEL, else the embedded model", field=False),
    Setting("precision", None, "", "the decode format the model runs in: float32, bfloat16, int8, int4, split-int8,"
            " split-int4, split-bfloat16 (split: the prompt read in float32, tokens decoded narrow; docs/model.md"
            " measures them)", metavar="FORMAT", show="$STREAMLAB_DTYPE, else the one measured best on this kind of CPU"
            " for the embedded model (make info says which), float32 for another, float16 on a GPU", field=False),
    Setting("upstream", None, "", "relay to this OpenAI-compatible server (vLLM, llama.cpp, Ollama, streamlab) instead"
            " of loading a model; its API key, if it needs one, from $STREAMLAB_UPSTREAM_KEY", metavar="URL",
            show="none: load a model", field=False),
    Setting("upstream_model", None, "", "the upstream's model name", metavar="NAME", show="the first it lists",
            field=False),
    Setting("scripted_rate", None, "tokens/s", "load no model: answer every request with a scripted text at this"
            " many tokens/s (to measure the server alone)", type=float, metavar="TOKENS_PER_S",
            show="none: a real model", field=False),
    Setting("exit_on_stdin_eof", False, "", "exit when stdin closes (the parent died)", switch=True, field=False),
    # One model load serving several configurations: the chapters start their servers so (a load is
    # seconds of imports each), and a line "stop PORT" on stdin closes one of them.
    Setting("also", (), "", "serve another listener from this process and its loaded model: FLAGS are its own serve"
            " flags (its port, store and limits; not the model's), e.g. --also='--port 8001 --naive'; unless they"
            " name them, a free port and a store beside the first's (streamlab-2.db, -3...) (repeatable)",
            repeat=True, type=str, metavar="FLAGS", field=False),
    # The standard library's loop by default: the server is pure Python, and what it costs is its own.
    # uvloop (libuv, in C) is what uvicorn picks by itself when it is installed, so benchmarks/many_streams.py
    # runs every stack, ours included, on one loop or the other (see command.loop_factory).
    Setting("loop", "asyncio", "", "the event loop: asyncio (the standard library's) or uvloop (libuv's, in C;"
            " not on Windows)", choices=("asyncio", "uvloop"), field=False),
)



FIXED = Settings(
    "Fixed in the code",
    fixed("max_json_depth", 32, "levels", "refuse JSON nested deeper (400); a generation request needs 2"),
    fixed("max_ws_message", 1 << 20, "bytes", "close a WebSocket (1009) whose message is larger"),
    fixed("ws_close_wait", 2.0, "s", "wait this long for the peer's CLOSE after sending ours"),
    fixed("linger_seconds", 1.0, "s", "keep reading this long after an error response, so the client sees it"
           " (ClientConnection.linger_and_close)"),
    fixed("retry_after", 1, "s", "the Retry-After of a 503"),
    fixed("retry_ms", 1000, "ms", "SSE \"retry:\": how soon an EventSource reconnects after a drop"),
    fixed("max_log_records", 1000, "records", "the /log keeps this many, the oldest going first"),
)

CONFIG = (LISTENING, REQUESTS, STREAMING, GENERATING, EXPERIMENTS)  # the groups ServerConfig's fields come from
SETTINGS = (*CONFIG, COMMAND, FIXED)  # every group, for --help and docs/limits.md

ServerConfig = make_config(
    "ServerConfig", *CONFIG, module=__name__,
    doc="Everything the command-line flags set (see ``parse_args``); every field a declaration above.",
)

# The names the rest of the server (and the chapters) import, read back from the declarations.
MAX_HEAD = REQUESTS.default("max_head")
MAX_BODY = REQUESTS.default("max_body")
HEAD_TIMEOUT = REQUESTS.default("head_timeout")
BODY_TIMEOUT = REQUESTS.default("body_timeout")
IDLE_TIMEOUT = REQUESTS.default("idle_timeout")
MAX_CONNECTIONS = REQUESTS.default("max_connections")
LISTEN_BACKLOG = REQUESTS.default("backlog")
MAX_ACTIVE = REQUESTS.default("max_active")
MAX_WAITING = REQUESTS.default("max_waiting")
ADMISSIONS = REQUESTS["admission"].choices
ADMISSION = REQUESTS.default("admission")
WS_PING_INTERVAL = REQUESTS.default("ws_ping_interval")
WS_PING_TIMEOUT = REQUESTS.default("ws_ping_timeout")
WS_IDLE_TIMEOUT = REQUESTS.default("ws_idle_timeout")
MAX_QUEUED = STREAMING.default("max_queued")
SLOW_READER_TIMEOUT = STREAMING.default("slow_reader_timeout")
ENGINES = GENERATING["engine"].choices
ENGINE = GENERATING.default("engine")
KEEP_GENERATIONS = GENERATING.default("keep_generations")
MAX_JSON_DEPTH = FIXED.default("max_json_depth")
MAX_WS_MESSAGE = FIXED.default("max_ws_message")
WS_CLOSE_WAIT = FIXED.default("ws_close_wait")
LINGER_SECONDS = FIXED.default("linger_seconds")
RETRY_AFTER = FIXED.default("retry_after")
RETRY_MS = FIXED.default("retry_ms")
MAX_LOG_RECORDS = FIXED.default("max_log_records")


def flag(name: str) -> str:
    """The ``serve`` flag that changes the setting ``name``: a refusal at a limit names it, read from here."""
    return flag_of(name, *SETTINGS)


def build_parser() -> argparse.ArgumentParser:
    """``python -m streamlab serve``'s flags, a section per group, every default shown with its unit."""
    p = ArgumentParser(
        prog="python -m streamlab serve", description="Serve the model over HTTP, SSE and WebSocket.",
        epilog="Every limit as a table: docs/limits.md.",
    )
    for group in SETTINGS:
        group.add_to(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)

    def flags(*names: str) -> str:
        named = [flag(name) for name in names]
        return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"

    if args.max_active < 1 or args.max_connections < 1 or args.backlog < 1:
        p.error(f"{flags('max_active', 'max_connections', 'backlog')} must be at least 1")
    if args.max_head < 1 or args.max_body < 0 or args.keep_generations < 0:
        p.error(f"{flag('max_head')} must be at least 1, {flags('max_body', 'keep_generations')} cannot be negative")
    if args.max_queued < 0 or args.slow_reader_timeout < 0:
        p.error(f"{flags('max_queued', 'slow_reader_timeout')} cannot be negative (0: no limit)")
    if args.max_waiting < 0:
        p.error(f"{flag('max_waiting')} cannot be negative (0: no line)")
    if args.events is not None and (args.forget or not args.events.startswith(("redis://", "rediss://", "unix://"))):
        p.error(f"{flag('events')} takes a Redis URL (redis://HOST:PORT), and no {flag('forget')} (the shared log"
                " keeps every event)")
    if args.scripted_rate is not None and (args.scripted_rate <= 0 or args.upstream):
        p.error(f"{flag('scripted_rate')} takes a positive number of tokens/s, and no {flag('upstream')}")
    return args


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The config the parsed flags describe; the one pause the two --pause flags name becomes ``pauses``."""
    values = config_values(args, *CONFIG)
    if args.pause_after is not None and args.pause_seconds > 0:
        values["pauses"] = {args.pause_after: args.pause_seconds}
    return ServerConfig(**values)
