"""What streaming adds to the model: measured against a bare loop, and from piece to socket.

Two questions, each answered side by side in one run:

1. **The model side.** A bare greedy loop (one forward pass per token, the KV
   cache carried, argmax) is the least any server could do. ``Generation``
   adds a thread, the fair model lock, seeded nucleus sampling with a
   repetition penalty, the incremental detokenizer, stop sequences and the
   hand-over to asyncio. :func:`model_overhead` runs it and the bare loop on
   the same prompt and model, round after round, and compares time to the
   first token and tokens/s; on request also the batched engine with one
   generation (the server's default driver), and one reader of ``/stream``
   on a real ``serve`` process (its default engine, the model in that
   process, the reader here). Each round runs every way once, in an order
   that turns by one each round, and each way's tokens/s is divided by the
   bare loop's *of the same round*: the machine is shared, its load moves
   by tens of percent within a minute, and a ratio of neighbours cancels
   most of that. The ratios' median is the figure, their spread the doubt.
2. **The server side.** From the moment the generation thread has a piece to
   the moment the client's socket has it: the hand-over to the event loop,
   the wire format, the write, loopback, the client's read.
   :func:`server_overhead` runs a real :class:`~streamlab.server.app.Server` in
   this process, notes each piece's making time (``Piece.time``, the
   monotonic clock), and reads the stream from a *separate process* (so the
   client does not share the server's interpreter lock), which notes each
   event's arrival on the same clock (``time.perf_counter`` is
   ``CLOCK_MONOTONIC`` on Linux: one clock for every process): as its
   ``recv`` returns (:func:`read_at_socket`), and, on request, as the
   library's asyncio client sees it, a few turns of that client's loop later.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from streamlab.client.metrics import percentile

PROMPT = "Explain in a few sentences why the sky is blue, for a curious child."


@dataclass
class Run:
    """One pass: seconds to the first token, and tokens per second after it."""

    ttft: float
    tokens_per_s: float
    tokens: int


def bare_loop(lm: Any, prompt_ids: Sequence[int], tokens: int) -> Run:
    """The least a server could do: forward, argmax, feed it back; no thread, no sampling, no text."""
    import inspect

    import torch

    # The cache under the name this transformers takes (renamed in transformers 5), as the drivers pass it:
    # the old name goes through a deprecation wrapper on every call.
    cache_arg = "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"
    started = time.perf_counter()
    times: list[float] = []
    past = None
    inputs = torch.tensor([list(prompt_ids)], dtype=torch.long, device=lm.device)
    with torch.inference_mode():
        for _ in range(tokens):
            out = lm.model(input_ids=inputs, use_cache=True, logits_to_keep=1, **{cache_arg: past})
            past = out[cache_arg] if cache_arg in out else out.past_key_values
            token = int(out.logits[0, -1].argmax())
            times.append(time.perf_counter())
            inputs = torch.tensor([[token]], dtype=torch.long, device=lm.device)
    return _run(started, times)


def generation_run(lm: Any, prompt_ids: Sequence[int], tokens: int) -> Run:
    """The same prompt through ``Generation``: its thread, lock, sampler, detokenizer and hand-over."""
    from streamlab.model.generation import generate_text

    started = time.perf_counter()
    result = generate_text(lm, prompt_ids=list(prompt_ids), max_tokens=tokens, ignore_eos=True)
    return _run(started, result.token_times)


def batched_run(engine: Any, prompt_ids: Sequence[int], tokens: int) -> Run:
    """The same prompt as the one generation of a :class:`~streamlab.model.batching.BatchedEngine` (a batch of one)."""
    from streamlab.model.generation import Generation
    from streamlab.net.aio import run_sync

    async def main() -> Any:
        gen = Generation(engine.lm, prompt_ids=list(prompt_ids), max_tokens=tokens, ignore_eos=True, scheduler=engine)
        async for _ in gen:
            pass
        return await gen.wait()

    started = time.perf_counter()
    result = run_sync(main())
    return _run(started, result.token_times)


def stream_run(port: int, prompt: str, tokens: int) -> Run:
    """One reader of ``/stream``: first token from the request's sending, tokens/s from the text events' arrivals.

    It counts pieces, which are tokens here: the prompt's answer is English,
    no character spans two tokens. ``Run.tokens`` is the pieces counted, to
    hold against the tokens asked for.
    """
    from streamlab.client import timed as client
    from streamlab.client import wire

    trace = asyncio.run(client.post(port, "/stream", wire.request_body(prompt, tokens, ignore_eos=True)))
    arrivals = [trace.sent + e.t for e in trace.events if e.kind == "text" and e.text]
    if not arrivals:
        raise RuntimeError(f"/stream on port {port} sent no text: {trace.events[-3:]}")
    return _run(trace.sent, arrivals)


def _run(started: float, times: list[float]) -> Run:
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return Run(ttft=times[0] - started, tokens_per_s=rate, tokens=len(times))


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles, extremes and the values themselves: what a figure from noisy rounds needs beside it."""
    data = list(values)
    return {
        "median": statistics.median(data) if data else float("nan"),
        "q1": percentile(data, 25),
        "q3": percentile(data, 75),
        "min": min(data, default=float("nan")),
        "max": max(data, default=float("nan")),
        "values": data,
    }


