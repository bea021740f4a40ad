"""Every chapter shows its idea and folds its plumbing, and speaks in the book's one voice (streamlab.book.layout).

Read from the committed notebooks, without running them: the visible code
of each chapter (code cells neither ``hide-input`` nor ``parameters``) within
the bound, every ``hide-input`` cell collapsed in JupyterLab too, and every
chapter opening, checking and ending as the others do. The counters
themselves are tested first, on notebooks written here.
"""

from __future__ import annotations

import statistics

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from streamlab.book.layout import (
    MAX_MEDIAN,
    MAX_VISIBLE,
    question_problems,
    uncollapsed,
    visible_lines,
    voice_problems,
)
from streamlab.book.notebooks import chapters

HIDDEN = {"tags": ["hide-input"], "jupyter": {"source_hidden": True}}

QUESTIONS = """## Check your understanding

1. Predict the number: how many pieces?

   <details><summary>Answer</summary>

   Three, because:

   1. a numbered list inside an answer is the answer's own;
   2. it is not a question.

   </details>

2. Which fix, and why?

   <details><summary>Answer</summary>

   The header.

   </details>

3. Explain the difference.

   <details><summary>Answer</summary>

   One buffers.

   </details>
"""


def chapter(**changes):
    """A chapter in the book's voice; ``changes`` replaces some of its cells' sources."""
    parts = {
        "opening": "# 4. The reader\n\n**What this chapter asks:** how fast?\n\n**What you will be able to do:** say it."
                   "\n\nThe rest of the introduction.",
        "check": QUESTIONS,
        "end": "## Takeaways\n",
    }
    parts.update(changes)
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell(parts["opening"]),
        new_code_cell("results_path = None\nmax_tokens = 30", metadata={"tags": ["parameters"]}),
        new_code_cell("trace = client.stream(port, body)\n\nplot(trace)"),
        new_code_cell("display(Markdown(f'{either(x, \"a\", \"b\")}'))\nrecord(results_path, 'h')", metadata=HIDDEN),
        new_code_cell("display(table)", metadata={"tags": ["hide-input"]}),
        new_markdown_cell(parts["check"]),
        new_markdown_cell(parts["end"]),
        new_code_cell("display(Markdown(takeaways))", metadata=HIDDEN),
    ]
    return nb


def test_visible_lines_count_what_a_reader_sees():
    assert visible_lines(chapter()) == 2, "two lines of the experiment: the parameters and hidden cells do not count"


def test_a_hide_input_cell_without_source_hidden_is_found():
    assert uncollapsed(chapter()) == [4]


def test_a_chapter_in_the_book_s_voice_has_no_problem():
    assert voice_problems(chapter()) == []


@pytest.mark.parametrize("changes, said", [
    ({"opening": "# 4. The reader\n\n**The question:** how fast?\n\n**By the end** you will say it."},
     "no paragraph starting **What this chapter asks:**"),
    ({"opening": "# 4. The reader\n\nAn introduction first.\n\n**What this chapter asks:** how fast?"},
     "right under its title"),
    ({"end": "## What this chapter leaves\n"}, "'## What this chapter leaves'"),
    ({"check": "## Check your understanding\n\n1. One?\n\n2. Two?\n"}, "no answer folded under it"),
    ({"check": QUESTIONS.split("3. Explain")[0]}, "2 numbered questions (ask 3 to 5)"),
    ({"check": "## Quiz\n\n1. One?\n"}, "0 cells headed '## Check your understanding'"),
])
def test_a_chapter_out_of_voice_is_told_what_it_lacks(changes, said):
    problems = voice_problems(chapter(**changes))
    assert any(said in p for p in problems), problems


def test_an_empty_answer_and_a_misnumbered_question_are_found():
    text = QUESTIONS.replace("The header.", "").replace("3. Explain", "4. Explain")
    problems = question_problems(text.strip())
    assert any("question 2's answer is empty" in p for p in problems), problems
    assert any("question 3 is numbered 4" in p for p in problems), problems


# --------------------------------------------------------------------------
# The real chapters
# --------------------------------------------------------------------------


def test_every_hide_input_cell_is_collapsed_in_jupyterlab_too():
    missing = {nb.stem: uncollapsed(nb) for nb in chapters() if uncollapsed(nb)}
    assert not missing, f"hide-input cells without metadata jupyter.source_hidden: true (by cell index): {missing}"


def test_every_chapter_shows_at_most_80_visible_lines_and_the_book_a_median_of_60():
    counts = {nb.stem: visible_lines(nbformat.read(nb, as_version=4)) for nb in chapters()}
    over = {stem: n for stem, n in counts.items() if n > MAX_VISIBLE}
    median = statistics.median(counts.values())
    assert not over and median <= MAX_MEDIAN, (
        f"visible code lines (non-blank, outside hide-input and parameters cells): {counts}; over {MAX_VISIBLE}: "
        f"{over}; median {median:g} (at most {MAX_MEDIAN}). python -m streamlab.book.layout says more")


def test_every_chapter_opens_checks_and_ends_in_one_voice():
    problems = {nb.stem: voice_problems(nb) for nb in chapters()}
    problems = {stem: said for stem, said in problems.items() if said}
    assert not problems, "\n".join(f"{stem}: {'; '.join(said)}" for stem, said in problems.items())


def test_every_chapter_shows_the_path_with_its_own_hop_marked():
    """The one picture of the path (book/path_picture.py), right under each chapter's opening, its hop marked."""
    import ast
    import json

    from streamlab.book.notebooks import chapters
    from streamlab.book.path_picture import HOPS, hop_named

    for notebook in chapters():
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        shown = "".join(cells[1]["source"])
        assert "path_picture(marked=" in shown and "hide-input" in cells[1]["metadata"].get("tags", []), notebook.name
        marked = ast.literal_eval(shown.split("path_picture(marked=", 1)[1].split(")", 1)[0] + ")")  # a tuple of names
        assert marked and all(hop_named(name) in {hop for hop, _ in HOPS} for name in marked), notebook.name
