"""``python -m streamlab run-notebooks``: execute every chapter in order with papermill.

Each chapter runs in a fresh kernel with ``notebooks/`` as its working folder
(so it does not matter where the command is typed), writes its executed copy to
``build/notebooks/`` and its figures to ``build/results/``, and this command
prints each chapter's headline line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .chapter import BUILD, NOTEBOOKS


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
    headlines = []
    for nb in selected:
        print(f"==> {nb.name}", flush=True)
        started = time.perf_counter()
        figures = execute(nb, parameters=params, out_dir=args.out, progress=True)
        print(f"    done in {time.perf_counter() - started:.0f} s -> {args.out / 'notebooks' / nb.name}", flush=True)
        headlines.append(figures["headline"])
    print("\nstreamlab headlines")
    for line in headlines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
