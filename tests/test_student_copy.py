"""The student copy is one: it opens by itself, holds no solution, and no exercise leads to its own answer.

``make exercises`` hands out ``build/exercises/``. Three things are checked
on a copy built into a temporary folder:

- nothing of the teacher's is in it: no ``solutions/`` folder, no file of a
  model answer's name, no code of a model answer in any file;
- it opens without the course's folder: its own ``Makefile`` runs
  ``python -m streamlab lab .`` on it (``tests/test_lab.py`` starts it);
- no exercise hands the student its answer. For each exercise, what the
  student is asked to write is read from the notebook's ``# YOUR CODE HERE``
  cell (its classes with their methods, its functions), and what the
  notebook puts within reach from its imports and from the modules its prose
  names. Nothing within reach may be named like the answer (``encode_frame``
  for ``encode_frame``, ``Detokenizer`` for ``IncrementalDetokenizer``,
  ``watch_for_eof`` for ``watch``), and no class within reach may have the
  answer's methods with the same arguments (``EventStreamParser.feed`` for
  ``SSEParser.feed``). The last tests put back the imports the exercises once
  had and see each one caught.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

from streamlab.book import grading
from streamlab.book.grading import SOLUTIONS, build_student_copy
from streamlab.book.student_copy import STUDENT_MAKEFILE
from test_exercises import assert_no_solution_code, bodies

STUDENT_CELL = "# YOUR CODE HERE"
# A dotted name in an exercise's prose: `streamlab.server.transport.guards.Guards` points the student at a module.
DOTTED = re.compile(r"\bstreamlab(?:\.\w+)+")


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("handed-out") / "exercises"
    build_student_copy(dest)
    return dest


def exercise_notebooks(folder: Path) -> list[Path]:
    return grading.exercises(folder)


# --------------------------------------------------------------------------
# What the exercise asks for, and what its notebook puts within reach
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    """One definition the student writes: a function, or a class with the methods it must have."""

    name: str
    methods: dict[str, int] | None  # a class's public methods and how many arguments each takes; None: a function


def _required(args: ast.arguments) -> int:
    positional = [a for a in [*args.posonlyargs, *args.args] if a.arg != "self"]
    return len(positional) - len(args.defaults)


def asked(notebook: Path) -> list[Asked]:
    """The definitions of the notebook's ``# YOUR CODE HERE`` cell."""
    nb = nbformat.read(notebook, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith(STUDENT_CELL)]
    assert len(cells) == 1, f"{notebook.name}: one cell for the student"
    found = []
    for node in ast.parse(cells[0]).body:
        if isinstance(node, ast.ClassDef):
            methods = {m.name: _required(m.args) for m in node.body
                       if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("_")}
            found.append(Asked(node.name, methods))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(Asked(node.name, None))
    assert found, f"{notebook.name}: the student's cell defines nothing"
    return found


