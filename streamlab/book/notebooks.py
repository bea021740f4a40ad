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
was recorded by an earlier chapter *in this run*. Its kernels also get a
temporary ``STREAMLAB_DATA``, removed at the end: the servers the chapters
start each have a throwaway store already (``streamlab.lab.setups.runner``), and
this keeps anything else that opens the default store out of the reader's
own conversations too. The run keeps one warm starter (``streamlab.net.warm``)
that the kernels and their model servers are forked from
(``streamlab.book.warm_kernel``): each skips the seconds of importing IPython,
pandas, torch and transformers, and is otherwise the program it would be.

A run replaces only what it produced. What the user typed (``--only``,
``-p``) is checked against the chapters before anything runs, and a mistake
changes nothing under ``build/``; a chapter that fails keeps its previous
results and time, is named in ``timings.json``'s ``failed``, and says where
its partly executed notebook is, with the traceback in it.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from streamlab.lab.results.records import BUILD, NOTEBOOKS, RUN_ID
from streamlab.lab.setups.runner import DATA
from streamlab.net import warm
from streamlab.net.errors import ArgumentParser, UserError


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
    """Execute one notebook with papermill; return the figures it recorded.

    The chapter's previous results file stays until this run has written its
    own: a chapter that fails (or is interrupted) leaves the last good one in
    place, so the report never loses a chapter to a failed rerun, and never
    shows half a run's figures as a whole one's.
    """
    out_dir = Path(out_dir)
    executed = out_dir / "notebooks" / notebook.name
    results = out_dir / "results" / f"{notebook.stem}.json"
    executed.parent.mkdir(parents=True, exist_ok=True)
    results.parent.mkdir(parents=True, exist_ok=True)
    kept = results.with_name(f".{results.name}.previous")  # not a chapter's name: the report never reads it
    if results.exists():
        os.replace(results, kept)
    try:
        papermill_run(notebook, executed, results, parameters, timeout=timeout, progress=progress)
        figures = json.loads(results.read_text(encoding="utf-8"))
    except BaseException:
        if kept.exists():
            os.replace(kept, results)
        else:
            results.unlink(missing_ok=True)
        raise
    kept.unlink(missing_ok=True)
    return figures


def papermill_run(
    notebook: Path, executed: Path, results: Path, parameters: dict[str, Any] | None, *, timeout: int, progress: bool
) -> None:
    """Run ``notebook`` into ``executed`` in its own folder, telling it where to record its results."""
    import papermill as pm

    from streamlab.book.warm_kernel import WarmKernelManager

    params = {"results_path": str(results.resolve()), **(parameters or {})}
    pm.execute_notebook(
        str(notebook),
        str(executed),
        parameters=params,
        cwd=str(notebook.parent),
        kernel_name="python3",
        progress_bar=progress,
        execution_timeout=timeout,
        config=kernel_config(),
        kernel_manager_class=WarmKernelManager,  # forked by the run's warm starter where one runs, else as usual
    )


def kernel_config() -> Any:
    """The kernel manager's settings for every notebook run, chapters and grading: CurveZMQ keys, where it can.

    ipykernel 7 warns, on every start of a kernel whose sockets are plain TCP,
    "Kernel is running over TCP without encryption ... Use IPC transport or
    launch with kernel manager-provisioned CurveZMQ keys": a paragraph on the
    teacher's terminal per notebook graded. jupyter_client 8.10's
    ``KernelManager.transport_encryption = "auto"`` provisions those keys when
    the kernelspec says it supports them (ipykernel's does), so the cause and
    its warning go together. With an older jupyter_client, or a pyzmq built
    without CurveZMQ, nothing is set and the kernel runs as it did.
    """
    import zmq
    from jupyter_client import KernelManager
    from traitlets.config import Config

    if "transport_encryption" not in KernelManager.class_trait_names() or not zmq.has("curve"):
        return Config()
    return Config({"KernelManager": {"transport_encryption": "auto"}})


def parameter_names(notebook: Path) -> set[str]:
    """The names a chapter's ``parameters`` cell assigns: the only ones a ``-p`` can change."""
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    names: set[str] = set()
    for cell in cells:
        if "parameters" not in cell.get("metadata", {}).get("tags", []):
            continue
        for node in ast.parse("".join(cell.get("source", ""))).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def parse_parameters(items: list[str], known: set[str]) -> dict[str, Any]:
    """``-p NAME=JSON`` items as a dict; a ``UserError`` for a malformed one or a NAME no chapter has.

    papermill injects any name it is given, so a misspelt one (``max_tokns``)
    would run the whole book with the default it meant to change.
    """
    params: dict[str, Any] = {}
    for item in items:
        name, equals, value = item.partition("=")
        name = name.strip()
        if not equals or not name:
            raise UserError(f"-p {item!r}: give NAME=VALUE, e.g. -p max_tokens=20")
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    unknown = sorted(set(params) - known)
    if unknown:
        close = {n: difflib.get_close_matches(n, known, n=1) for n in unknown}
        hints = "; ".join(f"{n!r} (did you mean {c[0]!r}?)" if c else repr(n) for n, c in close.items())
        raise UserError(f"no chapter has the parameter {hints}: the parameters are {', '.join(sorted(known))}")
    return params


