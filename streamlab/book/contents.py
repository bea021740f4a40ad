"""What each chapter asks and what it builds on, and which exercise goes with it: the book's table of contents.

One place for what the chapters themselves do not say in a form a program
can read:

- ``ABOUT``: each chapter's question, in one sentence, and the chapters a
  reader should have read first (by file name, so a renumbering is caught by
  the tests instead of pointing at the wrong chapter). A chapter not listed
  here still gets a page: its question is then its opening paragraph's first
  sentence, and no prerequisites are named.
- the exercises: read from the table of ``notebooks/exercises/README.md``
  (its "Notebook", "Time" and "Chapter" columns), the teacher's page that
  already says which exercise goes with which chapter, so it is said once.

The book (``streamlab.book.pages``), the student copy
(``streamlab.book.student_copy``) and the teacher's page read it from here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from streamlab.book.chapter import NOTEBOOKS

__all__ = ["ABOUT", "About", "ChapterInfo", "ExerciseRow", "chapter_info", "exercise_rows", "exercises_by_chapter"]

EXERCISE_README = NOTEBOOKS / "exercises" / "README.md"


@dataclass(frozen=True)
class About:
    question: str
    prerequisites: tuple[str, ...] = ()


ABOUT: dict[str, About] = {
    "01_split_characters": About(
        "What does a reader see when a server decodes each token on its own, and how does a detokenizer send only"
        " whole characters, at a constant cost per token?"),
    "02_three_ways": About(
        "When does the reader see the first words, and how many bytes travel, when one answer is sent whole, as"
        " Server-Sent Events, or over a WebSocket?",
        ("01_split_characters",)),
    "03_bytes_on_the_wire": About(
        "How many bytes does each format wrap around a piece of text: streamlab's SSE event, OpenAI's and"
        " Anthropic's events, a WebSocket frame?",
        ("02_three_ways",)),
    "04_the_reader": About(
        "How much faster than a person reads does the model write, and which silence between pieces would a"
        " reader notice?",
        ("02_three_ways",)),
    "05_when_the_user_leaves": About(
        "Does the server stop the model when its reader leaves, over SSE, a WebSocket and a plain request, and"
        " how many tokens are made for nobody when it does not watch?",
        ("02_three_ways",)),
    "06_the_proxy": About(
        "What does a buffering proxy (a stand-in, and nginx at its defaults) do to the time to the first event,"
        " and which header or setting undoes it?",
        ("02_three_ways", "04_the_reader")),
    "07_persisting_partial_answers": About(
        "When a stream ends early (token limit, reader gone, stop, model error, crash), what does the server"
        " keep, and how does it mark how the answer ended?",
        ("05_when_the_user_leaves",)),
    "08_reconnect_and_resume": About(
        "When a connection drops, can the reader pick up where it left off with Last-Event-ID, while the model"
        " never starts over?",
        ("05_when_the_user_leaves", "07_persisting_partial_answers")),
    "09_a_stranger_at_the_door": About(
        "What can any program, or any web page the user opens, make a model server on 127.0.0.1 do, and which"
        " refusals and limits stop it?",
        ("02_three_ways", "05_when_the_user_leaves")),
    "10_the_formats_people_actually_use": About(
        "What changes for a program that reads OpenAI's or Anthropic's streaming format through their SDKs, and"
        " for a reader who leaves when streamlab relays another server?",
        ("03_bytes_on_the_wire", "05_when_the_user_leaves", "06_the_proxy")),
    "11_serving_many_readers": About(
        "What does streaming add to the model, how many streams can one process serve, and what happens to each"
        " reader's silences when many ask at once or one cannot keep up?",
        ("04_the_reader", "05_when_the_user_leaves")),
    "12_what_else_sits_between": About(
        "Which other hops (a compressor, a cache, a function platform) turn a stream back into one late answer,"
        " and which header or setting makes each one behave?",
        ("06_the_proxy",)),
    "14_many_streams_in_one_browser": About(
        "How many event streams does one page get from one origin, and why do the 7th and 8th wait over HTTP/1.1"
        " but not over HTTP/2?",
        ("06_the_proxy", "08_reconnect_and_resume")),
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
    stated: bool  # whether ABOUT describes it (otherwise the question is its first sentence)
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


def _first_sentence(text: str) -> str:
    sentence = re.split(r"(?<=[.?!])\s", " ".join(text.split()), maxsplit=1)[0]
    return re.sub(r"[*`]", "", sentence)


def chapter_info(notebook: Path, exercises: dict[str, list[ExerciseRow]] | None = None) -> ChapterInfo:
    """The title (its first heading), question, prerequisites and exercises of the chapter ``notebook``."""
    notebook = Path(notebook)
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    first = next(("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "markdown"), "")
    heading = re.search(r"^#\s+(.+)$", first, re.M)
    number = int(notebook.name[:2])
    title = re.sub(r"^\d+\.\s*", "", heading.group(1).strip()) if heading else notebook.stem[3:].replace("_", " ")
    about = ABOUT.get(notebook.stem)
    if about is not None:
        question, prerequisites = about.question, about.prerequisites
    else:
        paragraphs = [p for p in re.split(r"\n\s*\n", first) if p.strip() and not p.lstrip().startswith("#")]
        question, prerequisites = (_first_sentence(paragraphs[0]) if paragraphs else ""), ()
    rows = (exercises if exercises is not None else exercises_by_chapter()).get(notebook.stem, [])
    return ChapterInfo(notebook.stem, number, title, question, prerequisites, about is not None, list(rows))
