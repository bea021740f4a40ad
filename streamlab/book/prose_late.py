"""The plumbing of chapters 11 to 15, out of the reader's sight: tables shaped to be read, verdicts worded from numbers.

A chapter shows the calls that carry its idea; what turns their results into a
table a reader reads (words for column names, rounded figures, a dash for what
does not apply) or into the words of a verdict lives here, tested in
``tests/test_prose_late.py``:

    tidy(rows, columns)            floats rounded, None and NaN as a dash, True/False as yes/no, lists as words
    rounds_against(values, ...)    how rounds stand against a target: too few to say, met, missed, or within noise
    pace_standing(seconds)         a time per token against the reading threshold, in words
    policy_name(row)               a backpressure policy as a reader names it: 'bounded at 256, 2 s timeout'
    stream_rows, load_rows, backpressure_rows   chapter 11's tables as shown
    schedule_words(rows, ...)      whether each stack kept the scripted schedule, from its median and p99 gaps
    replica_namer(servers)         'replica 2' for a replica's URL or host:port: a port is no name for a reader

The words come from ``streamlab.book.wording``, so they pass the proofreader
(``streamlab.book.proofread``) whatever the run measured.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping, Sequence

from streamlab.book.wording import listing, of_all, spread
from streamlab.client.metrics import READING_THRESHOLD
from streamlab.lab.results.measures import MET, MIN_ROUNDS, MISSED, TOO_FEW, standing

__all__ = [
    "BLANK",
    "backpressure_rows",
    "load_rows",
    "pace_standing",
    "policy_name",
    "replica_namer",
    "rounds_against",
    "schedule_words",
    "stream_rows",
    "tidy",
    "tidy_value",
]

BLANK = "—"  # what a cell shows where a figure does not apply
NOTICED_SHARE = 0.05  # gaps over the threshold, as a share of all, from which a pace under it on average is not smooth


def tidy_value(value: Any, digits: int = 2) -> Any:
    """One cell as a reader reads it: a float rounded, None or NaN a dash, a flag yes or no, a list in words."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes, list, tuple, dict)):
        value = value.item()  # numpy's scalars, as pandas hands them over
    if value is None:
        return BLANK
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return BLANK
        rounded = round(value, digits)
        return int(rounded) if digits <= 0 or rounded.is_integer() else rounded  # a count that JSON made a float
    if isinstance(value, (list, tuple)):
        return listing([tidy_value(v, digits) for v in value]) or BLANK
    return value


