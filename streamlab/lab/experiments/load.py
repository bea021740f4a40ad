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


async def readers(port: int, n: int, tokens: int, *, prompts: Sequence[str] = PROMPTS,
                  timeout: float = 900.0) -> tuple[list[Any], float]:
    """N readers of ``/stream`` started together; their traces and the wall time to the last end."""
    from streamlab.client import timed as client

    started = time.perf_counter()
    traces = await asyncio.gather(*(
        client.stream(port, prompts[i % len(prompts)], tokens, seed=i, ignore_eos=True, timeout=timeout)
        for i in range(n)
    ))
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
               say: Callable[[str], None] = print) -> dict[int, dict[str, Any]]:
    """The server on ``port`` (``--engine ENGINE``): a warm-up request, then each N in turn."""
    from streamlab.client import timed as client

    rows: dict[int, dict[str, Any]] = {}
    client.stream_sync(port, "Hello", 4, ignore_eos=True)  # the first forward passes pay for warming up
    for n in concurrency:
        traces, wall = run_sync(readers(port, n, tokens))
        rows[n] = figures(traces, wall)
        say(f"load:   {engine} x{n}: {rows[n]['tokens_per_s']:.1f} tokens/s, "
            f"TPOT {rows[n]['tpot_p50_s'] * 1e3:.0f} ms, gap p99 {rows[n]['gap_p99_s'] * 1e3:.0f} ms "
            f"({wall:.1f} s)")
    return rows


def measure(concurrency: Sequence[int] = CONCURRENCY, tokens: int = TOKENS, engines: Sequence[str] = ENGINES, *,
            lm: Any = None, quiet: bool = False, report: Report | None = None) -> Report:
    """Every engine at every N, side by side: a :class:`Report` named ``load`` (tables, figures, gap samples).

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
    if lm is not None:
        from streamlab.lab.setups.runner import serve_in_process

        results, n = {}, room(concurrency)
        for engine in engines:
            if engine in AS_SHIPPED:
                raise ValueError(f"{engine!r} is a server as shipped: measure it in a process of its own (lm=None)")
            with serve_in_process(lm, engine=engine, max_active=n, max_connections=n + 16) as server:
                results[engine] = run_engine(engine, server.port, concurrency, tokens, say=say)
    else:
        # Every engine's server starts at once (loading the model is seconds of mostly waiting); they
        # are measured one after the other, so an idle one costs the other nothing.
        from streamlab.lab.setups.runner import start_servers

        servers = start_servers({engine: serve_args(engine, concurrency) for engine in engines})
        try:
            results = {engine: run_engine(engine, servers[engine].port, concurrency, tokens, say=say)
                       for engine in engines}
        finally:
            for server in servers.values():
                server.stop()
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
    shipped_figures(report, results, at)
    report.data["rows"] = {engine: {str(n): {k: v for k, v in r.items() if not k.startswith("_")}
                                    for n, r in rows.items()} for engine, rows in results.items()}
    report.data["gaps"] = {engine: {str(n): r["_gaps"] for n, r in rows.items()} for engine, rows in results.items()}
    report.data["ttft"] = {engine: {str(n): r["_ttft"] for n, r in rows.items()} for engine, rows in results.items()}
    return report


# What issue 19 holds the default server to, at 8 readers (``at``) against one.
SCALE_TARGET = 1.5  # total tokens/s at 8 readers against one reader's
DECODE_TARGET = 1.6  # one reader's tokens/s on the default decode format against float32's


def shipped_figures(report: Report, results: dict[str, dict[int, dict[str, Any]]], at: int) -> None:
    """The default server's targets: none refused, more tokens/s with more readers, every reader under the threshold."""
    rows = results.get("default")
    if not rows:
        return
    for n, r in rows.items():
        report.figure(f"default_refused_at_{n}", r["refused"], "readers")
        report.figure(f"default_complete_at_{n}", r["complete"], "readers")
    if 1 in rows and at in rows and at != 1:
        report.ratio(f"default_tokens_per_s_{at}_vs_1", rows[at]["tokens_per_s"] / rows[1]["tokens_per_s"],
                     target=SCALE_TARGET, op="≥")
    if at in rows:
        report.ratio(f"default_slowest_reader_tpot_at_{at}", rows[at]["tpot_worst_s"] / READING_THRESHOLD,
                     target=1.0, op="≤", note=f"the slowest reader's time per token over the {READING_THRESHOLD:g} s"
                     " reading threshold")
    base = results.get("float32")
    if base and 1 in rows and 1 in base:
        report.ratio("default_vs_float32_one_reader_tokens_per_s",
                     rows[1]["tokens_per_s"] / base[1]["tokens_per_s"], target=DECODE_TARGET, op="≥",
                     note="one reader of /stream, the default decode format against float32, in the same run")
