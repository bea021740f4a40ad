"""What each chapter asks and what it builds on, and which exercise goes with it: the book's table of contents.

Each thing is said once, where it belongs:

- a chapter's question is the chapter's own: the paragraph of its first cell
  that starts ``**What this chapter asks:**`` or ``**The question:**``, up
  to its last question (a sentence after it is left out; one before it
  stays, as the question may lean on it); a chapter without that paragraph,
  its opening sentence;
- what to read first is ``PREREQUISITES`` here, by file name, so a
  renumbering is caught by the tests instead of pointing at the wrong chapter;
- the exercises come from the table of ``notebooks/exercises/README.md``
  (its "Notebook", "Time" and "Chapter" columns), the teacher's page that
  already says which exercise goes with which chapter.

The book (``streamlab.book.pages``) and the student copy
(``streamlab.book.student_copy``) read them from here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from streamlab.lab.results.records import NOTEBOOKS

__all__ = ["PREREQUISITES", "ChapterInfo", "ExerciseRow", "chapter_info", "exercise_rows", "exercises_by_chapter"]

EXERCISE_README = NOTEBOOKS / "exercises" / "README.md"


# What to read before each chapter (by file name: a renumbering is caught by the tests, not read wrong).
PREREQUISITES: dict[str, tuple[str, ...]] = {
    "01_split_characters": (),
    "02_three_ways": ("01_split_characters",),
    "03_bytes_on_the_wire": ("02_three_ways",),
    "04_the_reader": ("02_three_ways",),
    "05_when_the_user_leaves": ("02_three_ways",),
    "06_the_proxy": ("02_three_ways", "04_the_reader"),
    "07_persisting_partial_answers": ("05_when_the_user_leaves",),
    "08_reconnect_and_resume": ("05_when_the_user_leaves", "07_persisting_partial_answers"),
    "09_a_stranger_at_the_door": ("02_three_ways", "05_when_the_user_leaves"),
    "10_the_formats_people_actually_use": ("03_bytes_on_the_wire", "05_when_the_user_leaves", "06_the_proxy"),
    "11_serving_many_readers": ("04_the_reader", "05_when_the_user_leaves"),
    "12_what_else_sits_between": ("06_the_proxy",),
    "13_more_than_one_server": ("06_the_proxy", "08_reconnect_and_resume"),
    "14_many_streams_in_one_browser": ("06_the_proxy", "08_reconnect_and_resume"),
    "15_the_reader_in_the_browser": ("01_split_characters", "05_when_the_user_leaves", "08_reconnect_and_resume"),
}


@dataclass(frozen=True)
class ExerciseRow:
    """One row of the exercises' table: the notebook, its time, what it asks, its chapters (by file name)."""

    stem: str
    time: str
    what: str
    chapters: tuple[str, ...]
    in_table: bool = True  # False: the table does not list it yet, and this row was read from its brief

    @property
    def number(self) -> int:
        match = re.match(r"ex(\d+)", self.stem)
        return int(match.group(1)) if match else 0


@dataclass
class ChapterInfo:
    """A chapter as the book lists it."""

    stem: str
    number: int
    title: str
    question: str
    prerequisites: tuple[str, ...]
    stated: bool  # whether the chapter states its question (otherwise the question is its first sentence)
    exercises: list[ExerciseRow] = field(default_factory=list)


