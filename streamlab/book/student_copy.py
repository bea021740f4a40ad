"""The exercises as a student gets them: ``make exercises`` writes ``build/exercises/``.

What the teacher keeps stays out: the model answers (``solutions/``), the
grading hook that injects them, the parameter that names them, and the
teacher's README with its grading commands. What the student needs comes in:

- each exercise notebook, outputs cleared, its links to its chapter
  pointing at the copy's own ``chapters/`` folder;
- ``chapters/``: every chapter notebook (outputs cleared), so each link in
  an exercise opens the chapter it names, from the copy, wherever it is;
- a short ``README.md`` of its own: how to open the folder, what to do, how
  to check your work, the exercises with their times and chapters (the rows
  of the teacher's table, ``streamlab.book.contents.exercise_rows``);
- a ``Makefile`` whose ``make lab`` opens the copy in JupyterLab
  (``python -m streamlab lab .``), so the copy opens by itself, wherever it
  was put: JupyterLab opened on the course's ``notebooks/`` would show the
  teacher's ``solutions/`` beside the exercises.

``streamlab.book.grading.build_student_copy`` (``--student-copy``) calls it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from streamlab.book.contents import chapter_info, exercise_rows
from streamlab.book.notebooks import chapters

__all__ = ["CHAPTERS_FOLDER", "STUDENT_MAKEFILE", "student_readme", "write_student_copy"]

CHAPTERS_FOLDER = "chapters"
# The copy's own Makefile. Its Python is the one with streamlab: the course's .venv when the copy sits in the course's
# build/ (build/exercises: ../../.venv), a .venv made beside the notebooks, else the python3 of an activated environment.
STUDENT_MAKEFILE = """\
# The exercises in JupyterLab: `make lab` in this folder opens it (python -m streamlab lab .).
# It needs the course's Python, the one with streamlab installed: the course's .venv when this folder is the
# course's build/exercises, a .venv here, or the python3 of an activated environment. Or name it:
#   make lab PYTHON=/path/to/the/course/.venv/bin/python
# Flags for JupyterLab: make lab LAB_ARGS='--port=8890 --no-browser'.
PYTHON ?= $(firstword $(wildcard .venv/bin/python ../.venv/bin/python ../../.venv/bin/python) python3)

.PHONY: lab
lab:
\t@$(PYTHON) -c 'import streamlab' 2>/dev/null || { echo "make lab: $(PYTHON) has no streamlab: run it with the course's Python (make lab PYTHON=/path/to/the/course/.venv/bin/python)" >&2; exit 2; }
\t$(PYTHON) -m streamlab lab . $(LAB_ARGS)
"""
_MD_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# What only a teacher's run uses: the parameter naming a model answer, the cell that runs it, the sentence about it.
_SOLUTION_PARAMETER = re.compile(r"^solution\s*=.*(\n|$)", re.M)
_HOOK_SENTENCE = re.compile(r"\s*The cell after it is the grading hook[^.]*\.")


def _is_hook(cell: Any) -> bool:
    return cell.cell_type == "code" and ("exec(Path(solution)" in cell.source
                                         or cell.source.lstrip().startswith("# Grading hook"))


def _clean(nb: Any) -> Any:
    """Outputs, execution counts and run metadata off, as a notebook is handed out."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in ("execution", "papermill", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
    nb.metadata.pop("papermill", None)
    return nb


def _without_solutions(nb: Any) -> Any:
    """The exercise without its grading hook, its ``solution`` parameter, or the sentence telling of them."""
    nb.cells = [c for c in nb.cells if not _is_hook(c)]
    for cell in nb.cells:
        if "parameters" in cell.metadata.get("tags", []):
            cell.source = _SOLUTION_PARAMETER.sub("", cell.source)
        elif cell.cell_type == "markdown":
            cell.source = _HOOK_SENTENCE.sub("", cell.source)
    return nb


def _relink(text: str, origin: Path, target: Path, moved: dict[Path, Path]) -> str:
    """Markdown links of a file moved from ``origin`` to ``target``, made to lead where they did."""
    def one(match: re.Match[str]) -> str:
        link = match.group(2)
        if link.startswith("#") or _SCHEME.match(link):
            return match.group(0)
        path, hash_, fragment = link.partition("#")
        where = (origin.parent / path).resolve()
        where = moved.get(where, where)
        if not where.exists():
            return match.group(0)
        new = Path(os.path.relpath(where, target.parent.resolve())).as_posix()
        return f"{match.group(1)}{new}{hash_}{fragment}{match.group(3)}"

    return _MD_LINK.sub(one, text)


