"""What every chapter holds, read from its notebook without running it: how much code it shows, and its voice.

A chapter is read more often than it is run, so its page shows the idea and
folds the plumbing away. Two bounds say how much code a reader sees:

- ``visible_lines``: the non-blank lines of a chapter's code cells that are
  neither tagged ``hide-input`` (the book folds them, JupyterLab collapses
  them) nor the ``parameters`` cell: at most ``MAX_VISIBLE`` in any chapter,
  a median of at most ``MAX_MEDIAN`` over the book;
- ``uncollapsed``: a ``hide-input`` cell must also carry metadata
  ``jupyter.source_hidden: true``, or JupyterLab shows it open.

And one voice from the first chapter to the last (``voice_problems``): right
under the ``# N. Title`` heading, ``**What this chapter asks:**`` and then
``**What you will be able to do:**``; near the end a ``## Check your
understanding`` cell of ``QUESTIONS`` numbered questions, each answer folded
under it (``<details><summary>Answer</summary> ... </details>``); then the
``## Takeaways`` heading and the cell that computes them.

``python -m streamlab.book.layout`` prints each chapter's count and what its
voice lacks; ``tests/test_book_bounds.py`` holds the book to them.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from streamlab.book.wording import plural

__all__ = ["MAX_MEDIAN", "MAX_VISIBLE", "QUESTIONS", "HIDE_INPUT", "uncollapsed", "visible_lines", "voice_problems"]

MAX_VISIBLE = 80  # non-blank lines of visible code in any one chapter
MAX_MEDIAN = 60  # the median of that over the book
QUESTIONS = range(3, 6)  # questions in a chapter's "Check your understanding"
HIDE_INPUT = "hide-input"
ASKS = "**What this chapter asks:**"
ABLE = "**What you will be able to do:**"
CHECK = "## Check your understanding"
TAKEAWAYS = "## Takeaways"
ANSWER = "<details><summary>Answer</summary>"
RETIRED = ("**The question:**", "**By the end", "## What this chapter leaves")


def _cells(notebook: Path | dict[str, Any]) -> list[dict[str, Any]]:
    nb = notebook if isinstance(notebook, dict) else json.loads(Path(notebook).read_text(encoding="utf-8"))
    return nb.get("cells", [])


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _tags(cell: dict[str, Any]) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def visible_lines(notebook: Path | dict[str, Any]) -> int:
    """Non-blank lines of the code cells a reader sees: neither ``hide-input`` nor ``parameters``."""
    return sum(1 for cell in _cells(notebook) if cell.get("cell_type") == "code"
               and not _tags(cell) & {HIDE_INPUT, "parameters"}
               for line in _source(cell).splitlines() if line.strip())


def uncollapsed(notebook: Path | dict[str, Any]) -> list[int]:
    """The ``hide-input`` cells (by index) without ``jupyter.source_hidden: true``, which JupyterLab shows open."""
    return [i for i, cell in enumerate(_cells(notebook)) if HIDE_INPUT in _tags(cell)
            and cell.get("metadata", {}).get("jupyter", {}).get("source_hidden") is not True]


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def _opening_problems(cells: list[dict[str, Any]]) -> list[str]:
    opening = []
    for cell in cells:  # the Markdown before the first code cell: the title and what follows it
        if cell.get("cell_type") != "markdown":
            break
        opening += _paragraphs(_source(cell))
    if not opening or not re.match(r"^# \d+\. \S", opening[0]):
        return ["it does not open with its '# N. Title' heading"]
    problems = []
    if len(opening) < 2 or not opening[1].startswith(ASKS):
        problems.append(f"right under its title: no paragraph starting {ASKS}")
    if len(opening) < 3 or not opening[2].startswith(ABLE):
        problems.append(f"after {ASKS}: no paragraph starting {ABLE}")
    return problems


def question_problems(text: str) -> list[str]:
    """What a "Check your understanding" cell lacks: 3 to 5 numbered questions, each answer folded under it."""
    questions: list[list[str]] = []  # each question's lines, its answer included
    inside = False
    for line in text.splitlines()[1:]:
        if not inside and re.match(r"^\d+\.\s+\S", line):
            questions.append([line])
        elif questions:
            questions[-1].append(line)
        inside = (inside or ANSWER in line) and "</details>" not in line
    problems = []
    if len(questions) not in QUESTIONS:
        problems.append(f"{CHECK}: {plural(len(questions), 'numbered question')} (ask {QUESTIONS[0]} to "
                        f"{QUESTIONS[-1]})")
    for number, lines in enumerate(questions, 1):
        block = "\n".join(lines)
        given = re.match(r"^(\d+)\.", lines[0])
        if given and int(given.group(1)) != number:
            problems.append(f"{CHECK}: question {number} is numbered {given.group(1)}")
        opened, closed = block.find(ANSWER), block.find("</details>")
        if opened < 0 or closed < opened:
            problems.append(f"{CHECK}: question {number} has no answer folded under it ({ANSWER} ... </details>)")
        elif not block[opened + len(ANSWER):closed].strip():
            problems.append(f"{CHECK}: question {number}'s answer is empty")
        elif not re.sub(r"^\d+\.\s*", "", block[:opened]).strip():
            problems.append(f"{CHECK}: question {number} asks nothing")
    return problems


def voice_problems(notebook: Path | dict[str, Any]) -> list[str]:
    """How a chapter departs from the book's one voice (none: it opens, checks and ends as every chapter does)."""
    cells = _cells(notebook)
    problems = _opening_problems(cells)
    markdown = [(i, _source(c)) for i, c in enumerate(cells) if c.get("cell_type") == "markdown"]
    for retired in RETIRED:
        if any(retired in text for _, text in markdown):
            problems.append(f"it still says {retired!r}: the book's voice is {ASKS} / {ABLE} / {TAKEAWAYS}")
    checks = [i for i, text in markdown if text.lstrip().startswith(CHECK)]
    ends = [i for i, text in markdown if text.strip().splitlines()[:1] == [TAKEAWAYS]]
    if len(checks) != 1:
        problems.append(f"{plural(len(checks), 'cell')} headed {CHECK!r} (one, just before {TAKEAWAYS!r})")
    else:
        problems += question_problems(_source(cells[checks[0]]).strip())
    if len(ends) != 1:
        problems.append(f"{plural(len(ends), 'cell')} that is the heading {TAKEAWAYS!r} alone (one, near the end)")
        return problems
    end = ends[0]
    if checks and checks[0] != end - 1:
        problems.append(f"{CHECK!r} is not the cell just before {TAKEAWAYS!r}")
    after = cells[end + 1:]
    if not after or after[0].get("cell_type") != "code":
        problems.append(f"no takeaways cell (code, computed from this run) right after {TAKEAWAYS!r}")
    elif any(c.get("cell_type") == "markdown" for c in after):
        problems.append(f"Markdown after the takeaways: the chapter ends with {TAKEAWAYS!r} and its cell")
    return problems


def main(argv: list[str] | None = None) -> int:
    from streamlab.book.notebooks import chapters

    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)] or chapters()
    counts = {}
    for path in paths:
        counts[path.stem] = visible_lines(path)
        said = voice_problems(path) + [f"hide-input without jupyter.source_hidden: cell {i}" for i in uncollapsed(path)]
        over = f" (over {MAX_VISIBLE})" if counts[path.stem] > MAX_VISIBLE else ""
        print(f"{path.stem}: {counts[path.stem]} visible lines{over}" + ("" if said else ", one voice"))
        for problem in said:
            print(f"  {problem}")
    median = statistics.median(counts.values()) if counts else 0
    print(f"median {median:g} visible lines over {plural(len(counts), 'chapter')} (at most {MAX_MEDIAN})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
