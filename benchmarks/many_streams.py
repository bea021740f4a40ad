"""Many streams, the server alone: streamlab against uvicorn + Starlette, sse-starlette and websockets.

    python benchmarks/many_streams.py [--levels 100,1000,5000] [--ws 1000] [--tokens 60] [--rate 20] [--tiny]

No model: every server streams the same *scripted source* (``python -m
streamlab serve --scripted-rate 20``; the rivals of ``streamlab.lab.rivals`` serve
the very same class), a fixed text at 20 tokens/s, so what is measured is the
server. At each level N, N streams of ``--tokens`` tokens start spread over
``--spread`` seconds, driven from a separate process (``python -m
streamlab.lab.many_streams drive``) that notes every event's arrival. Each server
runs in a fresh process per level (memory once taken stays with a Python
process). Per run: events delivered per second while all N are open (the
schedule asks N x rate), the gaps between a stream's events (p50, p99, against
the 50 ms schedule), server CPU seconds per 10,000 events (user + system, from
the first connection to the last close, so it includes accepting, parsing and
for streamlab the store), memory per open stream ((RSS with N open - RSS
idle) / N).

The rivals run uvicorn with ``--loop asyncio --http h11``: pure Python, like
ours (uvloop and httptools are C, and would compare event loops, not servers).

Targets, at 1,000 SSE streams: the p99 gap within 20 ms of the schedule, and
CPU per event no worse than uvicorn + Starlette's. The driver and the server
share the machine (2 cores here): the driver's own CPU is in the table.
"""

from __future__ import annotations

import argparse
import math

from streamlab.book.bench import Report
from streamlab.lab.many_streams import SSE_SERVERS, WS_SERVERS, compare, table
from streamlab.server.scripted import scripted_name

KEYS = {"streamlab": "streamlab", "streamlab-ws": "streamlab", "uvicorn+starlette": "starlette",
        "uvicorn+sse-starlette": "sse_starlette", "websockets": "websockets"}
TARGET_LEVEL = 1000
GAP_TARGET_MS = 20.0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _find(rows: list[dict], server: str, n: int) -> dict | None:
    return next((r for r in rows if r["server"] == server and r["streams"] == n and not r.get("error")), None)


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="100,1000,5000", help="SSE streams at once, per run")
    parser.add_argument("--ws", default="1000", help="WebSocket streams at once, per run")
    parser.add_argument("--tokens", type=int, default=60, help="tokens per stream (60 at 20/s: 3 s)")
    parser.add_argument("--rate", type=float, default=20.0, help="the scripted source's tokens per second")
    parser.add_argument("--spread", type=float, default=1.0, help="seconds over which a level's streams start")
    parser.add_argument("--servers", default=None, help="only these (e.g. streamlab,uvicorn+starlette)")
    parser.add_argument("--tiny", action="store_true", help="a quick run for the test: 5 streams of 10 tokens")
    args = parser.parse_args(argv)
    if args.tiny:
        levels, ws_levels, tokens, spread, warmup = [5], [5], 10, 0.2, 2
    else:
        levels, ws_levels, tokens, spread, warmup = _ints(args.levels), _ints(args.ws), args.tokens, args.spread, 10
    chosen = args.servers.split(",") if args.servers else None
    sse_servers = [s for s in SSE_SERVERS if chosen is None or s in chosen]
    ws_servers = [s for s in WS_SERVERS if chosen is None or s in chosen]
    source = f"{scripted_name(args.rate)} (scripted source, no model)"
    report = Report("many_streams", params={
        "levels": levels, "ws_levels": ws_levels, "tokens": tokens, "rate": args.rate, "spread_s": spread,
        "source": source, "rivals": "uvicorn --loop asyncio --http h11 (pure Python, as ours); websockets' asyncio server",
        "driver": "one separate process, raw asyncio sockets",
    })
    print(f"many_streams: every server streams {source}; the load comes from a separate process", flush=True)
    rows = compare(levels, ws_levels, tokens=tokens, rate=args.rate, spread=spread, sse_servers=sse_servers,
                   ws_servers=ws_servers, warmup=warmup)

    report.table("streams at once (one fresh server process per row)", table(rows))
    for row in rows:
        if row.get("error"):
            continue
        key = f"{row['protocol']}_{row['streams']}_{KEYS[row['server']]}"
        report.figure(f"{key}_gap_p99_ms", row["gap_p99_ms"], "ms")
        report.figure(f"{key}_cpu_s_per_10k_events", row["cpu_s_per_10k_events"], "s")

    # The targets at 1,000 SSE streams (at a tiny size: the largest level run).
    level = TARGET_LEVEL if TARGET_LEVEL in levels else max(levels, default=0)
    ours, starlette = _find(rows, "streamlab", level), _find(rows, "uvicorn+starlette", level)
    if ours is not None:
        report.figure(f"sse_{level}_p99_gap_over_schedule_ms", ours["gap_p99_over_schedule_ms"], "ms",
                      target=GAP_TARGET_MS)
    if ours is not None and starlette is not None and starlette["cpu_s_per_10k_events"] > 0:
        report.ratio(f"cpu_per_event_vs_starlette_{level}",
                     ours["cpu_s_per_10k_events"] / starlette["cpu_s_per_10k_events"], target=1.0)
    ws_level = TARGET_LEVEL if TARGET_LEVEL in ws_levels else max(ws_levels, default=0)
    ours_ws, rival_ws = _find(rows, "streamlab-ws", ws_level), _find(rows, "websockets", ws_level)
    if ours_ws is not None and rival_ws is not None and rival_ws["cpu_s_per_10k_events"] > 0:
        report.ratio(f"ws_cpu_per_event_vs_websockets_{ws_level}",
                     ours_ws["cpu_s_per_10k_events"] / rival_ws["cpu_s_per_10k_events"])

    # For the chapter's charts: the distribution of gaps at the target levels, and every row in full.
    report.data["gaps_ms"] = {
        f"{r['server']} {r['protocol']} {r['streams']}": r.get("gaps_ms_sample", [])
        for r in rows if r["streams"] in (level, ws_level) and not r.get("error")
    }
    report.data["rows"] = [{k: v for k, v in r.items() if k != "gaps_ms_sample"} for r in rows]
    texts = {r["sample_text"] for r in rows if not r.get("error") and r["completed"]}
    if len(texts) > 1:
        print(f"many_streams: the servers did not all stream the same text: {sorted(texts)}", flush=True)
    failed = [r for r in rows if r.get("error") or r["failed"]]
    for r in failed:
        print(f"many_streams: {r['server']} at {r['streams']}: {r.get('error') or r['failures']}", flush=True)
    if any(not math.isfinite(r.get("gap_p99_ms", 0.0)) for r in rows if not r.get("error")):
        print("many_streams: a run delivered too few events to measure its gaps", flush=True)
    report.save()
    return report


if __name__ == "__main__":
    main()
