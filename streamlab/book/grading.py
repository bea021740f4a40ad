"""Checks that grade the exercises, and a command that grades a class.

An exercise notebook (``notebooks/exercises/``) asks the student to write one
piece of the pipeline, then runs it against real data, and where it matters
the real server. Every check says what it expected and what came back,
because "AssertionError" teaches nothing:

    PASS no piece holds U+FFFD
    FAIL joined text equals the original: expected 'Con vẹt 🦜 nói', got 'Con vẹt nói'

A check cell never stops the notebook. ``Grader.section`` names the checks a
cell makes before it runs them; if the student's code raises (at first,
``NotImplementedError``), each check the cell did not get to is recorded as
failed with the reason, and the next cell runs. So an unsolved notebook
executes from top to bottom under papermill, and its results say which
checks failed and why, each one, instead of a traceback at the first.

Results go to a JSON file (the notebook's ``results_path`` parameter), written
after every check, so even a notebook that crashes for another reason leaves
what it had.

The command grades notebooks the way a teacher collects them::

    python -m streamlab.book.grading alice/ex1_detokenizer.ipynb bob/ex1_detokenizer.ipynb
    python -m streamlab.book.grading --solutions notebooks/exercises/solutions notebooks/exercises/ex*.ipynb
    python -m streamlab.book.grading --student-copy build/exercises   # what `make exercises` runs

It executes each notebook with papermill in a fresh kernel and prints a table
of checks per notebook, with the path of its executed copy, then one line per
notebook. The kernels talk to the grader over sockets encrypted with CurveZMQ
where the kernel can (``streamlab.book.notebooks.kernel_config``, as for every chapter), which also keeps ipykernel's
"running over TCP without encryption" warning out of the grade.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import traceback
import contextlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from streamlab.lab.results.records import BUILD, NOTEBOOKS
from streamlab.book.notebooks import papermill_run

EXERCISES = NOTEBOOKS / "exercises"
SOLUTIONS = EXERCISES / "solutions"
STUDENT_COPY = BUILD / "exercises"
MAX_SHOWN = 300  # characters of an expected or received value shown in a message

NOT_IMPLEMENTED = "not implemented yet"

__all__ = [
    "CheckResult",
    "CountingTokenizer",
    "Grader",
    "build_student_copy",
    "check",
    "exercises",
    "format_table",
    "grade_notebook",
    "hex_bytes",
    "main",
    "scripted_server",
    "show",
    "solution_for",
    "try_it",
]


# --------------------------------------------------------------------------
# One check
# --------------------------------------------------------------------------


@dataclass
class CheckResult:
    """One line of a grade: the check's name, whether it passed, and what it saw.

    ``soft`` marks a check a machine can only approximate (a free-text
    answer searched for a word): a teacher should read the answer itself.
    """

    name: str
    passed: bool
    message: str
    soft: bool = False

    def line(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        if self.soft:
            status += " (soft)"
        return f"{status} {self.name}" + ("" if self.passed else f": {self.message}")


def show(value: Any, limit: int = MAX_SHOWN) -> str:
    """A value as a message shows it: strings as they are, anything else as its repr, cut short.

    Pass ``repr(text)`` when quotes and escapes matter (U+FFFD, a trailing
    space, ``\\r``): the message shows exactly what it is given.
    """
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} characters)"
    return text


def _failure(exc: BaseException) -> str:
    """Why a check could not run, in a line: what raised, and where."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = last.name if last.name not in ("<module>", "<lambda>") else ""
    if isinstance(exc, NotImplementedError):
        detail = str(exc) or (f"{where} raises NotImplementedError" if where else "raise NotImplementedError")
        return f"{NOT_IMPLEMENTED}: {detail}"
    place = f" (in {where}, line {frames[-1].lineno})" if where else ""
    text = str(exc) or "(no message)"
    return f"raised {type(exc).__name__}: {show(text, 200)}{place}"


# --------------------------------------------------------------------------
# The grader: collects checks, survives the student's exceptions, records
# --------------------------------------------------------------------------


