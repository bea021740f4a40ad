"""What the shared log costs per event: Redis round trips, commands and CPU, against the log in memory.

    python benchmarks/shared_log.py [--events 1000] [--rounds 7] [--tiny]

One writer and one reader per round, each side running the server's own code
(``streamlab/lab/experiments/log_cost.py``): in memory, ``Run.add`` and ``Run.follow``;
in Redis, the worker's one pipelined round trip per piece (``Worker.step``)
and a replica's ``XREAD BLOCK`` (``SharedRegistry.follow``), against a private
redis-server on a loopback port. CPU counts this process and redis-server
both. Rounds alternate the two logs; the ratio is taken round by round, and
its median and spread are printed. A token of SmolLM2-135M costs tens of
milliseconds of CPU on the machines this book runs on: the ratio says how
much dearer the log is, the per-event microseconds how much that is next to a token.
"""

from __future__ import annotations

import argparse
import asyncio

from streamlab.lab.results.measures import Report
from streamlab.lab.experiments.log_cost import compare
from streamlab.lab.outside.redis_server import run_redis

TINY = {"events": 50, "rounds": 2}


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000, help="events per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each log, alternating")
    parser.add_argument("--tiny", action="store_true", help="two rounds of 50 events (a smoke test)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.events, args.rounds = TINY["events"], TINY["rounds"]
    with run_redis() as redis:
        result = asyncio.run(compare(redis.url, events=args.events, rounds=args.rounds, redis_pid=redis.process.pid))
    rep = Report("shared_log", params={"events": args.events, "rounds": args.rounds, "tiny": args.tiny})
    for key, label in (("memory_cpu_us", "cpu_per_event_memory"), ("redis_cpu_us", "cpu_per_event_redis")):
        s = result[key]
        rep.figure(label, s["median"], "µs", note=f"rounds {s['low']:.1f}-{s['high']:.1f}")
    s = result["cpu_ratio"]
    rep.ratio("cpu_redis_over_memory", s["median"], note=f"rounds {s['low']:.1f}x-{s['high']:.1f}x")
    rep.figure("round_trips_per_event", result["round_trips"]["median"], "")
    rep.figure("redis_commands_per_event", result["commands"]["median"], "")
    rep.figure("wall_per_event_redis", result["redis_wall_us"]["median"], "µs")
    rep.table("rounds", [{"round": r["round"], "memory CPU µs/event": round(r["memory"]["cpu_us"], 2),
                          "Redis CPU µs/event": round(r["redis"]["cpu_us"], 1), "ratio": round(r["cpu_ratio"], 1),
                          "round trips/event": round(r["redis"]["round_trips"], 3),
                          "commands/event": round(r["redis"]["commands"], 2)} for r in result["rows"]])
    rep.save()
    return rep


if __name__ == "__main__":
    main()
