"""The model under load: N readers at once on a real server, a thread per generation against one batch.

Each measurement starts a real server (``python -m streamlab serve``, the real
model) with ``--engine threads`` or ``--engine batched``, then N readers POST
``/stream`` at the same moment (raw sockets: :mod:`streamlab.client.timed` stamps
every piece's arrival) with the same prompts and ``max_tokens`` (EOS
ignored, so every answer is as long). Per engine and N:

- **time to first token** (TTFT), median and p95 over the readers;
- **time per output token** (TPOT): each reader's (last piece - first piece)
  / (tokens - 1), the median over readers;
- **gaps** between consecutive pieces, pooled over the readers: p50, p99,
  max, and the share above :data:`READING_THRESHOLD` (0.2 s, the ~180-220 ms
  per token a reader at ~5 tokens/s starts to outpace: a stutter they see);
- **total tokens/s**: every reader's tokens over the wall time from the first
  request to the last end.

With threads, N generations take turns on the model one token each: every
reader's TPOT grows ~N times, and total tokens/s stays that of one stream.
Batched, one step makes a token for all N for little more than the price of
one: TPOT grows slowly and total tokens/s grows with N.

    from streamlab.lab.experiments.load import measure
    report = measure(concurrency=(1, 2, 4, 8), tokens=32)   # a Report: tables, figures, report.data
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from typing import Any, Callable, Sequence

from streamlab.client.metrics import READING_THRESHOLD, percentile  # READING_THRESHOLD: the book's one threshold
from streamlab.net.aio import run_sync
from streamlab.lab.results.measures import Report

ENGINES = ("threads", "batched")
# Servers measured as they are, not given room: ``default`` is ``serve`` with no flags at all (the
# batched engine, --max-active and the line past it, the default decode format), ``float32`` the same
# with the format every other is measured against. Readers past --max-active wait in line, as a user's do.
AS_SHIPPED = {"default": [], "float32": ["--precision", "float32"]}
# llama.cpp's own server (``make engine`` builds it) with a slot per reader of the largest N, continuous
# batching on: the yardstick for a batched engine, read through its OpenAI chat API.
LLAMA_CPP = "llama.cpp"
CONCURRENCY = (1, 2, 4, 8, 16)
TOKENS = 64
# Different lengths, so that a batch is padded as it is in real use.
PROMPTS = (
    "Tell me about ferries.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in a few sentences why the sky is blue, for a curious child.",
    "What should I pack for a week of hiking in the mountains in autumn?",
    "Describe the sound of rain on a tin roof.",
    "Give me three ideas for a birthday dinner for a friend who loves Italian food and old films.",
    "How does a bicycle stay upright?",
    "Summarise the plot of a detective novel you would like to read.",
)


async def ask_stream(port: int, prompt: str, tokens: int, seed: int, timeout: float) -> Any:
    """One reader of our ``/stream``, EOS ignored."""
    from streamlab.client import timed as client

    return await client.stream(port, prompt, tokens, seed=seed, ignore_eos=True, timeout=timeout)


async def ask_chat(port: int, prompt: str, tokens: int, seed: int, timeout: float) -> Any:
    """The same question to an OpenAI chat API (llama.cpp's), EOS ignored, greedy; ``tokens`` from what came.

    llama.cpp's stream carries a token a chunk; its usage chunk, where it sends one, says how many.
    """
    from streamlab.client import timed as client

    body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "stream": True, "ignore_eos": True, "seed": seed, "temperature": 0.0,
            "stream_options": {"include_usage": True}}
    trace = await client.post(port, "/v1/chat/completions", body, timeout=timeout)
    if trace.tokens is None:
        usage = next((e.data["usage"] for e in reversed(trace.events)
                      if isinstance(e.data, dict) and isinstance(e.data.get("usage"), dict)), None)
        trace.tokens = int(usage.get("completion_tokens") or 0) if usage else len(trace.text_events)
    return trace


async def readers(port: int, n: int, tokens: int, *, prompts: Sequence[str] = PROMPTS,
                  timeout: float = 900.0, ask: Callable[..., Any] = ask_stream) -> tuple[list[Any], float]:
    """N readers (of ``/stream``, or as ``ask`` asks) started together; their traces and the wall time to the last end."""
    started = time.perf_counter()
    traces = await asyncio.gather(*(ask(port, prompts[i % len(prompts)], tokens, i, timeout) for i in range(n)))
    ends = [t.sent + t.end for t in traces if t.end is not None]
    return list(traces), (max(ends) if ends else time.perf_counter()) - started


def figures(traces: Sequence[Any], wall: float) -> dict[str, Any]:
    """What one (engine, N) run did to its readers, as one row."""
    ttft = [t.first_text for t in traces if t.first_text is not None]
    tpot, gaps, tokens = [], [], 0
    refused = sum(1 for t in traces if t.status is not None and t.status >= 400)
    for t in traces:
        times = [e.t for e in t.text_events]
        n = t.tokens or 0
        tokens += n
        if len(times) >= 2 and n >= 2:
            tpot.append((times[-1] - times[0]) / (n - 1))
        gaps += t.gaps()
    return {
        "readers": len(traces),
        "complete": sum(1 for t in traces if t.complete),
        "tokens": tokens,
        "ttft_p50_s": statistics.median(ttft) if ttft else float("nan"),
        "ttft_p95_s": percentile(ttft, 95),
        "tpot_p50_s": statistics.median(tpot) if tpot else float("nan"),
        "tpot_worst_s": max(tpot) if tpot else float("nan"),  # the slowest reader's own time per token
        "refused": refused,
        "gap_p50_s": percentile(gaps, 50),
        "gap_p99_s": percentile(gaps, 99),
        "gap_max_s": max(gaps) if gaps else float("nan"),
        "gaps_over_threshold": sum(g > READING_THRESHOLD for g in gaps) / len(gaps) if gaps else 0.0,
        "tokens_per_s": tokens / wall if wall > 0 else float("nan"),
        "wall_s": wall,
        "_gaps": gaps,
        "_ttft": ttft,
    }


def room(concurrency: Sequence[int]) -> int:
    """Generations the server admits at once: every reader of the largest N (and never fewer than 16)."""
    return max(16, *concurrency)


def serve_args(engine: str, concurrency: Sequence[int]) -> list[str]:
    """How the server process for ``engine`` is started: room for the largest N at once (shipped ones: as shipped)."""
    if engine in AS_SHIPPED:
        return list(AS_SHIPPED[engine])
    n = room(concurrency)
    return ["--engine", engine, "--max-active", str(n), "--max-connections", str(n + 16)]


def run_engine(engine: str, port: int, concurrency: Sequence[int], tokens: int, *,
               say: Callable[[str], None] = print, ask: Callable[..., Any] = ask_stream) -> dict[int, dict[str, Any]]:
    """The server on ``port`` (``--engine ENGINE``): a warm-up request, then each N in turn."""
    rows: dict[int, dict[str, Any]] = {}
    run_sync(ask(port, "Hello", 4, 0, 120.0))  # the first forward passes pay for warming up
    for n in concurrency:
        traces, wall = run_sync(readers(port, n, tokens, ask=ask))
        rows[n] = figures(traces, wall)
        say(f"load:   {engine} x{n}: {rows[n]['tokens_per_s']:.1f} tokens/s, "
            f"TPOT {rows[n]['tpot_p50_s'] * 1e3:.0f} ms, gap p99 {rows[n]['gap_p99_s'] * 1e3:.0f} ms "
            f"({wall:.1f} s)")
    return rows


def measure(concurrency: Sequence[int] = CONCURRENCY, tokens: int = TOKENS, engines: Sequence[str] = ENGINES, *,
            lm: Any = None, quiet: bool = False, report: Report | None = None, rounds: int = 1) -> Report:
    """Every engine at every N, side by side: a :class:`Report` named ``load`` (tables, figures, gap samples).

    ``rounds``: every engine at every N that many times, in turns; the table
    holds the medians (the counts summed, the samples pooled) and each target
    reads its rounds (``measures.standing``).

    Each engine gets a server process of its own (``python -m streamlab
    serve``), or, given ``lm``, a server in this process over that model
    (:func:`streamlab.lab.setups.runner.serve_in_process`): what a chapter that has
    the model loaded does, without seconds of starting and loading.
    """
    report = report or Report("load", params={"concurrency": list(concurrency), "tokens": tokens,
                                              "engines": list(engines), "threshold_s": READING_THRESHOLD,
                                              "server": "in-process" if lm is not None else "process"},
                              quiet=quiet)
    say = (lambda line: None) if quiet else (lambda line: print(line, flush=True))
    per_round: dict[str, list[dict[int, dict[str, Any]]]] = {}
    with contextlib.ExitStack() as stack:
        servers = _servers(stack, engines, concurrency, lm, say)
        for r in range(rounds):  # the engines take turns within a round, each first as often as the others
            names = list(servers)
            for engine in names[r % len(names):] + names[: r % len(names)] if names else ():
                port, ask = servers[engine]
                per_round.setdefault(engine, []).append(
                    run_engine(engine, port, concurrency, tokens, say=say, ask=ask))
    results = {engine: _pooled(rows) for engine, rows in per_round.items()}
    report.params["rounds"] = rounds
    report.table("by engine and readers", [
        {"engine": engine, "readers": n, "TTFT p50 (s)": r["ttft_p50_s"], "TTFT p95 (s)": r["ttft_p95_s"],
         "TPOT p50 (ms)": r["tpot_p50_s"] * 1e3, "gap p50 (ms)": r["gap_p50_s"] * 1e3,
         "gap p99 (ms)": r["gap_p99_s"] * 1e3, "gap max (ms)": r["gap_max_s"] * 1e3,
         f"gaps > {READING_THRESHOLD:g} s": f"{r['gaps_over_threshold']:.0%}", "tokens/s": r["tokens_per_s"],
         "slowest reader's TPOT (ms)": r["tpot_worst_s"] * 1e3,
         "complete": f"{r['complete']}/{r['readers']}", "refused": r["refused"]}
        for engine, rows in results.items() for n, r in rows.items()
    ])
    at = 8 if 8 in concurrency else max(concurrency)
    for engine, rows in results.items():
        r = rows[at]
        report.figure(f"{engine}_tokens_per_s_at_{at}", r["tokens_per_s"], "tokens/s")
        report.figure(f"{engine}_ttft_p50_at_{at}", r["ttft_p50_s"], "s")
        report.figure(f"{engine}_tpot_p50_at_{at}", r["tpot_p50_s"] * 1e3, "ms")
        report.figure(f"{engine}_gap_p99_at_{at}", r["gap_p99_s"] * 1e3, "ms")
        report.figure(f"{engine}_gaps_over_threshold_at_{at}", r["gaps_over_threshold"] * 100, "%")
    if "threads" in results and "batched" in results:
        ratio = results["batched"][at]["tokens_per_s"] / results["threads"][at]["tokens_per_s"]
        report.ratio(f"batched_vs_threads_tokens_per_s_at_{at}", ratio, target=1.0, op="≥")
    shipped_figures(report, results, at, per_round)
    yardstick_figures(report, results, per_round)
    report.data["rows"] = {engine: {str(n): {k: v for k, v in r.items() if not k.startswith("_")}
                                    for n, r in rows.items()} for engine, rows in results.items()}
    report.data["gaps"] = {engine: {str(n): r["_gaps"] for n, r in rows.items()} for engine, rows in results.items()}
    report.data["ttft"] = {engine: {str(n): r["_ttft"] for n, r in rows.items()} for engine, rows in results.items()}
    return report


# What issue 19 holds the default server to, at 8 readers (``at``) against one.
SCALE_TARGET = 1.5  # total tokens/s at 8 readers against one reader's
DECODE_TARGET = 1.6  # one reader's tokens/s on the default decode format against float32's


def shipped_figures(report: Report, results: dict[str, dict[int, dict[str, Any]]], at: int,
                    per_round: dict[str, list[dict[int, dict[str, Any]]]] | None = None) -> None:
    """The default server's targets: none refused, more tokens/s with more readers, every reader under the threshold."""
    rows = results.get("default")
    if not rows:
        return
    for n, r in rows.items():
        report.figure(f"default_refused_at_{n}", r["refused"], "readers")
        report.figure(f"default_complete_at_{n}", r["complete"], "readers")
    if 1 in rows and at in rows and at != 1:
        report.ratio(f"default_tokens_per_s_{at}_vs_1", rows[at]["tokens_per_s"] / rows[1]["tokens_per_s"],
                     target=SCALE_TARGET, op="≥",
                     rounds=_each_round(per_round, "default", lambda r: r[at]["tokens_per_s"] / r[1]["tokens_per_s"]))
    from streamlab.server.config import MAX_ACTIVE

    for n in sorted(k for k in rows if k >= at):  # a crowd (8, and 16 where measured): each reader under the threshold
        r = rows[n]
        waited = (f"; {MAX_ACTIVE} decoded at once (--max-active), the other {n - MAX_ACTIVE} waited in line, "
                  f"first text p95 {r['ttft_p95_s']:.1f} s" if n > MAX_ACTIVE else f"; all {n} decoded at once")
        report.ratio(f"default_slowest_reader_tpot_at_{n}", r["tpot_worst_s"] / READING_THRESHOLD,
                     target=1.0, op="≤", note=f"the slowest reader's time per token over the {READING_THRESHOLD:g} s"
                     f" reading threshold ({r['tpot_worst_s'] * 1e3:.0f} ms){waited}",
                     rounds=_each_round(per_round, "default",
                                        lambda rows, n=n: rows[n]["tpot_worst_s"] / READING_THRESHOLD))
    base = results.get("float32")
    if base and 1 in rows and 1 in base:
        report.ratio("default_vs_float32_one_reader_tokens_per_s",
                     rows[1]["tokens_per_s"] / base[1]["tokens_per_s"], target=DECODE_TARGET, op="≥",
                     note="one reader of /stream, the default decode format against float32, in the same run")


def _servers(stack: contextlib.ExitStack, engines: Sequence[str], concurrency: Sequence[int], lm: Any,
             say: Callable[[str], None]) -> dict[str, tuple[int, Callable[..., Any]]]:
    """Every engine's server, started for the whole measurement (stopped by ``stack``): its port and how to ask it.

    Ours are processes of their own (``python -m streamlab serve``, all started at
    once: loading the model is seconds of mostly waiting), or, given ``lm``,
    servers in this process over that model, what a chapter that has the model
    loaded does. They are measured one after the other, so an idle one costs the
    others nothing. llama.cpp's, where built, gets a slot for each reader of the
    largest N.
    """
    servers: dict[str, tuple[int, Callable[..., Any]]] = {}
    ours = [engine for engine in engines if engine != LLAMA_CPP]
    if lm is not None:
        from streamlab.lab.setups.runner import serve_in_process

        n = room(concurrency)
        for engine in ours:
            if engine in AS_SHIPPED:
                raise ValueError(f"{engine!r} is a server as shipped: measure it in a process of its own (lm=None)")
            server = stack.enter_context(serve_in_process(lm, engine=engine, max_active=n, max_connections=n + 16))
            servers[engine] = (server.port, ask_stream)
    elif ours:
        from streamlab.lab.setups.runner import start_servers

        started = start_servers({engine: serve_args(engine, concurrency) for engine in ours})
        stack.callback(lambda: [server.stop() for server in started.values()])
        servers.update({engine: (started[engine].port, ask_stream) for engine in ours})
    if LLAMA_CPP in engines:
        from streamlab.lab.outside.llamacpp import LlamaCppServer, cores, native_unavailable_reason

        reason = native_unavailable_reason()
        if reason:
            say(f"load: llama.cpp not measured: {reason}")
        else:
            engine = stack.enter_context(LlamaCppServer(parallel=room(concurrency), threads=cores()))
            servers[LLAMA_CPP] = (engine.port, ask_chat)
    return servers


SUMMED = ("readers", "complete", "tokens", "refused")


def _pooled(rounds: Sequence[dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """One row per N from every round's: medians of the figures, the counts summed, the samples pooled."""
    pooled: dict[int, dict[str, Any]] = {}
    for n in rounds[0]:
        rows = [r[n] for r in rounds]
        row: dict[str, Any] = {}
        for key, value in rows[0].items():
            if isinstance(value, list):
                row[key] = [v for r in rows for v in r[key]]
            elif key in SUMMED:
                row[key] = sum(r[key] for r in rows)
            else:
                row[key] = statistics.median(r[key] for r in rows)
        pooled[n] = row
    return pooled


def _each_round(per_round: dict[str, list[dict[int, dict[str, Any]]]] | None, engine: str,
                figure: Callable[[dict[int, dict[str, Any]]], float]) -> list[float] | None:
    """``figure`` of each round of ``engine`` (None without rounds): what a target's verdict reads."""
    if not per_round or engine not in per_round:
        return None
    return [figure(rows) for rows in per_round[engine]]


def yardstick_figures(report: Report, results: dict[str, dict[int, dict[str, Any]]],
                      per_round: dict[str, list[dict[int, dict[str, Any]]]] | None = None) -> None:
    """Our server as shipped against llama.cpp's at each N both ran: total tokens/s, ours over theirs (target ≥ 1)."""
    ours, theirs = results.get("default"), results.get(LLAMA_CPP)
    if not ours or not theirs:
        return
    for n in sorted(set(ours) & set(theirs)):
        paired = None
        if per_round and "default" in per_round and LLAMA_CPP in per_round:
            paired = [a[n]["tokens_per_s"] / b[n]["tokens_per_s"]
                      for a, b in zip(per_round["default"], per_round[LLAMA_CPP])]
        report.ratio(f"default_vs_llama_cpp_tokens_per_s_at_{n}",
                     ours[n]["tokens_per_s"] / theirs[n]["tokens_per_s"], target=1.0 if n >= 8 else None, op="≥",
                     note=f"llama.cpp's slowest reader {theirs[n]['tpot_worst_s'] * 1e3:.0f} ms a token, "
                          f"ours {ours[n]['tpot_worst_s'] * 1e3:.0f} ms", rounds=paired)
