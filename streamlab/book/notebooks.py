"""``python -m streamlab run-notebooks``: execute every chapter in order with papermill.

Each chapter runs in a fresh kernel with ``notebooks/`` as its working folder
(so it does not matter where the command is typed), writes its executed copy to
``build/notebooks/``, its recorded figures to ``build/results/`` and its charts
to ``build/figures/NN_name/`` (``streamlab.book.figures``), and this command
prints each chapter's headline line, then each chapter's time and the total
(also written to ``build/results/timings.json``), and ends by writing
``build/report.html`` (``streamlab.book.report``). The chapters of one run
share what they measured through ``build/runs/`` (``streamlab.book.chapter.recorded``):
each run gets its own ``STREAMLAB_RUN_ID``, so a chapter can say that its data
was recorded by an earlier chapter *in this run*.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from streamlab.book.chapter import BUILD, NOTEBOOKS, RUN_ID


def chapters(folder: Path = NOTEBOOKS) -> list[Path]:
    """The numbered chapters, in reading order."""
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))


def execute(
    notebook: Path,
    *,
    parameters: dict[str, Any] | None = None,
    out_dir: Path = BUILD,
    timeout: int = 1800,
    progress: bool = False,
) -> dict[str, Any]:
    """Execute one notebook with papermill; return the figures it recorded."""
    out_dir = Path(out_dir)
    executed = out_dir / "notebooks" / notebook.name
    results = out_dir / "results" / f"{notebook.stem}.json"
    executed.parent.mkdir(parents=True, exist_ok=True)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    papermill_run(notebook, executed, results, parameters, timeout=timeout, progress=progress)
    return json.loads(results.read_text(encoding="utf-8"))


def papermill_run(
    notebook: Path, executed: Path, results: Path, parameters: dict[str, Any] | None, *, timeout: int, progress: bool
) -> None:
    """Run ``notebook`` into ``executed`` in its own folder, telling it where to record its results."""
    import papermill as pm

    params = {"results_path": str(results.resolve()), **(parameters or {})}
    pm.execute_notebook(
        str(notebook),
        str(executed),
        parameters=params,
        cwd=str(notebook.parent),
        kernel_name="python3",
        progress_bar=progress,
        execution_timeout=timeout,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamlab run-notebooks", description=__doc__)
    parser.add_argument("--only", action="append", default=[], help="run chapters whose name contains this (repeatable)")
    parser.add_argument("--out", type=Path, default=BUILD, help="output folder (default: build/)")
    parser.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=JSON",
                        help="a parameter for every chapter, e.g. -p model_name='\"Qwen/Qwen2.5-1.5B-Instruct\"'")
    args = parser.parse_args(argv)
    params = {}
    for item in args.parameter:
        name, _, value = item.partition("=")
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    selected = [nb for nb in chapters() if not args.only or any(o in nb.name for o in args.only)]
    os.environ[RUN_ID] = uuid.uuid4().hex  # the kernels inherit it: recordings made in this run say so
    headlines, seconds = [], {}
    for nb in selected:
        print(f"==> {nb.name}", flush=True)
        started = time.perf_counter()
        figures = execute(nb, parameters=params, out_dir=args.out, progress=True)
        seconds[nb.stem] = time.perf_counter() - started
        print(f"    done in {seconds[nb.stem]:.0f} s -> {args.out / 'notebooks' / nb.name}", flush=True)
        headlines.append(figures["headline"])
    print("\nstreamlab headlines")
    for line in headlines:
        print(f"  {line}")
    print()
    print(timing_table(seconds))
    write_timings(seconds, args.out / "results" / "timings.json", parameters=params)
    from streamlab.book.report import write_report

    print(f"\nthe run in one page: {write_report(args.out)} (figures in {args.out / 'figures'}/)")
    return 0


def timing_table(seconds: dict[str, float]) -> str:
    """Each chapter's time and the total, as lines to print."""
    width = max([len(name) for name in seconds] + [len("total")])
    lines = ["streamlab chapter times", *(f"  {name:<{width}}  {s:6.0f} s" for name, s in seconds.items())]
    lines.append(f"  {'total':<{width}}  {sum(seconds.values()):6.0f} s ({sum(seconds.values()) / 60:.1f} min)")
    return "\n".join(lines)


def write_timings(seconds: dict[str, float], path: Path, *, parameters: dict[str, Any] | None = None) -> None:
    """``build/results/timings.json``: seconds per chapter (with the papermill kernel's start), the total, the machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    path.write_text(json.dumps({
        "chapters": {name: round(s, 1) for name, s in seconds.items()},
        "total": round(sum(seconds.values()), 1),
        "cpus": os.cpu_count(),
        "load_average_at_end": None if load is None else round(load, 2),
        "parameters": parameters or {},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