class Grader:
    """The checks of one exercise notebook, in order; the latest one created is ``current``.

    ``results_path`` (the notebook's papermill parameter) names the JSON
    file the results are written to; None keeps them in memory only.
    Checking the same name twice (a student re-running a cell) replaces the
    earlier result.
    """

    current: Grader | None = None

    def __init__(self, exercise: str, results_path: str | Path | None = None, *, quiet: bool = False) -> None:
        self.exercise = exercise
        self.results_path = Path(results_path) if results_path else None
        self.quiet = quiet
        self.results: dict[str, CheckResult] = {}
        Grader.current = self
        self._save()

    # -- recording -------------------------------------------------------------

    def check(
        self, name: str, condition: Any, expected: Any = None, got: Any = None, *, soft: bool = False
    ) -> bool:
        """Record one check and print ``PASS name`` or ``FAIL name: expected …, got …``."""
        passed = bool(condition)
        if passed:
            message = f"got {show(got)}" if got is not None else "ok"
        else:
            message = f"expected {show(expected)}, got {show(got)}"
        return self._record(CheckResult(name, passed, message, soft))

    def fail(self, name: str, message: str, *, soft: bool = False) -> bool:
        """Record a failure whose message is already written (a check that could not run)."""
        return self._record(CheckResult(name, False, message or "failed", soft))

    def _record(self, result: CheckResult) -> bool:
        self.results.pop(result.name, None)  # a re-run moves the check to where it ran last
        self.results[result.name] = result
        if not self.quiet:
            print(result.line(), flush=True)
        self._save()
        return result.passed

    @contextmanager
    def section(self, *names: str, soft: Sequence[str] = ()) -> Iterator[Grader]:
        """Run a check cell's code; if it raises, fail every named check it did not record.

        ``names`` are the checks the cell means to make. An exception (the
        student's ``NotImplementedError``, a ``TypeError`` from a wrong
        return value, a timeout) is caught and becomes the failure message
        of each of them still unrecorded, so the cell, and the notebook,
        goes on. Name every check the cell makes: one that is not named
        cannot be failed when the code before it raises.
        """
        before = {n: self.results.get(n) for n in names}
        try:
            yield self
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message, never a crash
            message = _failure(exc)
            pending = [n for n in names if self.results.get(n) is before[n]] or [
                f"check cell ({', '.join(names) or 'unnamed'})"
            ]
            for name in pending:
                self.fail(name, message, soft=name in soft)

    # -- reading ---------------------------------------------------------------

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results.values())

    @property
    def total(self) -> int:
        return len(self.results)

    def as_dict(self) -> dict[str, Any]:
        checks = [asdict(r) for r in self.results.values()]
        return {
            "headline": f"{self.exercise}: {self.passed}/{self.total} checks passed",
            "exercise": self.exercise,
            "passed": self.passed,
            "failed": self.total - self.passed,
            "total": self.total,
            "checks": checks,
        }

    def _save(self) -> None:
        if self.results_path is None:
            return
        self.results_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.results_path.with_suffix(self.results_path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(self.results_path)  # a reader never sees half a file

    def summary(self) -> dict[str, Any]:
        """Print every check and the score; write the results file; return them."""
        data = self.as_dict()
        print(format_table(data["checks"]))
        soft = [r for r in self.results.values() if r.soft]
        print()
        print(data["headline"] + (" (a soft check only looks for words: read the answer too)" if soft else ""))
        if self.passed == self.total and self.total:
            print("All checks pass. Well done.")
        self._save()
        return data


def check(name: str, condition: Any, expected: Any = None, got: Any = None, *, soft: bool = False) -> bool:
    """Check with the current ``Grader`` (the notebook's), or just print when there is none."""
    grader = Grader.current
    if grader is None:
        result = CheckResult(name, bool(condition), "", soft)
        if not result.passed:
            result.message = f"expected {show(expected)}, got {show(got)}"
        print(result.line(), flush=True)
        return result.passed
    return grader.check(name, condition, expected, got, soft=soft)


def try_it(function: Callable[[], Any]) -> Any:
    """Call the student's code to look at it (not a check): its result, or a line saying why there is none.

    The result is returned, so a notebook shows it as it shows any value;
    an exception is printed as a check would word it, and gives None.
    """
    try:
        return function()
    except Exception as exc:  # noqa: BLE001 - trying is allowed to fail
        print(_failure(exc))
        return None


def hex_bytes(data: bytes, limit: int = 16) -> str:
    """``81 05 48 65 …``: how the RFC prints a frame, cut after ``limit`` bytes."""
    data = bytes(data)
    text = data[:limit].hex(" ")
    return text + (f" … ({len(data)} bytes)" if len(data) > limit else "")


def _count_ids(ids: Any) -> int:
    if isinstance(ids, int) or (hasattr(ids, "ndim") and getattr(ids, "ndim") == 0):
        return 1
    return len(ids)


class _CountingBackend:
    """The Rust tokenizer behind a transformers tokenizer, counting what it decodes."""

    def __init__(self, backend: Any, sizes: list[int]) -> None:
        self._backend = backend
        self._sizes = sizes

    def decode(self, ids: Any, *args: Any, **kwargs: Any) -> Any:
        self._sizes.append(_count_ids(ids))
        return self._backend.decode(ids, *args, **kwargs)

    def decode_batch(self, sequences: Any, *args: Any, **kwargs: Any) -> Any:
        self._sizes.extend(_count_ids(s) for s in sequences)
        return self._backend.decode_batch(sequences, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


class CountingTokenizer:
    """A tokenizer that does everything the real one does, and notes how many ids each decode got.

    This is how a check measures cost without a stopwatch (which other
    programs on the machine would disturb): a detokenizer whose decode calls
    stay a few ids long does constant work per token; one whose calls grow
    with the answer re-decodes everything, O(n) per token. Every way to turn
    ids into text is counted: ``decode``, ``batch_decode``,
    ``convert_ids_to_tokens`` and the Rust ``backend_tokenizer``'s decodes.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.sizes: list[int] = []

    def decode(self, ids: Any, *args: Any, **kwargs: Any) -> Any:
        self.sizes.append(_count_ids(ids))
        return self._tokenizer.decode(ids, *args, **kwargs)

    def batch_decode(self, sequences: Any, *args: Any, **kwargs: Any) -> Any:
        self.sizes.extend(_count_ids(s) for s in sequences)
        return self._tokenizer.batch_decode(sequences, *args, **kwargs)

    def convert_ids_to_tokens(self, ids: Any, *args: Any, **kwargs: Any) -> Any:
        self.sizes.append(_count_ids(ids))
        return self._tokenizer.convert_ids_to_tokens(ids, *args, **kwargs)

    @property
    def backend_tokenizer(self) -> _CountingBackend:
        return _CountingBackend(self._tokenizer.backend_tokenizer, self.sizes)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


@contextmanager
def scripted_server(rate: float = 100.0, **config: Any) -> Iterator[Any]:
    """``with scripted_server(50) as server:`` the course's real server in this process, over the scripted source.

    No model to load: every answer is the scripted text at ``rate`` tokens a
    second (``streamlab.server.answers.scripted``), and everything else is the real
    server (routes, guards, formats, ``/generations``, ``/log``), on a free
    port (``server.port``), with a throwaway store, stopped on the way out. So
    an exercise checks the student's code against a real server in a second.
    ``config`` goes to ``ServerConfig`` (``forget=True``, ``max_active=1``...).
    The store's start-up line is kept out of the notebook.
    """
    import io

    from streamlab.lab.setups.runner import serve_in_process
    from streamlab.server.answers.scripted import ScriptedEngine

    quiet = io.StringIO()
    with contextlib.redirect_stderr(quiet):
        started = serve_in_process(ScriptedEngine(rate), **config)
        server = started.__enter__()
    try:
        yield server
    finally:
        with contextlib.redirect_stderr(quiet):
            started.__exit__(None, None, None)


def format_table(checks: Sequence[dict[str, Any]]) -> str:
    """Checks as aligned text: status, name, and for a failure its message."""
    if not checks:
        return "  (no checks recorded)"
    width = max(len(c["name"]) for c in checks)
    lines = []
    for c in checks:
        status = ("PASS" if c["passed"] else "FAIL") + ("*" if c.get("soft") else " ")
        message = "" if c["passed"] else c["message"]
        lines.append(f"  {status} {c['name']:<{width}}  {message}".rstrip())
    if any(c.get("soft") for c in checks):
        lines.append("  (* soft check)")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Grading notebooks, and the student copy
# --------------------------------------------------------------------------


def exercises(folder: Path = EXERCISES) -> list[Path]:
    """The exercise notebooks, in order (``ex1_…``, ``ex2_…``)."""
    return sorted(folder.glob("ex[0-9]*_*.ipynb"), key=lambda p: int(re.match(r"ex(\d+)", p.name).group(1)))


def solution_for(notebook: Path, solutions: Path = SOLUTIONS) -> Path:
    """``ex1_detokenizer.ipynb`` → ``solutions/ex1.py``."""
    match = re.match(r"(ex\d+)_", Path(notebook).name)
    if not match:
        raise ValueError(f"{notebook} is not named like an exercise (ex1_topic.ipynb)")
    return Path(solutions) / f"{match.group(1)}.py"


def grade_notebook(
    notebook: Path,
    *,
    solution: Path | None = None,
    out_dir: Path | None = None,
    parameters: dict[str, Any] | None = None,
    timeout: int = 900,
    progress: bool = False,
) -> dict[str, Any]:
    """Execute one exercise notebook in a fresh kernel; return its recorded results.

    The notebook runs in its own folder (as a student would run it).
    ``solution`` injects a model answer through the ``solution`` parameter.
    A notebook that crashes anyway (a student who deleted a ``with`` line)
    still returns what it recorded before, plus a failed ``notebook ran to
    the end`` entry with the error.
    """
    notebook = Path(notebook).resolve()
    out_dir = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="streamlab-grading-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f"{notebook.parent.name}_{notebook.stem}"
    executed = out_dir / f"{tag}.ipynb"
    results = out_dir / f"{tag}.json"
    results.unlink(missing_ok=True)
    params: dict[str, Any] = dict(parameters or {})
    if solution is not None:
        params["solution"] = str(Path(solution).resolve())
    crashed = None
    try:
        papermill_run(notebook, executed, results, params, timeout=timeout, progress=progress)
    except Exception as exc:  # noqa: BLE001 - a broken notebook is a grade, not a crash of the grader
        crashed = f"{type(exc).__name__}: {show(str(exc).strip().splitlines()[-1] if str(exc).strip() else '', 200)}"
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {"exercise": notebook.stem, "checks": []}
    checks = list(data.get("checks", []))
    if crashed:
        checks.append({"name": "notebook ran to the end", "passed": False, "message": crashed, "soft": False})
    passed = sum(c["passed"] for c in checks)
    data.update(checks=checks, passed=passed, failed=len(checks) - passed, total=len(checks),
                notebook=str(notebook), executed=str(executed), crashed=crashed)
    return data


def build_student_copy(dest: Path = STUDENT_COPY, src: Path = EXERCISES) -> list[Path]:
    """Copy the exercises for students into ``dest``: no solutions, no grading hook, the chapters beside them.

    ``streamlab.book.student_copy`` says what goes in and what stays out.
    """
    from streamlab.book.student_copy import write_student_copy

    return write_student_copy(Path(dest), Path(src), exercises(src))


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def _print_report(name: str, data: dict[str, Any]) -> None:
    print(f"\n== {name}: {data['passed']}/{data['total']} checks passed")
    print(format_table(data["checks"]))
    print(f"  executed notebook: {data['executed']}")


def copy_made(dest: Path, written: Sequence[Path]) -> str:
    """The one line ``make exercises`` prints: where the copy is, what it holds, and how to open it."""
    notebooks = sum(1 for p in written if p.parent == Path(dest) and p.suffix == ".ipynb")
    return (f"student copy in {dest}: {notebooks} exercises with their chapters, no solutions;"
            f" open it with: make -C {dest} lab")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamlab.book.grading",
        description="Execute exercise notebooks with papermill and print each one's checks.",
    )
    parser.add_argument("notebooks", nargs="*", type=Path, help="exercise notebooks (students' copies)")
    parser.add_argument("--solutions", type=Path, default=None, metavar="DIR",
                        help="inject the model answers from DIR (e.g. notebooks/exercises/solutions)")
    parser.add_argument("--out", type=Path, default=BUILD / "grading", metavar="DIR",
                        help="where executed notebooks and results go (default: build/grading)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a cell may run")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write every result here")
    parser.add_argument("--student-copy", type=Path, default=None, metavar="DIR",
                        help="instead of grading: copy the exercises without solutions into DIR")
    args = parser.parse_args(argv)

    if args.student_copy is not None:
        print(copy_made(args.student_copy, build_student_copy(args.student_copy)))
        return 0
    if not args.notebooks:
        parser.error("name at least one notebook (or --student-copy DIR)")

    reports = []
    for notebook in args.notebooks:
        started = time.perf_counter()
        print(f"==> {notebook}", flush=True)
        solution = solution_for(notebook, args.solutions) if args.solutions else None
        data = grade_notebook(notebook, solution=solution, out_dir=args.out, timeout=args.timeout)
        data["seconds"] = round(time.perf_counter() - started, 1)
        _print_report(str(notebook), data)
        reports.append(data)

    print("\nsummary")
    width = max(len(str(n)) for n in args.notebooks)
    for notebook, data in zip(args.notebooks, reports):
        note = "  (crashed)" if data.get("crashed") else ""
        print(f"  {str(notebook):<{width}}  {data['passed']:>3}/{data['total']:<3} passed  {data['seconds']:>6.1f} s{note}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(reports, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    all_passed = all(d["total"] and d["passed"] == d["total"] for d in reports)
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