def _module(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _offers(module: types.ModuleType) -> dict[str, Any]:
    """What a module holds out: its ``__all__`` (else its public names) and the classes it defines, no modules."""
    names = set(getattr(module, "__all__", None) or (n for n in vars(module) if not n.startswith("_")))
    names |= {n for n, obj in vars(module).items()
              if inspect.isclass(obj) and obj.__module__ == module.__name__ and not n.startswith("_")}
    found = {}
    for name in names:
        obj = getattr(module, name, None)
        if obj is not None and not isinstance(obj, types.ModuleType):
            found[f"{module.__name__}.{name}"] = obj
    return found


def within_reach(notebook: Path) -> dict[str, Any]:
    """Everything the notebook's streamlab imports (and the modules its prose names) put within the student's reach.

    ``from X import a`` reaches ``a`` and all that ``X`` holds out (the
    student reads the import line and opens ``X``); ``import X`` and ``from
    X import submodule`` reach what the module holds out.
    """
    nb = nbformat.read(notebook, as_version=4)
    modules: set[str] = set()
    objects: dict[str, Any] = {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for dotted in DOTTED.findall(cell.source):
                parts = dotted.split(".")
                for cut in range(len(parts), 0, -1):  # the longest importable prefix is the module
                    if _module(".".join(parts[:cut])) is not None:
                        modules.add(".".join(parts[:cut]))
                        break
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Import):
                modules |= {a.name for a in node.names if a.name.split(".")[0] == "streamlab"}
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "streamlab":
                modules.add(node.module)
                for alias in node.names:
                    if _module(f"{node.module}.{alias.name}") is not None:
                        modules.add(f"{node.module}.{alias.name}")
                    else:
                        objects[f"{node.module}.{alias.name}"] = getattr(importlib.import_module(node.module), alias.name)
    for name in sorted(modules):
        objects.update(_offers(importlib.import_module(name)))
    return objects


def words(name: str) -> frozenset[str]:
    """``IncrementalDetokenizer`` -> {incremental, detokenizer}; ``watch_for_eof`` -> {watch, for, eof}."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name))
    return frozenset(w.lower() for w in spaced.split("_") if w)


def _arguments(function: Any) -> int | None:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    return sum(p.name != "self" and p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)


def answers_within_reach(notebook: Path) -> list[str]:
    """What within the notebook's reach looks like what the student is asked to write: one line each."""
    found = []
    for where, obj in within_reach(notebook).items():
        candidates = [(where, obj)]
        if inspect.isclass(obj):
            candidates += [(f"{where}.{n}", getattr(obj, n)) for n in dir(obj)
                           if not n.startswith("_") and callable(getattr(obj, n, None))]
        for answer in asked(notebook):
            for name, candidate in candidates:
                last = name.rpartition(".")[2]
                if words(answer.name) <= words(last) or (
                        answer.methods is not None and inspect.isclass(candidate) and words(last) <= words(answer.name)):
                    found.append(f"{name} is named like {answer.name}")
            if answer.methods and inspect.isclass(obj):
                has = {m: _arguments(getattr(obj, m)) for m in answer.methods if callable(getattr(obj, m, None))}
                if has == answer.methods:
                    found.append(f"{where} has {answer.name}'s methods ({', '.join(answer.methods)}), same arguments")
    return sorted(set(found))


# --------------------------------------------------------------------------
# The copy
# --------------------------------------------------------------------------


def test_the_copy_holds_no_solution_and_no_code_of_one(copy):
    """No solutions folder, no file named like a model answer; no exercise holding its answer's lines, no file
    of the copy (chapters, README, Makefile included) holding a function of any model answer."""
    files = [p for p in copy.rglob("*") if p.is_file()]
    assert not [p for p in copy.rglob("*") if p.is_dir() and "solution" in p.name.lower()], "a solutions folder"
    assert not {p.name for p in SOLUTIONS.iterdir()} & {p.name for p in files}, "a file named like a model answer"
    for notebook in exercise_notebooks(copy):
        assert_no_solution_code(notebook)
    functions = {body: s.name for s in SOLUTIONS.glob("*.py") for body in bodies(s)}
    for path in files:
        if path.suffix == ".ipynb":
            text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        else:
            text = path.read_text(encoding="utf-8")
        squeezed = " ".join(text.split())
        pasted = sorted({name for body, name in functions.items() if body in squeezed})
        assert not pasted, f"{path.relative_to(copy)} holds a function of {pasted}"


def test_every_exercise_asks_for_something_the_finder_can_read(copy):
    notebooks = exercise_notebooks(copy)
    assert len(notebooks) == len(grading.exercises())
    for notebook in notebooks:
        for answer in asked(notebook):
            assert answer.methods is None or answer.methods, f"{notebook.name}: class {answer.name} without methods"


@pytest.mark.parametrize("name", [nb.name for nb in grading.exercises()])
def test_no_exercise_puts_its_answer_within_reach(copy, name):
    found = answers_within_reach(copy / name)
    assert not found, f"{name} leads the student to an answer:\n" + "\n".join(found)


def _with(notebook: Path, tmp_path: Path, *, code: str = "", prose: str = "") -> Path:
    """The notebook with a line of code added to its first code cell after the parameters, or prose to its brief."""
    nb = nbformat.read(notebook, as_version=4)
    if prose:
        nb.cells[0].source += "\n\n" + prose
    if code:
        setup = next(c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", []))
        setup.source = code + "\n" + setup.source
    changed = tmp_path / notebook.name
    nbformat.write(nb, changed)
    return changed


# The imports (and the pointer) the exercises had before issue 28, each with what the finder must name.
ONCE_WITHIN_REACH = [
    ("ex1_detokenizer.ipynb", "from streamlab.model.detokenizer import REPLACEMENT", "",
     "streamlab.model.detokenizer.Detokenizer is named like IncrementalDetokenizer"),
    ("ex2_sse_parser.ipynb", "from streamlab.protocol.sse import EventStreamParser", "",
     "streamlab.protocol.sse.EventStreamParser has SSEParser's methods (feed), same arguments"),
    ("ex3_websocket_frames.ipynb", "from streamlab.protocol import websocket_frames as ws", "",
     "streamlab.protocol.websocket_frames.encode_frame is named like encode_frame"),
    ("ex4_watch_for_eof.ipynb", "from streamlab.server.transport.connection import ClientConnection", "",
     "streamlab.server.transport.connection.ClientConnection.watch_for_eof is named like watch"),
    ("ex9_keep_strangers_out.ipynb", "", "The server's own guards (`streamlab.server.transport.guards.Guards`) are replaced.",
     "streamlab.server.transport.guards.Guards.check_host is named like check_host"),
    ("ex12_flushing_gzip.ipynb", "from streamlab.hops import compress", "",
     "streamlab.hops.compress.Gzip has FlushingGzip's methods (feed, finish), same arguments"),
]


@pytest.mark.parametrize(("name", "code", "prose", "named"), ONCE_WITHIN_REACH, ids=[c[0] for c in ONCE_WITHIN_REACH])
def test_the_finder_catches_the_answers_the_exercises_once_led_to(copy, tmp_path, name, code, prose, named):
    found = answers_within_reach(_with(copy / name, tmp_path, code=code, prose=prose))
    assert named in found, found


# --------------------------------------------------------------------------
# It opens by itself
# --------------------------------------------------------------------------


def make_lab(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(folder), "lab", *args],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_the_copy_has_a_makefile_that_opens_it_and_a_readme_that_says_so(copy):
    assert (copy / "Makefile").read_text(encoding="utf-8") == STUDENT_MAKEFILE
    dry = subprocess.run(["make", "-n", "-C", str(copy), "lab", f"PYTHON={sys.executable}"],
                         capture_output=True, text=True, check=True)
    assert f"{sys.executable} -m streamlab lab ." in dry.stdout
    readme = (copy / "README.md").read_text(encoding="utf-8")
    assert "    make lab\n" in readme and "python -m streamlab lab" in readme
    assert "course's folder" not in readme and "notebooks/" not in readme, "the README leads out of the copy"


def test_in_the_courses_build_folder_make_lab_finds_the_courses_venv(copy, tmp_path):
    course = tmp_path / "course"
    (course / ".venv" / "bin").mkdir(parents=True)
    (course / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (course / "build").mkdir()
    placed = course / "build" / "exercises"
    build_student_copy(placed)
    dry = subprocess.run(["make", "-n", "-C", str(placed), "lab"], capture_output=True, text=True, check=True)
    assert "../../.venv/bin/python -m streamlab lab ." in dry.stdout


def test_make_lab_with_a_python_without_streamlab_is_one_line(copy):
    done = make_lab(copy, "PYTHON=false")  # `false -c 'import streamlab'` fails, as a Python without streamlab does
    # make's own last word ("make: ***", or "make[1]: ***" under another make, as in CI) is not ours.
    lines = [line for line in done.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "false has no streamlab" in lines[0] and "PYTHON=" in lines[0]


def test_make_lab_reaches_jupyterlab(copy):
    """The whole way from the copy's Makefile: make, python -m streamlab lab, JupyterLab (asked for its version)."""
    pytest.importorskip("jupyterlab")
    done = make_lab(copy, f"PYTHON={sys.executable}", "LAB_ARGS=--version")
    assert done.returncode == 0, done.stderr
    assert re.search(r"^\d+\.\d+", done.stdout.splitlines()[-1]), done.stdout
    told = [line for line in done.stderr.splitlines() if line.startswith("streamlab lab:")]
    assert len(told) == (1 if hasattr(os, "geteuid") and os.geteuid() == 0 else 0), done.stderr


def test_make_exercises_says_where_the_copy_is_in_one_line(tmp_path, capsys):
    dest = tmp_path / "build" / "exercises"
    assert grading.main(["--student-copy", str(dest)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    assert str(dest) in lines[0] and f"make -C {dest} lab" in lines[0] and "no solutions" in lines[0]
    assert f"{len(grading.exercises())} exercises" in lines[0]
