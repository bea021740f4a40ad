"""Many streams, the server alone: streamlab against uvicorn + Starlette, sse-starlette and websockets.

    python benchmarks/many_streams.py [--levels 100,1000,5000] [--ws 1000] [--tokens 60] [--rate 20]
                                      [--rounds 3] [--loop asyncio|uvloop] [--servers a,b] [--tiny]

No model: every server streams the same *scripted source* (``python -m
streamlab serve --scripted-rate 20``; the rivals of ``streamlab.lab.outside.rivals`` serve
the very same class), a fixed text at 20 tokens/s, so what is measured is the
server. At each level N, N streams of ``--tokens`` tokens start spread over
``--spread`` seconds, driven from a separate process (``python -m
streamlab.lab.experiments.many_streams drive``) that notes every event's arrival. Each server
runs in a fresh process per level (memory once taken stays with a Python
process). Per run: events delivered per second while all N are open (the
schedule asks N x rate), the gaps between a stream's events (p50, p99, against
the 50 ms schedule), server CPU seconds per 10,000 events (user + system, from
the first connection to the last close, so it includes accepting, parsing and
for streamlab the store), memory per open stream ((RSS with N open - RSS
idle) / N).

Every server, and the driver, run on one event loop: ``--loop uvloop`` when
uvloop is installed (what uvicorn picks by itself), else ``asyncio``. Two loops
in one comparison would measure the loops. uvicorn keeps its pure-Python HTTP
parser (h11), as ours is.

The whole set runs ``--rounds`` times, interleaved (every server, then every
server again), and each figure is the median of the rounds, its spread
(lowest-highest) printed below it. The CPU ratio is taken within each round
(ours over Starlette's, run minutes apart on the same machine) and its median
is the one held against the target: the machine's other work moves both
servers of a round more than it moves their ratio.

Targets, at 1,000 SSE streams: the p99 gap within 20 ms of the schedule, and
CPU per event no worse than uvicorn + Starlette's. The driver and the server
share the machine (2 cores here): the driver's own CPU is in the table.
"""

from __future__ import annotations

import argparse
import math
import statistics

from streamlab.lab.results.measures import Report, _fmt
from streamlab.lab.experiments.many_streams import LOOPS, SSE_SERVERS, WS_SERVERS, compare, default_loop, table
from streamlab.server.answers.scripted import scripted_name

KEYS = {"streamlab": "streamlab", "streamlab-ws": "streamlab", "uvicorn+starlette": "starlette",
        "uvicorn+sse-starlette": "sse_starlette", "websockets": "websockets"}
TARGET_LEVEL = 1000
GAP_TARGET_MS = 20.0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _runs(rows: list[dict], server: str, n: int) -> list[dict]:
    """The rows of every round in which ``server`` ran ``n`` streams to the end of the run (not an error)."""
    return [r for r in rows if r["server"] == server and r["streams"] == n and not r.get("error")]


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, lowest, highest); NaNs for none."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return math.nan, math.nan, math.nan
    return statistics.median(values), min(values), max(values)


def _said(values: list[float], unit: str = "") -> str:
    med, lo, hi = spread(values)
    return f"{_fmt(med)}{unit} (lowest {_fmt(lo)}, highest {_fmt(hi)}, {len(values)} rounds)"


def paired_ratios(rows: list[dict], ours: str, theirs: str, n: int, key: str) -> list[float]:
    """``key`` of ``ours`` over ``theirs``'s, round by round (each round's pair ran minutes apart)."""
    theirs_by_round = {r["round"]: r for r in _runs(rows, theirs, n)}
    return [r[key] / theirs_by_round[r["round"]][key] for r in _runs(rows, ours, n)
            if r["round"] in theirs_by_round and theirs_by_round[r["round"]][key] > 0]