def select(all_chapters: list[Path], only: list[str]) -> list[Path]:
    """The chapters ``--only`` names (each value a part of a name), all of them without; a ``UserError`` for a miss."""
    missing = [o for o in only if not any(o in nb.name for nb in all_chapters)]
    if missing:
        names = ", ".join(nb.stem for nb in all_chapters)
        raise UserError(f"no chapter matches --only {' '.join(missing)}: the chapters are {names}")
    return [nb for nb in all_chapters if not only or any(o in nb.name for o in only)]


def failure(nb: Path, executed: Path, err: BaseException) -> str:
    """One line for a chapter that failed: which cell, what it raised, where its partly executed copy is."""
    where = f"in cell [{err.exec_count}]" if getattr(err, "exec_count", None) is not None else ""
    what = (f"{err.ename}: {err.evalue}" if hasattr(err, "ename") else f"{type(err).__name__}: {err}")
    what = " ".join(what.split())
    copy = f"its partly executed notebook: {executed}" if executed.is_file() else f"it wrote no notebook ({executed})"
    return f"chapter {nb.stem} failed{' ' + where if where else ''}: {what[:300]}; {copy}"


@contextmanager
def data_folder_of_its_own() -> Iterator[Path]:
    """``STREAMLAB_DATA`` set to a fresh temporary folder for the kernels started inside; removed, and restored, after."""
    saved = os.environ.get(DATA)
    with tempfile.TemporaryDirectory(prefix="streamlab-book-data-") as folder:
        os.environ[DATA] = folder
        try:
            yield Path(folder)
        finally:
            if saved is None:
                os.environ.pop(DATA, None)
            else:
                os.environ[DATA] = saved


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="python -m streamlab run-notebooks",
        description="Execute the chapters in order with papermill, each in a fresh kernel: the executed copies in"
        " OUT/notebooks/, the recorded figures in OUT/results/, the charts in OUT/figures/; then print each"
        " headline and time (OUT/results/timings.json) and write OUT/report.html. A chapter that fails keeps"
        " its previous results and timing, and the run stops there, naming its partly executed notebook.",
    )
    parser.add_argument("--only", action="append", default=[],
                        help="run the chapters whose name contains this (repeatable); one that matches none is refused")
    parser.add_argument("--out", type=Path, default=BUILD, help="output folder (default: build/)")
    parser.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=JSON",
                        help="a parameter for every chapter, e.g. -p model_name='\"Qwen/Qwen2.5-1.5B-Instruct\"';"
                        " NAME must be one a chapter's parameters cell assigns")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} is a file: name a folder (default: build/)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Everything the user typed is checked before anything is run or written.
    all_chapters = chapters()
    selected = select(all_chapters, args.only)
    params = parse_parameters(args.parameter, set().union(*(parameter_names(nb) for nb in all_chapters)))
    os.environ[RUN_ID] = uuid.uuid4().hex  # the kernels inherit it: recordings made in this run say so
    cpu: dict[str, float] = {}
    from streamlab.book.warm_kernel import warm_kernels

    # One warm starter for the run: each chapter's kernel, and every model server it starts, skips the imports.
    with data_folder_of_its_own(), warm_kernels():
        headlines, seconds, failed = run_chapters(selected, params, args.out, cpu)
    print("\nstreamlab headlines")
    for line in headlines:
        print(f"  {line}")
    print()
    if seconds:
        print(timing_table(seconds, cpu))
    write_timings(seconds, args.out / "results" / "timings.json", parameters=params, failed=failed, cpu=cpu)
    from streamlab.book.report import write_report

    print(f"\nthe run in one page: {write_report(args.out)} (figures in {args.out / 'figures'}/)")
    if failed:
        (error,) = (f["error"] for f in failed.values())
        print(f"streamlab run-notebooks: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


def cpu_seconds() -> float:
    """CPU used so far by this process and every process it (or they) waited for: the kernels and their servers.

    The servers a warm starter forked (``streamlab.lab.setups.runner.warm_starts``) are its children, not
    the kernels': the starter counts them, and says so when asked.
    """
    import resource

    return warm.ask_cpu() + sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def busy_share(cpu: float, wall: float) -> float:
    """How much of the machine a chapter kept busy: its CPU seconds over its wall seconds on every core."""
    return cpu / (wall * (os.cpu_count() or 1)) if wall > 0 else 0.0


def run_chapters(selected: list[Path], params: dict[str, Any], out: Path, cpu: dict[str, float] | None = None
                 ) -> tuple[list[str], dict[str, float], dict[str, dict[str, Any]]]:
    """Execute each chapter in turn, printing its progress; its headlines, times and (the first) failure.

    ``cpu``, if given, gets each chapter's CPU seconds (its kernel and the
    servers it started): next to its wall time, what it spent waiting.
    """
    headlines, seconds, failed = [], {}, {}
    for nb in selected:
        print(f"==> {nb.name}", flush=True)
        started, used = time.perf_counter(), cpu_seconds()
        executed = out / "notebooks" / nb.name
        try:
            figures = execute(nb, parameters=params, out_dir=out, progress=True)
        except Exception as err:  # noqa: BLE001 - a chapter's own failure: said in one line, the run stops here
            failed[nb.stem] = {"seconds": round(time.perf_counter() - started, 1), "notebook": str(executed),
                               "error": failure(nb, executed, err)}
            break
        seconds[nb.stem] = time.perf_counter() - started
        spent = cpu_seconds() - used
        if cpu is not None:
            cpu[nb.stem] = spent
        print(f"    done in {seconds[nb.stem]:.0f} s ({spent:.0f} s of CPU: {busy_share(spent, seconds[nb.stem]):.0%} of"
              f" {os.cpu_count()} cores) -> {executed}", flush=True)
        said = proofread(executed, figures["headline"])
        if said:
            print(f"    {said}", flush=True)
        headlines.append(figures["headline"])
    return headlines, seconds, failed


def proofread(executed: Path, headline: str) -> str:
    """One line naming what ``streamlab.book.proofread`` found in an executed chapter (its first problem), or ''."""
    from streamlab.book.proofread import notebook_problems
    from streamlab.book.wording import plural

    problems = notebook_problems(executed, headline=headline)
    if not problems:
        return ""
    return (f"proofread: {plural(len(problems), 'problem')}, the first: {problems[0][:160]} "
            f"(all of them: python -m streamlab.book.proofread {executed})")


def timing_table(seconds: dict[str, float], cpu: dict[str, float] | None = None) -> str:
    """Each chapter's time and the total, as lines to print; with ``cpu``, how busy each kept the machine."""
    width = max([len(name) for name in seconds] + [len("total")])
    cpu = cpu or {}

    def busy(names: list[str]) -> str:
        if not names or any(name not in cpu for name in names):
            return ""
        used, wall = sum(cpu[name] for name in names), sum(seconds[name] for name in names)
        return f"  {used:6.0f} s of CPU, {busy_share(used, wall):4.0%} busy"

    lines = ["streamlab chapter times", *(f"  {name:<{width}}  {s:6.0f} s{busy([name])}" for name, s in seconds.items())]
    lines.append(f"  {'total':<{width}}  {sum(seconds.values()):6.0f} s{busy(list(seconds))}"
                 f" ({sum(seconds.values()) / 60:.1f} min)")
    return "\n".join(lines)


def write_timings(seconds: dict[str, float], path: Path, *, parameters: dict[str, Any] | None = None,
                  failed: dict[str, dict[str, Any]] | None = None, cpu: dict[str, float] | None = None) -> None:
    """``build/results/timings.json``: seconds per chapter (with the papermill kernel's start), the total, the machine.

    Merged into what the file held: a chapter this run did not time (not
    selected, or failed) keeps the time of the last run that did, so a rerun
    of one chapter, or a failed one, loses nobody's time. ``failed`` names
    the chapters whose last run failed (how long it ran, its error, its
    partly executed notebook); ``this_run`` the ones timed now.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = {}
    times = {**(before.get("chapters") or {}), **{name: round(s, 1) for name, s in seconds.items()}}
    cpu_times = {**(before.get("cpu_seconds") or {}), **{name: round(s, 1) for name, s in (cpu or {}).items()}}
    failures = {name: f for name, f in (before.get("failed") or {}).items() if name not in seconds}
    failures.update(failed or {})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    path.write_text(json.dumps({
        "chapters": times,
        "total": round(sum(times.values()), 1),
        "cpu_seconds": cpu_times,  # each chapter's kernel and the processes it started, against its wall time
        "this_run": list(seconds),
        "failed": failures,
        "cpus": os.cpu_count(),
        "load_average_at_end": None if load is None else round(load, 2),
        "parameters": parameters or {},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
