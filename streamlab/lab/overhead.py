"""What streaming adds to the model: measured against a bare loop, and from piece to socket.

Two questions, each answered side by side in one run:

1. **The model side.** A bare greedy loop (one forward pass per token, the KV
   cache carried, argmax) is the least any server could do. ``Generation``
   adds a thread, the fair model lock, seeded nucleus sampling with a
   repetition penalty, the incremental detokenizer, stop sequences and the
   hand-over to asyncio. :func:`model_overhead` runs both on the same prompt
   and model, alternating, and compares time to the first token and tokens/s.
2. **The server side.** From the moment the generation thread has a piece to
   the moment the client's socket has it: the hand-over to the event loop,
   the wire format, the write, loopback, the client's read.
   :func:`server_overhead` runs a real :class:`~streamlab.server.Server` in
   this process, notes each piece's making time (``Piece.time``, the
   monotonic clock), and reads the stream from a *separate process* (so the
   client does not share the server's interpreter lock), which notes each
   event's arrival on the same clock (``time.perf_counter`` is
   ``CLOCK_MONOTONIC`` on Linux: one clock for every process).
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
from typing import Any, Sequence

PROMPT = "Explain in a few sentences why the sky is blue, for a curious child."


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; nan for no values."""
    data = sorted(values)
    if not data:
        return float("nan")
    k = (len(data) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


@dataclass
class Run:
    """One pass: seconds to the first token, and tokens per second after it."""

    ttft: float
    tokens_per_s: float
    tokens: int


def bare_loop(lm: Any, prompt_ids: Sequence[int], tokens: int) -> Run:
    """The least a server could do: forward, argmax, feed it back; no thread, no sampling, no text."""
    import torch

    started = time.perf_counter()
    times: list[float] = []
    past = None
    inputs = torch.tensor([list(prompt_ids)], dtype=torch.long, device=lm.device)
    with torch.inference_mode():
        for _ in range(tokens):
            out = lm.model(input_ids=inputs, past_key_values=past, use_cache=True, logits_to_keep=1)
            past = out.past_key_values
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


def _run(started: float, times: list[float]) -> Run:
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return Run(ttft=times[0] - started, tokens_per_s=rate, tokens=len(times))


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

    thread = threading.Thread(target=run, name="streamlab-bare-loop")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def model_overhead(lm: Any, *, tokens: int = 64, rounds: int = 5, prompt: str = PROMPT) -> dict[str, Any]:
    """Bare loop and ``Generation``, alternating ``rounds`` times after one warm-up each; medians.

    Both run the model on a new thread each time (see :func:`in_new_thread`).
    """
    from streamlab.model.generation import encode_prompt

    ids = encode_prompt(lm.tokenizer, prompt)
    in_new_thread(bare_loop, lm, ids, min(tokens, 8))
    generation_run(lm, ids, min(tokens, 8))
    runs: dict[str, list[Run]] = {"bare loop": [], "Generation": []}
    for _ in range(rounds):
        runs["bare loop"].append(in_new_thread(bare_loop, lm, ids, tokens))
        runs["Generation"].append(generation_run(lm, ids, tokens))
    summary = {
        name: {
            "ttft_s": statistics.median(r.ttft for r in rs),
            "tokens_per_s": statistics.median(r.tokens_per_s for r in rs),
            "runs": [vars(r) for r in rs],
        }
        for name, rs in runs.items()
    }
    bare, ours = summary["bare loop"], summary["Generation"]
    return {
        "prompt_tokens": len(ids),
        "tokens": tokens,
        "rounds": rounds,
        "ways": summary,
        "ttft_extra_ms": (ours["ttft_s"] - bare["ttft_s"]) * 1e3,
        "tokens_per_s_ratio": ours["tokens_per_s"] / bare["tokens_per_s"],
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


def read_arrivals(route: str, port: int, prompt: str, tokens: int) -> list[float]:
    """In a separate process: read one answer over ``route`` and return each text event's arrival (monotonic)."""
    out = subprocess.run(
        [sys.executable, "-m", "streamlab.lab.overhead", "client", route, str(port), str(tokens), prompt],
        capture_output=True, text=True, timeout=300, check=True,
    )
    return json.loads(out.stdout)


def server_overhead(lm: Any, *, tokens: int = 64, rounds: int = 3, routes: Sequence[str] = ("/stream", "/ws"),
                    prompt: str = PROMPT) -> dict[str, Any]:
    """Piece made → client socket got it, per piece, for each route; median and p99 in ms."""
    from streamlab.lab.runner import serve_in_process
    from streamlab.server.sources import source_for

    recording = _Recording(source_for(lm))
    results: dict[str, Any] = {}
    with serve_in_process(recording, max_active=4) as server:
        for route in routes:
            latencies: list[float] = []
            mismatched = 0
            for _ in range(rounds):
                before = len(recording.made)
                arrivals = read_arrivals(route, server.port, prompt, tokens)
                made = recording.made[before] if len(recording.made) > before else []
                if len(made) != len(arrivals):
                    mismatched += 1
                latencies += [(got - at) * 1e3 for at, got in zip(made, arrivals)]
            results[route] = {
                "pieces": len(latencies),
                "median_ms": statistics.median(latencies) if latencies else float("nan"),
                "p99_ms": percentile(latencies, 99),
                "max_ms": max(latencies, default=float("nan")),
                "mismatched_runs": mismatched,
                "latencies_ms": latencies,
            }
    return {"tokens": tokens, "rounds": rounds, "routes": results}


def _client(route: str, port: int, tokens: int, prompt: str) -> list[float]:
    from streamlab import client

    if route == "/ws":
        trace = asyncio.run(client.websocket(port, prompt, tokens, ignore_eos=True))
    else:
        trace = asyncio.run(client.post(port, route, client.request_body(prompt, tokens, ignore_eos=True)))
    return [trace.sent + e.t for e in trace.events if e.kind == "text" and e.text]


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "client":
        print(json.dumps(_client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])))
    else:
        print("usage: python -m streamlab.lab.overhead client ROUTE PORT TOKENS PROMPT (see benchmarks/overhead.py)")
        sys.exit(2)