_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def exercise_rows(readme: Path = EXERCISE_README) -> list[ExerciseRow]:
    """The exercises' table of ``readme``, row by row (a missing README has none).

    The table is the one whose header names a "Notebook" and a "Chapter"
    column; a row's exercise is the notebook its Notebook cell links to,
    its chapters every ``NN_name.ipynb`` its Chapter cell links to. An
    exercise notebook beside the README that the table does not list yet
    gets its row from its brief (the chapters its first cell links to).
    """
    try:
        lines = Path(readme).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    rows: list[ExerciseRow] = []
    columns: list[str] | None = None
    for line in lines:
        if not line.lstrip().startswith("|"):
            columns = None
            continue
        cells = _cells(line)
        if columns is None:
            columns = [c.lower() for c in cells]
            if "notebook" not in columns or "chapter" not in columns:
                columns = []  # another table: skip it
            continue
        if not columns or set("".join(cells)) <= set("-: "):
            continue
        cell = dict(zip(columns, cells))
        notebooks = [Path(target).stem for _, target in _LINK.findall(cell.get("notebook", ""))]
        chapters = tuple(Path(t).stem for _, t in _LINK.findall(cell.get("chapter", ""))
                         if re.fullmatch(r"\d\d_\w+", Path(t).stem))
        if notebooks:
            what = _LINK.sub(r"\1", next((v for k, v in cell.items() if k.startswith("what")), ""))
            rows.append(ExerciseRow(notebooks[0], cell.get("time", ""), what, chapters))
    listed = {row.stem for row in rows}
    for notebook in sorted(Path(readme).parent.glob("ex[0-9]*_*.ipynb")):
        if notebook.stem not in listed:  # not in the table yet: what its brief's first lines say
            rows.append(_row_from_brief(notebook))
    return sorted(rows, key=lambda row: row.number)


def _row_from_brief(notebook: Path) -> ExerciseRow:
    """An exercise's row from its brief: the chapters its first cell links to, its "About N minutes"."""
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    first = next(("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "markdown"), "")
    chapters = tuple(dict.fromkeys(Path(t).stem for _, t in _LINK.findall(first) if re.fullmatch(
        r"\d\d_\w+", Path(t).stem)))
    minutes = re.search(r"About (\d+) minutes", first)
    title = re.search(r"^#\s+Exercise \d+\.\s*(.+)$", first, re.M)
    return ExerciseRow(notebook.stem, f"{minutes.group(1)} min" if minutes else "",
                       title.group(1).strip() if title else "", chapters, in_table=False)


def exercises_by_chapter(readme: Path = EXERCISE_README) -> dict[str, list[ExerciseRow]]:
    """Each chapter's exercises (by chapter file name), in the table's order."""
    found: dict[str, list[ExerciseRow]] = {}
    for row in exercise_rows(readme):
        for stem in row.chapters:
            found.setdefault(stem, []).append(row)
    return found


# The paragraph in which a chapter states its question ("**What this chapter asks:** ...", "**The question:** ...").
_ASKS = re.compile(r"^\*\*(?:What this chapter asks|The question):?\*\*:?\s*(.+?)(?:\n\s*\n|\Z)", re.M | re.S)


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.?!])\s+", re.sub(r"\*+", "", " ".join(text.split())).strip())


def _question(first_cell: str) -> tuple[str, bool]:
    """The chapter's question from its first cell, and whether the chapter states it as one."""
    asks = _ASKS.search(first_cell)
    if asks:
        # From its first sentence to its last question: a question may lean on the sentence before it
        # ("Eight streams from one page. Do they all stream at once?"), and cut from it, it says nothing.
        sentences = _sentences(asks.group(1))
        last = max((i for i, s in enumerate(sentences) if s.endswith("?")), default=len(sentences) - 1)
        text = " ".join(sentences[:last + 1])
        return text[:1].upper() + text[1:], True
    paragraphs = [p for p in re.split(r"\n\s*\n", first_cell) if p.strip() and not p.lstrip().startswith("#")]
    return (_sentences(paragraphs[0])[0] if paragraphs else ""), False


def chapter_info(notebook: Path, exercises: dict[str, list[ExerciseRow]] | None = None) -> ChapterInfo:
    """The title (its first heading), question, prerequisites and exercises of the chapter ``notebook``."""
    notebook = Path(notebook)
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    first = next(("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "markdown"), "")
    heading = re.search(r"^#\s+(.+)$", first, re.M)
    number = int(notebook.name[:2])
    title = re.sub(r"^\d+\.\s*", "", heading.group(1).strip()) if heading else notebook.stem[3:].replace("_", " ")
    question, stated = _question(first)
    rows = (exercises if exercises is not None else exercises_by_chapter()).get(notebook.stem, [])
    return ChapterInfo(notebook.stem, number, title, question, PREREQUISITES.get(notebook.stem, ()), stated, list(rows))
