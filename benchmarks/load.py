"""The model under load: 1-16 readers at once, a thread per generation against the batched engine, and the server as shipped.

    python benchmarks/load.py [--concurrency 1,2,4,8,16] [--tokens 64] [--engines threads,batched,default,float32,llama.cpp] [--rounds 1] [--tiny]

The real model behind the real server (a process per engine), N readers on
``/stream`` started together, the same prompts and ``max_tokens`` (EOS
ignored). Per engine and N: time to first token (median, p95), time per
output token (median), gaps between pieces (p50, p99, max, share above the
0.2 s reading threshold), total tokens/s; the ratio
``batched_vs_threads_tokens_per_s_at_8`` against the target ≥ 1. ``default`` is
``serve`` with no flags (readers past ``--max-active`` wait in its line) and
``float32`` the same in float32: at 8 readers the default must make ≥ 1.5x one
reader's tokens/s with its slowest reader under the threshold per token, refuse
none at 16, and one reader must decode ≥ 1.6x float32's. The gap and
TTFT samples are kept in the report's data for charts. See
:mod:`streamlab.lab.experiments.load`. At the default size it takes ~5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse

from streamlab.lab.results.measures import Report
from streamlab.lab.experiments.load import AS_SHIPPED, CONCURRENCY, ENGINES, LLAMA_CPP, TOKENS, measure


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=numbers, default=list(CONCURRENCY), help="readers at once, e.g. 1,2,4,8,16")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="max_tokens of every answer")
    parser.add_argument("--engines", type=lambda s: s.split(","), default=[*ENGINES, *AS_SHIPPED, LLAMA_CPP],
                        help=f"which servers; {LLAMA_CPP} is skipped, saying why, where make engine has not built it")
    parser.add_argument("--rounds", type=int, default=1, help="every engine at every N this many times, in turns "
                        "(a target's verdict needs 5)")
    parser.add_argument("--tiny", action="store_true", help="a quick run for the test (1 and 2 readers, 8 tokens)")
    args = parser.parse_args(argv)
    concurrency, tokens = ([1, 2], 8) if args.tiny else (args.concurrency, args.tokens)
    report = Report("load", params={"concurrency": concurrency, "tokens": tokens, "engines": args.engines})
    measure(concurrency, tokens, args.engines, report=report, rounds=1 if args.tiny else args.rounds)
    report.save()
    return report


if __name__ == "__main__":
    main()
