"""Pages that count things count right: chapters, exercises and the course plan, held to the folders they count.

A count in prose goes stale silently when a chapter or an exercise is added
(the README said "twelve Jupyter chapters" with fourteen on the shelf). Every
page a reader or a teacher opens is read here as text: each "N chapters" or
"N exercises" must be the number there are, the README's chapter table must
list every chapter, the teacher's course plan must set every chapter for
reading, and the exercises' page must say which chapters have an exercise.
"""

from __future__ import annotations

import re
from pathlib import Path

from streamlab.book.notebooks import chapters

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "notebooks" / "exercises" / "README.md"]
WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen twenty").split()
COUNTED = re.compile(r"\b(" + "|".join(WORDS) + r"|\d+) (?:Jupyter |numbered )?(chapters|exercises)\b", re.IGNORECASE)
EXERCISES = sorted((REPO / "notebooks" / "exercises").glob("ex*.ipynb"))


def prose(page: Path) -> str:
    """The page as one line of text (a count may be split over two lines), code blocks left out."""
    text = re.sub(r"```.*?```", " ", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return re.sub(r"\s+", " ", text)


def number(word: str) -> int:
    return int(word) if word.isdigit() else WORDS.index(word.lower())


def test_every_count_of_chapters_and_exercises_is_the_number_there_are():
    there_are = {"chapters": len(chapters()), "exercises": len(EXERCISES)}
    assert there_are["chapters"] >= 14 and there_are["exercises"] >= 12
    wrong = [f"{page.relative_to(REPO)}: {m.group(0)!r} ({there_are[m.group(2).lower()]} there)"
             for page in PAGES for m in COUNTED.finditer(prose(page))
             if number(m.group(1)) != there_are[m.group(2).lower()]]
    assert not wrong, wrong


def test_the_checker_finds_a_stale_count(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("A library and\ntwelve Jupyter chapters; 3 exercises.\n", encoding="utf-8")
    found = [(number(m.group(1)), m.group(2)) for m in COUNTED.finditer(prose(page))]
    assert found == [(12, "chapters"), (3, "exercises")]


def test_the_readme_lists_every_chapter():
    listed = re.findall(r"^\| `(\d\d_\w+)` \|", (REPO / "README.md").read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert listed == [nb.stem for nb in chapters()]


def test_the_course_plan_sets_every_chapter_for_reading():
    text = (REPO / "docs" / "teaching.md").read_text(encoding="utf-8")
    read = set()
    chapter = r"(?<!\d)(?<!\d,)(\d{1,2})(?!\d|,\d)"  # a chapter's number, not "4,200 words"
    for line in re.findall(r"Read before: ([^\n]*)", text):
        for a, b in re.findall(chapter + r"\s*(?:to|–|-)\s*" + chapter, line):
            read |= set(range(int(a), int(b) + 1))
        read |= {int(n) for n in re.findall(chapter, line)}
    assert read == set(range(1, len(chapters()) + 1))


def test_the_exercises_page_says_which_chapters_have_one():
    text = (REPO / "notebooks" / "exercises" / "README.md").read_text(encoding="utf-8")
    linked = {int(n) for n in re.findall(r"\]\(\.\./(\d\d)_\w+\.ipynb\)", text)}
    claim = re.search(r"for each of chapters (\d+) to (\d+)((?:,? and \d+|, \d+)*)",
                      prose(REPO / "notebooks" / "exercises" / "README.md"))
    assert claim, "the page says which chapters its exercises are for"
    claimed = set(range(int(claim.group(1)), int(claim.group(2)) + 1)) | {int(n) for n in re.findall(r"\d+", claim.group(3))}
    assert linked == claimed  # "for each of chapters 1 to 12 and 15": a range, then the chapters after a gap
    without = sorted(set(range(1, len(chapters()) + 1)) - linked)
    if without:
        assert re.search(r"chapters? " + r"\D+".join(str(n) for n in without) + r"\b[^.]*no exercise", prose(
            REPO / "notebooks" / "exercises" / "README.md")), f"say that chapters {without} have no exercise yet"


def test_the_server_page_lists_every_route_and_field_from_their_declarations():
    """docs/server.md's route and field tables are rendered from ``ROUTES`` and the schemas: stale is a failure."""
    from streamlab.book import doc_tables
    from streamlab.server.api_docs import ROUTE_FIELDS, SCHEMAS
    from streamlab.server.app import ROUTES

    text = (REPO / "docs" / "server.md").read_text(encoding="utf-8")
    for kind in ("routes", "fields"):
        assert f"<!-- {kind}: streamlab.server.api_docs -->" in text, f"docs/server.md lost its {kind} block"
    assert doc_tables.refresh(text) == text, (
        f"docs/server.md is stale: regenerate it with `{doc_tables.REGENERATE} docs/server.md`")
    for path, methods in ROUTES:
        for method in methods:
            assert f"| `{method} {path}` |" in text
    for schema in SCHEMAS:
        assert all(f"| `{field.name}` |" in text for field in schema.fields)
    assert set(ROUTE_FIELDS.values()) == set(SCHEMAS)
