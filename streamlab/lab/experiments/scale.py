"""Many readers at once through one server, or through the shared log and its workers: pieces per second in all.

One measuring piece for ``benchmarks/shared_scale.py`` (1, 8, 16 readers, rounds
turned) and chapter 13 (a few readers, one round, on the processes the chapter
started). N readers start together, each asking ``tokens`` tokens (EOS ignored)
of its own prompt and seed: against a plain ``serve`` each reader ``POST
/stream``; through the shared log each ``POST /generations`` on a replica and
follows ``GET /generations/{id}/events``, a worker generating.

``figures`` reads one such run: pieces per second in all (every reader's text
events over the wall time from the first request to the last end), the slowest
reader's time per token (its last piece less its first, over its tokens less
one), the first text (from the reader's first request, its POST: through the log
that is two requests, the job's queue and a worker's take), and how many readers
got their ``end``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Sequence

from streamlab.client import timed as client
from streamlab.lab.experiments.load import PROMPTS
from streamlab.net.aio import run_sync

TIMEOUT = 600.0


def body(i: int, tokens: int) -> dict[str, Any]:
    return {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": tokens, "seed": i, "ignore_eos": True}


async def reader(port: int, i: int, tokens: int, *, shared: bool) -> tuple[float, Any]:
    """One reader: when it sent its first request, and its trace (times from its last request's send)."""
    posted = time.perf_counter()
    if not shared:
        return posted, await client.post(port, "/stream", body(i, tokens), timeout=TIMEOUT)
    created = await client.create_generation(port, body(i, tokens), timeout=TIMEOUT)
    return posted, await client.events(port, created["events"], timeout=TIMEOUT)


async def readers(port: int, n: int, tokens: int, *, shared: bool) -> list[tuple[float, Any]]:
    return list(await asyncio.gather(*(reader(port, i, tokens, shared=shared) for i in range(n))))


def figures(runs: Sequence[tuple[float, Any]]) -> dict[str, Any]:
    """One run of N readers as a row: pieces/s in all, the slowest reader's time per token, first text, ends."""
    started = min(posted for posted, _ in runs)
    pieces, tpot, first, ends = 0, [], [], []
    for posted, trace in runs:
        times = [trace.sent + e.t for e in trace.text_events]
        pieces += len(times)
        if times:
            first.append(times[0] - posted)
            ends.append(times[-1])
        tokens = trace.tokens or len(times)
        if len(times) >= 2 and tokens >= 2:
            tpot.append((times[-1] - times[0]) / (tokens - 1))
        if trace.end is not None:
            ends.append(trace.sent + trace.end)
    wall = (max(ends) if ends else time.perf_counter()) - started
    return {
        "readers": len(runs),
        "pieces": pieces,
        "pieces_per_s": pieces / wall if wall > 0 else float("nan"),
        "tpot_worst_s": max(tpot) if tpot else float("nan"),
        "first_text_p50_s": statistics.median(first) if first else float("nan"),
        "first_text_max_s": max(first) if first else float("nan"),
        "ended": sum(1 for _, trace in runs if trace.complete),
        "wall_s": wall,
    }


def throughput(port: int, n: int, tokens: int, *, shared: bool) -> dict[str, Any]:
    """``n`` readers at once against ``port`` (``shared``: a replica of the shared log), as one row of ``figures``."""
    return figures(run_sync(readers(port, n, tokens, shared=shared)))