def tidy(rows: Sequence[Mapping[str, Any]], columns: Mapping[str, str] | None = None, *, digits: int = 2,
         places: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Rows with the columns named in words and every value tidied (``tidy_value``).

    ``columns`` maps a row's key to the title it is shown under, in the order
    shown (the others are left out); without it every key is kept as it is.
    ``places`` gives a column (by its title) digits of its own.
    """
    places = places or {}
    out = []
    for row in rows:
        chosen = columns or {key: key for key in row}
        out.append({title: tidy_value(row.get(key), places.get(title, digits)) for key, title in chosen.items()})
    return out


def rounds_against(values: Sequence[float], inside: Callable[[float], bool], target: str, *, unit: str = "",
                   digits: int = 2, min_rounds: int = MIN_ROUNDS) -> str:
    """How the rounds stand against a target, with their spread: too few to say, met, missed, or within noise."""
    if len(values) == 1:
        return f"one round, too few to say whether it is {target}"
    said = spread(values, unit=unit, digits=digits)
    kind = standing(values, inside, min_rounds=min_rounds)  # the rule make bench's lines follow too
    if kind == TOO_FEW:
        return f"{said}: too few to say whether it is {target}"
    if kind == MET:
        return f"{said}: all {len(values)} rounds {target}, so met"
    if kind == MISSED:
        return f"{said}: no round {target}, so missed"
    return f"{said}: the rounds span the target, within noise of it"


def pace_standing(seconds: float, threshold: float = READING_THRESHOLD, *,
                  over: float | None = None) -> tuple[str, str]:
    """A time per token against the reading threshold: a few words to cite it by, and what it means for a reader.

    ``over`` is the share of the reader's gaps longer than the threshold: a
    mean under it can hide gaps a reader notices, and the words say so.
    """
    if seconds < 0.9 * threshold:
        if over is not None and over >= NOTICED_SHARE:
            return ("under the threshold on average",
                    f"yet {over:.0%} of the gaps were longer than the threshold, and a reader notices each of those")
        return "under the threshold", "each reader of a batch this size reads on without noticing a wait"
    if seconds <= 1.1 * threshold:
        return "at about the threshold", "where a reader begins to notice the gaps"
    return (f"over the threshold, {seconds / threshold:.2f}x it",
            "a reader of a batch this size notices the gaps, and a smaller batch or a faster way to decode would keep "
            "each reader ahead of their reading")


def policy_name(row: Mapping[str, Any]) -> str:
    """A backpressure policy as a reader names it, from its bound and timeout: 'bounded at 256, 2 s timeout'."""
    bound, timeout = row.get("max_queued") or 0, row.get("slow_reader_timeout") or 0
    if not bound:
        return "unbounded"
    return f"bounded at {bound:,}" + (f", {timeout:g} s timeout" if timeout else "")


def backpressure_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chapter 11's slow-reader table: one row per policy, named in words, buffers in whole KiB."""
    named = [{**row, "name": policy_name(row)} for row in rows]
    return tidy(named, {"name": "policy", "tokens_generated": "tokens made", "pieces_read": "pieces read",
                        "peak_queued": "pieces queued, at most", "peak_kernel_kib": "kernel buffers, at most (KiB)",
                        "peak_transport_kib": "asyncio's buffer, at most (KiB)", "waited_s": "waited for the reader (s)",
                        "stored_reason": "stored as"},
                places={"kernel buffers, at most (KiB)": 0, "asyncio's buffer, at most (KiB)": 0,
                        "waited for the reader (s)": 1})


# The servers of chapter 11's many-streams run, as a reader names them (the protocol has a column of its own).
SERVER_NAMES = {"streamlab": "streamlab", "uvicorn+starlette": "uvicorn + Starlette",
                "uvicorn+sse-starlette": "uvicorn + sse-starlette", "streamlab-ws": "streamlab",
                "websockets": "websockets"}
PROTOCOL_NAMES = {"sse": "SSE", "ws": "WebSocket"}


def stream_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chapter 11's many-streams table: each server at each level, its gaps against the schedule, its CPU and memory."""
    named = [{**row, "name": SERVER_NAMES.get(row["server"], row["server"]),
              "wire": PROTOCOL_NAMES.get(row.get("protocol", ""), row.get("protocol", ""))} for row in rows]
    return tidy(named, {"name": "server", "wire": "protocol", "streams": "streams", "gap_p50_ms": "median gap (ms)",
                        "gap_p99_ms": "p99 gap (ms)", "first_event_p99_ms": "first event, p99 (ms)",
                        "cpu_s_per_10k_events": "server CPU per 10,000 events (s)",
                        "kb_per_stream": "memory per stream (KB)", "completed": "completed", "failed": "failed"},
                places={"median gap (ms)": 1, "p99 gap (ms)": 0, "first event, p99 (ms)": 0,
                        "memory per stream (KB)": 0})


def load_rows(rows: Sequence[Mapping[str, Any]], threshold: float = READING_THRESHOLD) -> list[dict[str, Any]]:
    """Chapter 11's threads-against-batched table (``load.measure``'s), in words, milliseconds whole."""
    over = f"gaps > {threshold:g} s"
    return tidy(rows, {"engine": "engine", "readers": "readers", "TTFT p50 (s)": "first text, median (s)",
                       "TTFT p95 (s)": "first text, p95 (s)", "TPOT p50 (ms)": "time per token, median (ms)",
                       "slowest reader's TPOT (ms)": "slowest reader's time per token (ms)",
                       "gap p50 (ms)": "gap, median (ms)", "gap p99 (ms)": "gap, p99 (ms)",
                       over: f"gaps over {threshold * 1000:.0f} ms", "tokens/s": "tokens/s, all readers",
                       "complete": "complete"},
                places={"time per token, median (ms)": 0, "slowest reader's time per token (ms)": 0,
                        "gap, median (ms)": 0, "gap, p99 (ms)": 0, "tokens/s, all readers": 1})


def schedule_words(rows: Sequence[Mapping[str, Any]], schedule_ms: float, *, tolerance: float = 0.1) -> str:
    """Whether each stack kept the schedule: the median gap within ``tolerance`` of it, then what the p99 says.

    A median on the schedule with a long p99 is a stack that kept time for
    most events and fell behind for a few: the sentence says both.
    """
    def name(row: Mapping[str, Any]) -> str:
        server = SERVER_NAMES.get(row["server"], row["server"])
        return f"{server} over {PROTOCOL_NAMES.get(row['protocol'], row['protocol'])}"

    kept = [row for row in rows if abs(row["gap_p50_ms"] - schedule_ms) <= tolerance * schedule_ms]
    behind = [row for row in rows if row not in kept]
    said = (f"The median gap between a stream's events was the {schedule_ms:.0f} ms schedule for "
            f"{of_all(len(kept), len(rows), 'stack')}")
    if behind:
        said += " and longer for " + listing([f"{name(r)} ({r['gap_p50_ms']:.0f} ms)" for r in behind])
    p99 = sorted(rows, key=lambda r: r["gap_p99_ms"])
    said += (f". The p99 gap, one event in a hundred, says who fell behind at moments: from "
             f"{p99[0]['gap_p99_ms']:.0f} ms ({name(p99[0])}) to {p99[-1]['gap_p99_ms']:.0f} ms ({name(p99[-1])})")
    return said + "."


def replica_namer(servers: Sequence[Any], word: str = "replica") -> Callable[[Any], str]:
    """A function naming each of ``servers`` (anything with a ``port``) 'replica 1', 'replica 2'... in their order.

    It takes a URL, a ``host:port`` or a port number, and gives back the
    name; what names no server of the list is given back as it came. A port
    changes from run to run and says nothing to a reader; an order does.
    """
    names = {int(server.port): f"{word} {i}" for i, server in enumerate(servers, 1)}

    def name(where: Any) -> str:
        if where is None:
            return BLANK
        if isinstance(where, int):
            return names.get(where, str(where))
        found = re.search(r":(\d+)(?:/|$)", str(where))
        return names.get(int(found.group(1)), str(where)) if found else str(where)

    return name