def student_readme(src: Path, notebooks: list[Path]) -> str:
    """The copy's README: what to do, how to check, and the exercises (from the teacher's table)."""
    rows = {row.stem: row for row in exercise_rows(src / "README.md")}
    titles = {nb.stem: f"{(info := chapter_info(nb, {})).number}. {info.title}" for nb in chapters(src.parent)}
    lines = [
        "# Exercises",
        "",
        "Each notebook here asks you to write one piece of the path from a language model to its reader, and",
        "then checks it: against real data, and for some against the real model and server. Every check",
        "prints one line, `PASS name` or `FAIL name: expected …, got …`, and the last cell prints your score.",
        "",
        "## Open this folder",
        "",
        "In a terminal, in this folder:",
        "",
        "    make lab",
        "",
        "opens it in JupyterLab (the same as `python -m streamlab lab`). The notebooks import `streamlab`, so",
        "they run with the course's Python: `make lab` finds the course's `.venv` when this folder is the",
        "course's `build/exercises`; anywhere else, activate the course's environment first, or name its",
        "Python: `make lab PYTHON=/path/to/the/course/.venv/bin/python`.",
        "",
        "## What to do",
        "",
        "1. Read the exercise's chapter first: each exercise links to it, in `chapters/`.",
        "2. Open the exercise in JupyterLab (`make lab`, above).",
        "3. Read the brief, then write your code in the cell that starts `# YOUR CODE HERE`. Leave the other",
        "   cells as they are: they set things up and check your work.",
        "4. Run the whole notebook (Run > Run All Cells). Until you have written anything, every check fails",
        "   with `not implemented yet`; that is the starting point, not a mistake.",
        "",
        "## How to check your work",
        "",
        "- In the notebook: run all cells, and read the `FAIL` lines: each says what the check expected and",
        "  what your code gave. Fix, run again, until the score says every check passed.",
        "- From a terminal, the way your work will be graded (a fresh kernel, top to bottom):",
        "",
        f"      python -m streamlab.book.grading {notebooks[0].name if notebooks else 'ex1_….ipynb'}",
        "",
        "  It prints each check, one line with your score and one with the path of the executed copy of",
        "  the notebook (its outputs are there to read); its exit status is 0 only when every check passed.",
        "  A check marked `(soft)` is only an approximation: your teacher reads that answer.",
        "",
        "## The exercises",
        "",
        "| Exercise | Time | What you write | Chapter |",
        "|----------|------|----------------|---------|",
    ]
    for nb in notebooks:
        row = rows.get(nb.stem)
        time_, what = (row.time, row.what) if row else ("", "")
        chapter_links = ", ".join(f"[{titles.get(stem, stem)}]({CHAPTERS_FOLDER}/{stem}.ipynb)"
                                  for stem in (row.chapters if row else ()))
        lines.append(f"| [{nb.stem}]({nb.name}) | {time_} | {what} | {chapter_links} |")
    lines += [
        "",
        "The times are for someone who has read the chapter. Each exercise stands alone. Some start the",
        "model and a server of the course: those take a minute or so before their first check.",
        "",
    ]
    return "\n".join(lines)


def write_student_copy(dest: Path, src: Path, notebooks: list[Path]) -> list[Path]:
    """Write the student copy of the exercise ``notebooks`` (from ``src``) to ``dest``; return the files written.

    ``dest`` is emptied first, so a file a teacher copied there by hand
    earlier (a model answer) cannot linger. The chapters are the ones beside
    ``src`` (``notebooks/``).
    """
    import nbformat

    dest, src = Path(dest), Path(src)
    if dest.exists():
        shutil.rmtree(dest)
    (dest / CHAPTERS_FOLDER).mkdir(parents=True)
    chapter_files = chapters(src.parent)
    moved = {nb.resolve(): (dest / CHAPTERS_FOLDER / nb.name).resolve() for nb in chapter_files}
    moved.update({nb.resolve(): (dest / nb.name).resolve() for nb in notebooks})
    written = []
    for original, exercise in [*((nb, False) for nb in chapter_files), *((nb, True) for nb in notebooks)]:
        nb = _clean(nbformat.read(original, as_version=4))
        if exercise:
            nb = _without_solutions(nb)
        target = moved[original.resolve()]
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = _relink(cell.source, original, target, moved)
        shown = dest / target.relative_to(dest.resolve())
        nbformat.write(nb, shown)
        written.append(shown)
    readme = dest / "README.md"
    readme.write_text(student_readme(src, notebooks), encoding="utf-8")
    makefile = dest / "Makefile"
    makefile.write_text(STUDENT_MAKEFILE, encoding="utf-8")
    written += [readme, makefile]
    return written
