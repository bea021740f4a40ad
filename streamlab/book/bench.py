"""``make bench``: every benchmark in benchmarks/ in its own process, then one summary of every target.

Each benchmark records what it measured in a :class:`streamlab.lab.results.measures.Report`
(the printed lines and ``build/bench/NAME.json``); this module runs them and reads
the saved reports back. Timings are never assertions in the test suite (the
machines are shared and noisy): a target is reported as met or missed, with by
how much, and docs/benchmarks.md quotes the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from streamlab.lab.results.measures import (
    BENCH_DIR, Measure, _fmt, format_table,
)

def load(folder: Path | None = None) -> list[dict[str, Any]]:
    folder = Path(folder) if folder is not None else BENCH_DIR
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]


def summary(reports: Sequence[dict[str, Any]]) -> str:
    """Every target of every saved report in one table: what was asked, what was measured, met or not."""
    rows = []
    for report in reports:
        for m in report["measures"]:
            if m.get("target") is None:
                continue
            spread = tuple(m["spread"]) if m.get("spread") else None
            # The one rule (``standing``), from the rounds the report kept: a report saved before it kept their
            # count reads as too few rounds to say.
            measure = Measure(m["key"], m["value"], m.get("unit", ""), m["target"], m.get("op", "≤"), spread=spread,
                              rounds=m.get("rounds"), exact=bool(m.get("exact")))
            rows.append({
                "benchmark": report["name"],
                "figure": m["key"],
                "measured": f"{_fmt(m['value'])}{'x' if m.get('unit') == 'x' else (' ' + m['unit'] if m.get('unit') else '')}",
                "target": f"{measure.op} {_fmt(m['target'])}",
                "verdict": measure.verdict(),
            })
    head = ", ".join(sorted({f"{r['date']} on {r['machine']}" for r in reports}))
    return f"benchmarks ({head})\n" + format_table(rows) if rows else "no targets recorded"


# The benchmarks in the order ``make bench`` runs them: cheap and model-free first.
BENCHMARKS = ("detokenizer", "decode_formats", "overhead", "shared_log", "prefill", "many_streams", "load",
              "backpressure", "shared_scale")
SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks"


def run(names: Sequence[str], *, tiny: bool = False, folder: Path | None = None) -> dict[str, dict[str, Any]]:
    """Run each benchmark script in its own process (a fresh interpreter each); return how each went."""
    import subprocess

    env = dict(os.environ)
    if folder is not None:
        env["STREAMLAB_BENCH_DIR"] = str(folder)
    outcome = {}
    for name in names:
        script = SCRIPTS / f"{name}.py"
        print(f"==> benchmarks/{script.name}{' --tiny' if tiny else ''}", flush=True)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(script), *(["--tiny"] if tiny else [])], env=env)
        seconds = time.perf_counter() - started
        print(f"    {'done' if done.returncode == 0 else f'FAILED ({done.returncode})'} in {seconds:.0f} s", flush=True)
        outcome[name] = {"returncode": done.returncode, "seconds": seconds}
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamlab.book.bench",
                                     description="Run the benchmarks (make bench), or print the summary of saved reports.")
    parser.add_argument("command", nargs="?", choices=("run", "summary"), default="summary")
    parser.add_argument("--only", action="append", default=[], help="run only this benchmark (repeatable)")
    parser.add_argument("--tiny", action="store_true", help="every benchmark at its tiny size (a smoke test)")
    parser.add_argument("--folder", type=Path, default=None, help=f"where reports go (default {BENCH_DIR})")
    args = parser.parse_args(argv)
    folder = args.folder or BENCH_DIR
    failed = []
    if args.command == "run":
        names = [n for n in BENCHMARKS if not args.only or n in args.only]
        outcome = run([n for n in names if (SCRIPTS / f"{n}.py").exists()], tiny=args.tiny, folder=folder)
        failed = [n for n, o in outcome.items() if o["returncode"]]
        print()
    reports = load(folder)
    if not reports:
        print(f"no reports in {folder}: run make bench", file=sys.stderr)
        return 1
    print(summary(reports))
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
