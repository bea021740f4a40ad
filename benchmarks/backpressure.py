"""A reader that takes 1 KB/s, under each backpressure policy: what the model makes, what the reader gets, where the bytes wait.

    python benchmarks/backpressure.py [--max-tokens 2400] [--duration 20] [--rate 1024] [--max-queued 256]
                                      [--slow-reader-timeout 10] [--route /v1/chat/completions] [--defaults]
                                      [--scripted-rate 150 | --model] [--tiny]

One server per policy (in a process of its own), one raw-socket
reader with a 4 KB receive buffer and an Ethernet-sized MSS, reading 1 KB/s of
a long OpenAI stream (``ignore_eos``), sampled every 0.25 s through the
server's ``GET /debug/queues``. The policies: unbounded; bounded at
``--max-queued`` pieces (the generation waits for its reader); bounded with a
short ``--slow-reader-timeout`` (the generation is stopped, ``slow_reader``).
The write timeout is off in these runs (at 1 KB/s it would cut the reader in
every one: see ``streamlab/lab/experiments/backpressure.py``); ``--defaults`` adds a run with
the server's defaults as shipped, write timeout included.

Figures per policy: tokens generated and pieces read at the end (the ratio: how
far the model ran ahead of its reader), the peak queue, the peak transport and
kernel buffers, the growth of the server's memory, the seconds it waited. The
time series are in the saved report (``data.series``) for chapter 11's charts.
By default the answer comes from the scripted source at 150 tokens/s
(``python -m streamlab serve --scripted-rate 150``: no model, labelled so in the
report), which obeys the bound as a model does: the ~150-290 KB of socket
buffers in front of the queue fill in seconds, and the three policies run in
a minute. ``--model`` serves the real model instead: at ~15 tokens/s those
buffers take ~100 s to fill at 1 KB/s, so give it ``--duration 150`` (about
8 minutes in all). ``--tiny`` runs three 2-second policies (a smoke test).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from streamlab.lab.experiments.backpressure import (
    DEMO_QUEUE,
    DEMO_TIMEOUT,
    DURATION,
    INTERVAL,
    MAX_TOKENS,
    READ_RATE,
    ROUTE,
    ROUTES,
    default_policy,
    policies,
    report,
    run,
)
from streamlab.lab.results.measures import Report

SCRIPTED_RATE = 150.0  # tokens/s: ~40 KB/s of OpenAI events against a 1 KB/s reader
SCRIPTED_DURATION = 20.0  # seconds per policy: the buffers fill in ~5 s at that rate
TINY = {"max_tokens": 2000, "duration": 2.0, "max_queued": 64, "slow_reader_timeout": 1.0}


def main(argv: list[str] | None = None, *, lm: Any = None) -> Report:
    """Run and save the report; ``lm``: a model object to serve in this process (the tests' fake one)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--duration", type=float, default=None,
                        help=f"seconds per policy (default 20 scripted, {DURATION:g} with --model)")
    parser.add_argument("--rate", type=float, default=READ_RATE, help="bytes per second the reader takes")
    parser.add_argument("--max-queued", type=int, default=DEMO_QUEUE, help="the bounded policies' bound")
    parser.add_argument("--slow-reader-timeout", type=float, default=DEMO_TIMEOUT, help="the stopping policy's timeout")
    parser.add_argument("--route", default=ROUTE, choices=ROUTES)
    parser.add_argument("--interval", type=float, default=INTERVAL, help="seconds between samples")
    parser.add_argument("--defaults", action="store_true", help="add a run with the server's defaults (write timeout on)")
    parser.add_argument("--scripted-rate", type=float, default=SCRIPTED_RATE, metavar="R",
                        help="serve a scripted source at R tokens/s (default %(default)s)")
    parser.add_argument("--model", action="store_true", help="serve the real model instead of the scripted source")
    parser.add_argument("--tiny", action="store_true", help="three 2-second policies, a smoke test")
    args = parser.parse_args(argv)
    if args.model:
        args.scripted_rate = None
    if args.duration is None:
        args.duration = DURATION if args.model else SCRIPTED_DURATION
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
    runs = policies(args.max_queued, args.slow_reader_timeout) + ([default_policy()] if args.defaults else [])
    server_args = ["--scripted-rate", f"{args.scripted_rate:g}"] if args.scripted_rate else []
    result = run(
        runs, lm=lm, server_args=server_args, route=args.route, max_tokens=args.max_tokens, duration=args.duration,
        rate=args.rate, interval=args.interval, progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    source = "in-process model" if lm is not None else (
        f"scripted {args.scripted_rate:g} tokens/s" if args.scripted_rate else "the model, in a server process")
    rep = report(result, params={"tiny": args.tiny, "source": source, "max_queued": args.max_queued,
                                 "slow_reader_timeout": args.slow_reader_timeout})
    rep.save()
    return rep


if __name__ == "__main__":
    main()