def summary(rows: list[dict]) -> list[dict]:
    """One row per server and level: the median of the rounds, and the lowest and highest beside it."""
    out = []
    for server, n in dict.fromkeys((r["server"], r["streams"]) for r in rows):
        runs = _runs(rows, server, n)
        cells: dict = {"server": server, "protocol": runs[0]["protocol"] if runs else "", "streams": n,
                       "rounds": len(runs)}
        for key, title in (("cpu_s_per_10k_events", "CPU s/10k ev"), ("gap_p99_ms", "gap p99 ms"),
                           ("events_per_s", "events/s")):
            med, lo, hi = spread([r[key] for r in runs])
            cells[title], cells[f"{title} lo-hi"] = med, f"{_fmt(lo)}-{_fmt(hi)}"
        cells["failed"] = sum(r["failed"] for r in rows if r["server"] == server and r["streams"] == n)
        out.append(cells)
    return out


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="100,1000,5000", help="SSE streams at once, per run")
    parser.add_argument("--ws", default="1000", help="WebSocket streams at once, per run")
    parser.add_argument("--tokens", type=int, default=60, help="tokens per stream (60 at 20/s: 3 s)")
    parser.add_argument("--rate", type=float, default=20.0, help="the scripted source's tokens per second")
    parser.add_argument("--spread", type=float, default=1.0, help="seconds over which a level's streams start")
    parser.add_argument("--servers", default=None, help="only these (e.g. streamlab,uvicorn+starlette)")
    parser.add_argument("--rounds", type=int, default=3, help="run the whole set this many times, interleaved")
    parser.add_argument("--loop", choices=LOOPS, default=None,
                        help="every server's event loop (default: uvloop where it is installed, else asyncio)")
    parser.add_argument("--tiny", action="store_true", help="a quick run for the test: 5 streams of 10 tokens, once")
    args = parser.parse_args(argv)
    if args.tiny:
        levels, ws_levels, tokens, spread_s, warmup, rounds = [5], [5], 10, 0.2, 2, 1
    else:
        levels, ws_levels, tokens, spread_s, warmup = _ints(args.levels), _ints(args.ws), args.tokens, args.spread, 10
        rounds = max(1, args.rounds)
    loop = args.loop or default_loop()
    chosen = args.servers.split(",") if args.servers else None
    sse_servers = [s for s in SSE_SERVERS if chosen is None or s in chosen]
    ws_servers = [s for s in WS_SERVERS if chosen is None or s in chosen]
    source = f"{scripted_name(args.rate)} (scripted source, no model)"
    report = Report("many_streams", params={
        "levels": levels, "ws_levels": ws_levels, "tokens": tokens, "rate": args.rate, "spread_s": spread_s,
        "rounds": rounds, "loop": loop, "source": source,
        "rivals": f"uvicorn --http h11 (pure Python, as ours) and websockets' asyncio server, on {loop}",
        "driver": f"one separate process, raw asyncio sockets, on {loop}",
    })
    print(f"many_streams: every server streams {source} on the {loop} loop, {rounds} round(s) interleaved;"
          " the load comes from a separate process", flush=True)
    rows = compare(levels, ws_levels, tokens=tokens, rate=args.rate, spread=spread_s, sse_servers=sse_servers,
                   ws_servers=ws_servers, warmup=warmup, loop=loop, rounds=rounds)

    report.table("streams at once (one fresh server process per row)", table(rows))
    if rounds > 1:
        report.table(f"the median of {rounds} rounds, and the lowest-highest", summary(rows))
    for server, n in dict.fromkeys((r["server"], r["streams"]) for r in rows):
        runs = _runs(rows, server, n)
        if not runs:
            continue
        key = f"{runs[0]['protocol']}_{n}_{KEYS[server]}"
        for name, unit in (("gap_p99_ms", "ms"), ("cpu_s_per_10k_events", "s")):
            values = [r[name] for r in runs]
            report.figure(f"{key}_{name}", spread(values)[0], unit, note=_said(values, f" {unit}"))

    # The targets at 1,000 SSE streams (at a tiny size: the largest level run).
    level = TARGET_LEVEL if TARGET_LEVEL in levels else max(levels, default=0)
    ours = _runs(rows, "streamlab", level)
    if ours:
        over = [r["gap_p99_over_schedule_ms"] for r in ours]
        report.figure(f"sse_{level}_p99_gap_over_schedule_ms", spread(over)[0], "ms", target=GAP_TARGET_MS,
                      note=_said(over, " ms"), rounds=over)
        print(f"many_streams: p99 gap over the schedule at {level}, streamlab: {_said(over, ' ms')}", flush=True)
    ratios = paired_ratios(rows, "streamlab", "uvicorn+starlette", level, "cpu_s_per_10k_events")
    if ratios:
        report.ratio(f"cpu_per_event_vs_starlette_{level}", spread(ratios)[0], target=1.0, note=_said(ratios, "x"),
                     rounds=ratios)
        print(f"many_streams: CPU per event against Starlette's at {level}, round by round: "
              f"{', '.join(f'{x:.2f}x' for x in ratios)}; {_said(ratios, 'x')}", flush=True)
    ws_level = TARGET_LEVEL if TARGET_LEVEL in ws_levels else max(ws_levels, default=0)
    ws_ratios = paired_ratios(rows, "streamlab-ws", "websockets", ws_level, "cpu_s_per_10k_events")
    if ws_ratios:
        report.ratio(f"ws_cpu_per_event_vs_websockets_{ws_level}", spread(ws_ratios)[0], note=_said(ws_ratios, "x"))

    # For the chapter's charts: the distribution of gaps at the target levels (the first round), every row in full.
    report.data["gaps_ms"] = {
        f"{r['server']} {r['protocol']} {r['streams']}": r.get("gaps_ms_sample", [])
        for r in rows if r["streams"] in (level, ws_level) and not r.get("error") and r["round"] == 1
    }
    report.data["rows"] = [{k: v for k, v in r.items() if k != "gaps_ms_sample"} for r in rows]
    texts = {r["sample_text"] for r in rows if not r.get("error") and r["completed"]}
    if len(texts) > 1:
        print(f"many_streams: the servers did not all stream the same text: {sorted(texts)}", flush=True)
    failed = [r for r in rows if r.get("error") or r["failed"]]
    for r in failed:
        print(f"many_streams: {r['server']} at {r['streams']} (round {r['round']}): {r.get('error') or r['failures']}",
              flush=True)
    if any(not math.isfinite(r.get("gap_p99_ms", 0.0)) for r in rows if not r.get("error")):
        print("many_streams: a run delivered too few events to measure its gaps", flush=True)
    report.save()
    return report


if __name__ == "__main__":
    main()
