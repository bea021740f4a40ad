"""Many readers through the shared log: Redis, batched workers and a replica against one ``serve``, side by side.

    python benchmarks/shared_scale.py [--readers 1,8,16] [--tokens 40] [--rounds 3] [--quick]

Three setups are started together (each loads the model once per process)
and measured in turn, round after round, the order turned each round so that
a drift of the machine falls on each alike:

- ``serve``: one plain ``python -m streamlab serve``, as shipped (the batched
  engine, ``--max-active`` 8 and the line past it); readers ``POST /stream``;
- ``log_1w``: a private redis-server, one worker (``python -m streamlab
  worker``, as shipped: batched, up to ``--max-active`` 8 jobs at once) and
  one model-less replica (``serve --events``); each reader ``POST
  /generations`` on the replica, then follows ``GET /generations/{id}/events``;
- ``log_2w``: the same with two workers (a Redis and a replica of their own).

N readers start together, each asking ``--tokens`` tokens (EOS ignored) of
its own prompt and seed, measured by ``streamlab.lab.experiments.scale`` (the
piece chapter 13 measures with too). Per setup and N: pieces per second in
all (every reader's text events over the wall time from the first request to
the last end), the slowest reader's time per token, the first text (from the
reader's first request, its POST: through the log that is two requests, the
job's queue and a worker's take), and whether every reader got its ``end``. The target (issue
31): through the log with one worker and one replica, at 8 readers, at least
0.8x one serve's pieces/s, the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any, Sequence

from streamlab.lab.experiments.scale import throughput
from streamlab.lab.outside.redis_server import run_redis
from streamlab.lab.results.measures import Report
from streamlab.lab.setups.replicas import start_workers
from streamlab.lab.setups.runner import all_started, start_servers

READERS = (1, 8, 16)
TOKENS = 40
ROUNDS = 3
QUICK = {"readers": [1, 2], "tokens": 8, "rounds": 1}
SETUPS = ("serve", "log_1w", "log_2w")
WORKERS = {"log_1w": 1, "log_2w": 2}
TARGET = 0.8  # log_1w's pieces/s against serve's, at 8 readers


def start_all(redis_urls: dict[str, str]) -> tuple[dict[str, int], list[Any]]:
    """Every process at once (the model loads are seconds each): the port each setup's readers use, and them all."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        servers = pool.submit(start_servers, {"serve": [], **{
            f"replica-{setup}": ["--scripted-rate", "30", "--events", url] for setup, url in redis_urls.items()}})
        workers = {setup: pool.submit(start_workers, url, WORKERS[setup]) for setup, url in redis_urls.items()}
        everything = all_started([servers, *workers.values()])
    started = [*everything[0].values(), *(worker for group in everything[1:] for worker in group)]
    named = servers.result()
    ports = {"serve": named["serve"].port, **{setup: named[f"replica-{setup}"].port for setup in redis_urls}}
    return ports, started


def measure(readers_at: Sequence[int], tokens: int, rounds: int, *, say: Any = print) -> dict[str, Any]:
    """Every setup at every N, ``rounds`` times: rows[setup][n] is the list of the rounds' figures."""
    rows: dict[str, dict[int, list[dict[str, Any]]]] = {s: {n: [] for n in readers_at} for s in SETUPS}
    with ExitStack() as stack:
        urls = {setup: stack.enter_context(run_redis()).url for setup in WORKERS}
        ports, started = start_all(urls)
        try:
            for setup in SETUPS:  # the first forward passes pay for warming up (a reader or two per worker)
                throughput(ports[setup], 2 * WORKERS.get(setup, 1), 4, shared=setup != "serve")
            for r in range(rounds):
                order = SETUPS[r % len(SETUPS):] + SETUPS[: r % len(SETUPS)]
                for setup in order:
                    for n in readers_at:
                        row = throughput(ports[setup], n, tokens, shared=setup != "serve")
                        rows[setup][n].append(row)
                        say(f"shared_scale:   round {r + 1} {setup} x{n}: {row['pieces_per_s']:.1f} pieces/s, slowest"
                            f" {row['tpot_worst_s'] * 1e3:.0f} ms/token, first text {row['first_text_p50_s']:.2f} s,"
                            f" ended {row['ended']}/{n} ({row['wall_s']:.1f} s)")
        finally:
            for process in started:
                process.stop()
    return rows


def median_of(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                        default=list(READERS), help="readers at once, e.g. 1,8,16")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="max_tokens of every answer")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of every setup, the order turned each")
    parser.add_argument("--quick", "--tiny", action="store_true", dest="quick",
                        help="one round of 1 and 2 readers, 8 tokens (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.readers, args.tokens, args.rounds = QUICK["readers"], QUICK["tokens"], QUICK["rounds"]
    rep = Report("shared_scale", params={"readers": args.readers, "tokens": args.tokens, "rounds": args.rounds,
                                         "quick": args.quick, "setups": list(SETUPS)})
    rows = measure(args.readers, args.tokens, args.rounds)
    rep.table("by setup and readers (medians of the rounds)", [
        {"setup": setup, "readers": n, "pieces/s": median_of(rs, "pieces_per_s"),
         "slowest reader (ms/token)": median_of(rs, "tpot_worst_s") * 1e3,
         "first text p50 (s)": median_of(rs, "first_text_p50_s"), "first text max (s)": median_of(rs, "first_text_max_s"),
         "ended": f"{sum(r['ended'] for r in rs)}/{sum(r['readers'] for r in rs)}"}
        for setup, by_n in rows.items() for n, rs in by_n.items()])
    at = 8 if 8 in args.readers else max(args.readers)
    for setup in SETUPS:
        rs = rows[setup][at]
        rep.figure(f"{setup}_pieces_per_s_at_{at}", median_of(rs, "pieces_per_s"), "pieces/s")
        rep.figure(f"{setup}_slowest_tpot_at_{at}", median_of(rs, "tpot_worst_s") * 1e3, "ms")
        rep.figure(f"{setup}_first_text_p50_at_{at}", median_of(rs, "first_text_p50_s"), "s")
    for setup, target in (("log_1w", TARGET), ("log_2w", None)):
        for n in args.readers:
            ratios = [log["pieces_per_s"] / alone["pieces_per_s"] for log, alone in zip(rows[setup][n], rows["serve"][n])]
            if n == at or n == max(args.readers):
                rep.ratio(f"{setup}_vs_serve_pieces_per_s_at_{n}", statistics.median(ratios),
                          target=target if n == at else None, op="≥", rounds=ratios,
                          note=f"rounds {min(ratios):.2f}x-{max(ratios):.2f}x")
    every = all(r["ended"] == r["readers"] for by_n in rows.values() for rs in by_n.values() for r in rs)
    rep.figure("every_reader_ended", 1.0 if every else 0.0, "", target=1.0, op="≥", exact=True)
    rep.data["rounds"] = {setup: {str(n): rs for n, rs in by_n.items()} for setup, by_n in rows.items()}
    rep.save()
    return rep


if __name__ == "__main__":
    main()