def in_new_thread(function: Any, *args: Any) -> Any:
    """``function(*args)`` on a thread of its own, as ``Generation`` runs the model: returns its result.

    Each thread that calls into torch gets its own OpenMP team of worker threads,
    and a team's workers spin for a while after their work is done. A bare loop
    run on the main thread right after a generation's thread had the model was
    measured 20x slower (3.3 s to the first token instead of 0.16 s) while the
    other team spun on the same two cores. On a fresh thread each, both ways
    start alike.
    """
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = function(*args)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            out["error"] = exc

    from streamlab.model.openmp import release_idle_team

    release_idle_team()  # as a server does before its model's thread: one OpenMP team in the process
    thread = threading.Thread(target=run, name="streamlab-bare-loop")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


BARE, GENERATION, BATCHED, STREAM = "bare loop", "Generation", "batched engine, one", "/stream on serve"


def model_overhead(lm: Any, *, tokens: int = 64, rounds: int = 5, prompt: str = PROMPT, batched: bool = False,
                   stream_port: int | None = None) -> dict[str, Any]:
    """The bare loop and ``Generation`` (and on request the others), ``rounds`` rounds after one warm-up each.

    ``batched``: also a :class:`~streamlab.model.batching.BatchedEngine` with
    this one generation (one engine for every round, as a server keeps
    one). ``stream_port``: also one reader of ``/stream`` on the server
    listening there (see :func:`stream_run`; start it with the same model).
    The bare loop and ``Generation`` run the model on a new thread each
    time (see :func:`in_new_thread`); the engine's thread is its own.

    ``ways`` holds each way's medians and runs; ``ratios`` each way's
    tokens/s over the bare loop's of the same round (:func:`spread` of
    them); ``bare_spread`` the bare loop's own tokens/s from round to round,
    which says how noisy the machine was.
    """
    from streamlab.model.generation import encode_prompt

    ids = encode_prompt(lm.tokenizer, prompt)
    ways: dict[str, Callable[[int], Run]] = {
        BARE: lambda n: in_new_thread(bare_loop, lm, ids, n),
        GENERATION: lambda n: generation_run(lm, ids, n),
    }
    if batched:
        from streamlab.model.batching import BatchedEngine

        engine = BatchedEngine(lm)
        ways[BATCHED] = lambda n: batched_run(engine, ids, n)
    if stream_port is not None:
        ways[STREAM] = lambda n: stream_run(stream_port, prompt, n)
    for way in ways.values():
        way(min(tokens, 8))
    names = list(ways)
    runs: dict[str, list[Run]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # each way first as often as the others
            runs[name].append(ways[name](tokens))
    summary = {
        name: {
            "ttft_s": statistics.median(run.ttft for run in rs),
            "tokens_per_s": statistics.median(run.tokens_per_s for run in rs),
            "runs": [vars(run) for run in rs],
        }
        for name, rs in runs.items()
    }
    bare_rates = [run.tokens_per_s for run in runs[BARE]]
    ratios = {name: spread([run.tokens_per_s / b for run, b in zip(runs[name], bare_rates)])
              for name in names if name != BARE}
    bare, ours = summary[BARE], summary[GENERATION]
    return {
        "prompt_tokens": len(ids),
        "tokens": tokens,
        "rounds": rounds,
        "ways": summary,
        "ratios": ratios,
        "bare_spread": spread(bare_rates),
        "ttft_extra_ms": (ours["ttft_s"] - bare["ttft_s"]) * 1e3,
        "ttft_extra_rounds_ms": [(o.ttft - b.ttft) * 1e3 for o, b in zip(runs[GENERATION], runs[BARE])],
        "tokens_per_s_ratio": ratios[GENERATION]["median"],
    }


# -- the server side ----------------------------------------------------------------------------


class _Recording:
    """Wraps a token source: every generation it makes notes when each of its pieces was made.

    It watches through ``Generation.observers``, which sees each piece as its
    driver hands it over, so the times are the model side's own and nothing
    of the generation is replaced.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self.made: list[list[float]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def generation(self, *args: Any, **kwargs: Any) -> Any:
        gen = self.source.generation(*args, **kwargs)
        made: list[float] = []
        self.made.append(made)
        gen.observers.append(lambda piece: made.append(piece.time))
        return gen


READERS = ("socket", "asyncio")


def read_arrivals(route: str, port: int, prompt: str, tokens: int, reader: str = "asyncio") -> list[float]:
    """In a separate process: read one answer over ``route`` and return each text event's arrival (monotonic).

    ``reader``: ``asyncio``, the library's client (:mod:`streamlab.client`), as
    the chapters read; ``socket``, a blocking socket that notes the time as
    each ``recv`` returns (:func:`read_at_socket`).
    """
    if reader not in READERS:
        raise ValueError(f"reader is one of {READERS}, not {reader!r}")
    out = subprocess.run(
        [sys.executable, "-m", "streamlab.lab.experiments.overhead", "client", route, str(port), str(tokens), prompt, reader],
        capture_output=True, text=True, timeout=300, check=True,
    )
    return json.loads(out.stdout)


def read_at_socket(route: str, port: int, prompt: str, tokens: int) -> list[float]:
    """Each text event's arrival, timed when the ``recv`` that brought it returned: a blocking socket, no event loop.

    The library's asyncio client notes a read's time a few turns of its loop
    after the bytes came (each read is wrapped in ``wait_for``, a task and a
    timer): 0.2-0.3 ms later than this reader, measured side by side on the
    2-core machine. That is the reader's time, not the server's; this reader
    leaves only the kernel's wake-up and one ``recv`` between the bytes
    reaching the socket and the clock.
    """
    import socket

    from streamlab.client.tracing import ResponseRecorder, Trace, record_message
    from streamlab.client.wire import post_request, request_body
    from streamlab.protocol import websocket as ws
    from streamlab.protocol import websocket_handshake

    trace = Trace(way=route.strip("/"))
    body = request_body(prompt, tokens, ignore_eos=True)
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def recv() -> tuple[bytes, float]:
            data = sock.recv(65536)
            return data, trace.got_bytes(len(data))

        trace.sent = time.perf_counter()
        if route != "/ws":
            sock.sendall(post_request(port, route, body))
            reading = ResponseRecorder(trace)
            while not reading.done:
                data, t = recv()
                if not data:
                    reading.eof()
                    break
                reading.feed(data, t)
        else:
            key = websocket_handshake.new_key()
            sock.sendall(websocket_handshake.client_handshake(f"127.0.0.1:{port}", route, key))
            head = ResponseRecorder(trace, "GET")
            while trace.status is None:
                data, t = recv()
                if not data:
                    raise ConnectionError("closed during the WebSocket handshake")
                head.feed(data, t)
            websocket_handshake.check_server_response(trace.status, trace.headers, key)
            conn = ws.Connection(client=True)
            sock.sendall(conn.send_text(json.dumps(body, ensure_ascii=False)))
            data, t = head.head.rest, trace.now()
            while not conn.close_received:
                for event in conn.receive(data):
                    if isinstance(event, ws.TextMessage):
                        record_message(trace, event.text, len(event.text.encode("utf-8")), t)
                    elif isinstance(event, ws.Ping):
                        sock.sendall(conn.send_pong(event.payload))
                if conn.close_received:
                    sock.sendall(conn.send_close(1000))
                    break
                data, t = recv()
                if not data:
                    break
    return [trace.sent + e.t for e in trace.events if e.kind == "text" and e.text]


def server_overhead(lm: Any, *, tokens: int = 64, rounds: int = 3, routes: Sequence[str] = ("/stream", "/ws"),
                    prompt: str = PROMPT, readers: Sequence[str] = ("socket",)) -> dict[str, Any]:
    """Piece made → client socket got it, per piece, for each route and reader; median and p99 in ms.

    The server runs here with its default engine; the routes (and readers,
    see :func:`read_arrivals`) take turns within each round, so that the
    machine's load falls on all alike. ``routes`` holds the first reader's
    figures, ``readers`` every reader's; ``round_medians_ms`` is the spread
    of each round's own median.
    """
    from streamlab.lab.setups.runner import serve_in_process
    from streamlab.server.answers.sources import source_for

    runs = [(route, reader) for reader in readers for route in routes]
    recording = _Recording(source_for(lm))
    latencies: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    medians: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    p99s: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    mismatched = dict.fromkeys(runs, 0)
    with serve_in_process(recording, max_active=4) as server:
        for r in range(rounds):
            for route, reader in runs[r % len(runs):] + runs[: r % len(runs)]:  # each takes its turn first
                before = len(recording.made)
                arrivals = read_arrivals(route, server.port, prompt, tokens, reader)
                made = recording.made[before] if len(recording.made) > before else []
                if len(made) != len(arrivals):
                    mismatched[route, reader] += 1
                delays = [(got - at) * 1e3 for at, got in zip(made, arrivals)]
                latencies[route, reader] += delays
                if delays:
                    medians[route, reader].append(statistics.median(delays))
                    p99s[route, reader].append(percentile(delays, 99))
    results: dict[str, dict[str, Any]] = {reader: {} for reader in readers}
    for (route, reader), values in latencies.items():
        results[reader][route] = {
            "pieces": len(values),
            "median_ms": statistics.median(values) if values else float("nan"),
            "p99_ms": percentile(values, 99),
            "max_ms": max(values, default=float("nan")),
            "round_medians_ms": spread(medians[route, reader]),
            "round_medians": medians[route, reader], "round_p99s": p99s[route, reader],
            "mismatched_runs": mismatched[route, reader],
            "latencies_ms": values,
        }
    return {"tokens": tokens, "rounds": rounds, "routes": results[readers[0]], "readers": results}


def _client(route: str, port: int, tokens: int, prompt: str, reader: str = "asyncio") -> list[float]:
    from streamlab.client import timed as client
    from streamlab.client import timed_websocket
    from streamlab.client import wire

    if reader == "socket":
        return read_at_socket(route, port, prompt, tokens)
    if route == "/ws":
        trace = asyncio.run(timed_websocket.websocket(port, prompt, tokens, ignore_eos=True))
    else:
        trace = asyncio.run(client.post(port, route, wire.request_body(prompt, tokens, ignore_eos=True)))
    return [trace.sent + e.t for e in trace.events if e.kind == "text" and e.text]


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "client":
        print(json.dumps(_client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], *sys.argv[6:7])))
    else:
        print("usage: python -m streamlab.lab.experiments.overhead client ROUTE PORT TOKENS PROMPT [socket|asyncio]"
              " (see benchmarks/overhead.py)")
        sys.exit(2)
