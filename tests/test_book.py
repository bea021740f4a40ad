"""The book, ``build/book/``: every executed chapter a page, linked in reading order, nothing broken.

Built from a few tiny "executed" chapters made here (a heading, a link, a
printed line, a table, a real PNG from matplotlib, papermill's injected
cell), named like the real ones so their prerequisites come from
``streamlab.book.contents``. Then headless Chromium opens the index and
follows every link it can reach: each page loads its stylesheet and every
image, each link leads to a file (and each #fragment to an element there),
and every chapter and exercise page is reached. The real chapters are
rendered too (as committed, without outputs), to check their own links.
"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from streamlab import cli
from streamlab.lab.results.records import NOTEBOOKS
from streamlab.book.contents import PREREQUISITES, chapter_info, exercise_rows, exercises_by_chapter
from streamlab.book.grading import EXERCISES, exercises
from streamlab.book.notebooks import chapters
from streamlab.book.pages import build_book

REPO = Path(__file__).resolve().parents[1]
CHAPTER_NAMES = ["01_split_characters", "02_three_ways", "03_bytes_on_the_wire"]  # 03 is left unexecuted
FIGURE_TITLE = "When each piece of text arrived"


def a_png() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, 1])
    ax.set_title(FIGURE_TITLE)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


# What each small chapter defines (its <dfn>), and the term each one links to in the chapter before it.
TERMS = {1: ("event-stream", "event stream"), 2: ("time-to-first-token", "time to first token"),
         3: ("buffer", "buffer")}
HIDDEN_SOURCE = "display(Markdown(prose_from(numbers)))  # plumbing"


def executed_chapter(number: int, title: str, png: str, *, link: str) -> nbformat.NotebookNode:
    nb = new_notebook()
    asks = ("" if number == 1 else f"**What this chapter asks:** some context for {number}. When does `x` arrive, and"
            " why?\n\n")
    slug, term = TERMS[number]
    earlier = (f" It builds on [the event stream](01_split_characters.ipynb#{TERMS[1][0]})." if number > 1 else "")
    nb.cells = [
        new_markdown_cell(f"# {number}. {title}\n\n{asks}A sentence that opens chapter {number}. Then another one.\n\n"
                          f"See [the other chapter]({link}) and [the repository's README](../README.md).\n\n"
                          f'Before anything, a word. The <dfn id="{slug}">{term}</dfn> is what chapter {number} defines,'
                          f" in this sentence.{earlier} And this sentence comes after it."),
        new_code_cell("results_path = None", metadata={"tags": ["parameters"]}),
        new_code_cell("results_path = '/tmp/papermill-leftover.json'", metadata={"tags": ["injected-parameters"]}),
        new_code_cell("print('measured')", execution_count=1,
                      outputs=[new_output("stream", name="stdout", text="measured 42 pieces\n")]),
        new_code_cell("table", execution_count=2, outputs=[new_output(
            "execute_result", execution_count=2,
            data={"text/html": "<table class='dataframe'><tr><th>tokens</th></tr><tr><td>30</td></tr></table>",
                  "text/plain": "tokens 30"})]),
        new_code_cell("plot()", execution_count=3, outputs=[new_output(  # the metadata figures.save_figures gives it
            "display_data", data={"image/png": png, "text/plain": "<Figure>"},
            metadata={"image/png": {"alt": FIGURE_TITLE}})]),
        new_code_cell(HIDDEN_SOURCE, execution_count=4, outputs=[new_output(
            "display_data", data={"text/markdown": "The hidden cell's prose, shown.", "text/plain": "<Markdown>"})],
            metadata={"tags": ["hide-input"], "jupyter": {"source_hidden": True}}),
        new_markdown_cell(f"## Takeaways\n\n* chapter {number} measured 42 pieces."),
    ]
    return nb


def brief(number: int, chapter: str) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell(f"# Exercise {number}. Something to write\n\n*Chapter: [the chapter](../{chapter}.ipynb).*"
                          "\n\n**What to write.** A function."),
        new_code_cell("solution = None\nresults_path = None", metadata={"tags": ["parameters"]}),
        new_code_cell("# YOUR CODE HERE\ndef f():\n    raise NotImplementedError('f')"),
    ]
    return nb


@pytest.fixture(scope="module")
def small_book(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("book")
    (root / "README.md").write_text("# the repository\n", encoding="utf-8")
    source, out = root / "notebooks", root / "build"
    (source / "exercises").mkdir(parents=True)
    (out / "notebooks").mkdir(parents=True)
    png = a_png()
    for i, name in enumerate(CHAPTER_NAMES):
        other = CHAPTER_NAMES[(i + 1) % len(CHAPTER_NAMES)]
        nb = executed_chapter(i + 1, name[3:].replace("_", " ").capitalize(), png, link=f"{other}.ipynb")
        nbformat.write(nb, source / f"{name}.ipynb")
        if i < 2:
            nbformat.write(nb, out / "notebooks" / f"{name}.ipynb")
    nbformat.write(brief(1, CHAPTER_NAMES[0]), source / "exercises" / "ex1_first.ipynb")
    nbformat.write(brief(2, CHAPTER_NAMES[2]), source / "exercises" / "ex2_second.ipynb")
    (source / "exercises" / "README.md").write_text(
        "# Exercises\n\n| # | Notebook | Time | What the student writes | Chapter |\n|---|---|---|---|---|\n"
        f"| 1 | [ex1_first](ex1_first.ipynb) | 15 min | A `function`. | [1. One](../{CHAPTER_NAMES[0]}.ipynb) |\n"
        f"| 2 | [ex2_second](ex2_second.ipynb) | 25 min | Another. | [3. Three](../{CHAPTER_NAMES[2]}.ipynb) |\n",
        encoding="utf-8")
    (out / "results").mkdir()
    (out / "results" / "timings.json").write_text(json.dumps({
        "chapters": {CHAPTER_NAMES[0]: 17.2, CHAPTER_NAMES[1]: 123.4}, "total": 140.6, "cpus": 2,
        "finished": "2026-12-01T20:00:00", "failed": {}}), encoding="utf-8")
    figure = out / "figures" / CHAPTER_NAMES[0] / "01-when-each-piece-arrived.png"
    figure.parent.mkdir(parents=True)
    figure.write_bytes(base64.b64decode(png))
    (out / "report.html").write_text(  # as streamlab.book.report writes it: other figures linked by relative path
        "<!doctype html><title>report</title><p>other figures: "
        f'<a href="figures/{CHAPTER_NAMES[0]}/01-when-each-piece-arrived.png">one</a></p>', encoding="utf-8")
    return build_book(out, source=source)


class Page(HTMLParser):
    """The links, images, stylesheets and ids of one HTML file."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.links: list[str] = []
        self.images: list[str] = []
        self.alts: list[str | None] = []
        self.ids: set[str] = set()
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag in ("a", "link") and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "img":
            self.images.append(attrs.get("src") or "")
            self.alts.append(attrs.get("alt"))


def broken_links(book: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """Every relative link or image in ``book/*.html`` that leads to no file (or no element for its #fragment)."""
    pages = {p: Page(p.read_text(encoding="utf-8")) for p in book.glob("*.html")}
    broken = []
    for path, page in pages.items():
        for link in page.links + page.images:
            if link in skip:
                continue
            if re.match(r"^[a-z][a-z0-9+.-]*:", link):
                if not link.startswith(("data:image/", "http://", "https://")):
                    broken.append(f"{path.name}: {link}")
                continue
            target, _, fragment = link.partition("#")
            where = (path.parent / unquote(target)).resolve() if target else path
            if not where.exists():
                broken.append(f"{path.name}: {link}")
            elif fragment and where in pages and unquote(fragment) not in pages[where].ids:
                broken.append(f"{path.name}: {link} (no element {fragment})")
    return broken


def test_a_page_per_executed_chapter_and_exercise(small_book):
    book = small_book.parent
    assert sorted(p.name for p in book.iterdir()) == sorted([
        "index.html", "style.css", "01_split_characters.html", "02_three_ways.html",
        "ex1_first.html", "ex2_second.html", "glossary.html", "checklist.html", "report.html", "figures"])
    assert not broken_links(book)
    page = (book / "02_three_ways.html").read_text(encoding="utf-8")
    assert "papermill-leftover" not in page, "papermill's injected cell is not for readers"
    assert "measured 42 pieces" in page and "<table" in page and page.count('src="data:image/png;base64,') == 1
    assert 'href="01_split_characters.html" rel="prev"' in page and 'href="index.html"' in page
    assert "<b>It asks:</b> Some context for 2. When does <code>x</code> arrive, and why?</p>" in page, (
        "the chapter's own question, with the sentence it leans on")
    assert 'Read first:</b> <a href="01_split_characters.html">1. Split characters</a>' in page
    assert 'href="../../README.md"' in page, "a link to a repository file reaches it from build/book/"
    assert "2.1 min on this machine" in page
    first = (book / "01_split_characters.html").read_text(encoding="utf-8")
    assert 'rel="next"' in first and 'rel="prev"' not in first
    assert '<a href="ex1_first.html">Exercise 1 (15 min)</a>' in first
    # The last executed chapter links to chapter 3 (not run), through the index's row for it.
    assert 'href="index.html#03_bytes_on_the_wire"' in page


def test_a_figure_s_alt_text_is_its_title(small_book):
    """What the figure hook files in the output's metadata reaches the page's <img>, not nbconvert's placeholder."""
    for name in CHAPTER_NAMES[:2]:
        page = Page((small_book.parent / f"{name}.html").read_text(encoding="utf-8"))
        assert page.alts == [FIGURE_TITLE], (name, page.alts)


def test_the_index_lists_the_reading_order_with_times_prerequisites_and_exercises(small_book):
    index = small_book.read_text(encoding="utf-8")
    rows = re.findall(r'<tr id="(\d\d_\w+)">(.*?)</tr>', index, re.S)
    assert [stem for stem, _ in rows] == CHAPTER_NAMES
    cells = {stem: re.findall(r"<td>(.*?)</td>", row, re.S) for stem, row in rows}
    assert cells["01_split_characters"][2] == "17 s" and cells["02_three_ways"][2] == "2.1 min"
    assert cells["02_three_ways"][3] == "1", "chapter 2 names chapter 1 to read first"
    assert cells["02_three_ways"][1] == "Some context for 2. When does <code>x</code> arrive, and why?"
    assert cells["01_split_characters"][1] == "A sentence that opens chapter 1.", "no question stated: its first sentence"
    assert "not in this run" in cells["03_bytes_on_the_wire"][0] and "href" not in cells["03_bytes_on_the_wire"][0]
    assert "Exercise 2 (25 min)" in cells["03_bytes_on_the_wire"][4]
    assert "on 2 CPU cores" in index and "2026-12-01T20:00:00" in index
    assert "A <code>function</code>." in index
    assert 'href="report.html"' in index, "the index links the run's one-page report, copied into the book"
    assert 'href="glossary.html"' in index and 'href="checklist.html"' in index
    assert index.count("<svg") == 1 and 'data-hop="nginx"' in index, "the path picture, on the index"


def test_a_question_keeps_the_sentence_it_leans_on():
    from streamlab.book.contents import _question

    cell = ("# 14. Many streams\n\n**What this chapter asks:** eight streams from one page. Do they all stream at"
            " once? The chapter measures it.\n\n**What you will be able to do:** say so.")
    assert _question(cell) == ("Eight streams from one page. Do they all stream at once?", True)


def test_an_exercise_page_is_its_brief_and_links_its_chapter(small_book):
    page = (small_book.parent / "ex1_first.html").read_text(encoding="utf-8")
    assert "What to write." in page and "NotImplementedError" not in page and "solution" not in page
    assert page.count('href="01_split_characters.html"') == 2  # the box above, and the brief's own link
    assert 'href="ex2_second.html" rel="next"' in page


@pytest.mark.browser
def test_chromium_reaches_every_page_with_every_image(small_book):
    from streamlab.lab.outside import headless

    reason = headless.unavailable_reason()
    if reason:
        pytest.skip(reason)
    book = small_book.parent.resolve()
    seen: dict[Path, dict] = {}
    queue = [small_book.resolve()]
    with headless.chromium(width=1000, height=700) as driver:
        while queue:
            page = queue.pop()
            if page in seen:
                continue
            driver.get(page.as_uri())
            headless.wait_for(lambda: driver.execute_script(
                "return document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)"),
                20, f"{page.name} to load")
            seen[page] = found = driver.execute_script("""return {
                images: Array.from(document.images).map(i => [i.src.slice(0, 40), i.naturalWidth]),
                links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
                styled: getComputedStyle(document.body).maxWidth,
            }""")
            assert all(width > 0 for _, width in found["images"]), f"{page.name}: an image did not load"
            if page.name != "report.html":  # the run's report, copied in, carries a style of its own
                assert found["styled"] == "980px", f"{page.name}: its stylesheet (style.css) did not load"
            for link in found["links"]:
                url = urlparse(link)
                if url.scheme != "file":
                    continue
                target = Path(unquote(url.path))
                assert target.exists(), f"{page.name} links to {link}, which is not there"
                if target.suffix == ".html" and target.parent == book:
                    queue.append(target)
    reached = {p.name for p in seen}
    assert reached == {p.name for p in book.glob("*.html")}, "every page is reachable from the index"
    assert sum(1 for name in reached if re.match(r"\d\d_", name)) == 2
    assert sum(len(found["images"]) for found in seen.values()) == 2


def test_a_hide_input_cell_shows_its_output_with_its_code_folded(small_book):
    page = (small_book.parent / "02_three_ways.html").read_text(encoding="utf-8")
    folded = re.search(r'<details class="hidden-input"><summary>code</summary>(.*?)</details>', page, re.S)
    assert folded, "the hide-input cell's code sits in a <details>"
    assert "prose_from" in folded.group(1) and "highlight" in folded.group(1), "its highlighted source, folded"
    assert "shown." in page and "shown." not in folded.group(1), "its output stays open, outside the fold"
    assert page.count('class="hidden-input"') == 1, "only the tagged cell is folded"
    assert '<span class="nb">print</span>' in page.replace(folded.group(0), ""), "a cell not tagged stays open"


def test_a_term_keeps_its_anchor_and_a_link_to_it_reaches_it(small_book):
    book = small_book.parent
    first = Page((book / "01_split_characters.html").read_text(encoding="utf-8"))
    assert "event-stream" in first.ids, "the <dfn id> is an anchor on the chapter's page"
    second = (book / "02_three_ways.html").read_text(encoding="utf-8")
    assert 'href="01_split_characters.html#event-stream"' in second, "NN_name.ipynb#slug became the page's anchor"
    assert not broken_links(book)


def test_the_glossary_lists_every_term_alphabetically_with_its_sentence_and_its_place(small_book):
    page = (small_book.parent / "glossary.html").read_text(encoding="utf-8")
    entries = re.findall(r'<dt id="([^"]+)"><a href="([^"]+)">([^<]+)</a></dt><dd>(.*?)</dd>', page, re.S)
    assert [slug for slug, *_ in entries] == ["buffer", "event-stream", "time-to-first-token"], "every term, A to Z"
    assert entries[0][1] == "index.html#03_bytes_on_the_wire", "a chapter not in this run: its row of the index"
    slug, href, term, sentence = entries[1]
    assert (href, term) == ("01_split_characters.html#event-stream", "event stream")
    assert "The <b>event stream</b> is what chapter 1 defines, in this sentence." in sentence
    assert "comes after it" not in sentence and "(1. Split characters)" in sentence
    assert 'href="checklist.html"' in page and 'href="index.html"' in page


def test_the_checklist_page_holds_every_item_with_the_chapters_that_measure_it(small_book):
    from streamlab.book.checklist import CHECKLIST

    page = (small_book.parent / "checklist.html").read_text(encoding="utf-8")
    items = re.findall(r"<li><b>(.*?)</b>: (.*?)</li>", page, re.S)
    assert len(items) == len(CHECKLIST)
    assert all(re.search(r'<a href="|chapter \d+', rest) for _, rest in items), "each item names its chapter"
    assert "<code>X-Accel-Buffering: no</code>" in page and "<code>proxy_buffering off</code>" in page
    assert 'href="01_split_characters.html"' in page, "a chapter of the book: linked to its page"
    assert "chapter 6</span>" in page, "a chapter this small book does not hold: named, not linked"


def test_the_book_zipped_and_opened_elsewhere_is_whole(small_book, tmp_path):
    """docs/teaching.md says to hand the folder out zipped: the report and its figures go inside it."""
    import shutil
    import zipfile

    book = small_book.parent
    archive = shutil.make_archive(str(tmp_path / "book"), "zip", root_dir=book.parent, base_dir=book.name)
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp_path / "student")
    opened = tmp_path / "student" / book.name
    report = opened / "report.html"
    assert report.is_file() and (opened / "figures" / CHAPTER_NAMES[0] / "01-when-each-piece-arrived.png").is_file()
    assert not broken_links(opened, skip=("../../README.md",)), "every link works from the unzipped copy"
    for page in opened.glob("*.html"):
        for link in Page(page.read_text(encoding="utf-8")).links:
            target = link.partition("#")[0]
            if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target) and target != "../../README.md":
                assert opened.resolve() in (page.parent / unquote(target)).resolve().parents, f"{page.name}: {link}"


def test_the_path_picture_marks_the_hop_asked_for():
    from xml.etree import ElementTree

    from streamlab.book.path_picture import HOPS, path_picture

    picture = path_picture(marked="Load balancer")
    root = ElementTree.fromstring(picture.svg)
    hops = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("data-hop")]
    assert [g.get("data-hop") for g in hops] == [hop for hop, _ in HOPS]
    assert [g.get("data-hop") for g in hops if "marked" in g.get("class", "")] == ["load balancer"]
    assert picture._repr_svg_() == picture.svg and picture.marked == ("load balancer",)
    assert path_picture(marked=["nginx", "cdn"]).marked == ("nginx", "CDN")
    assert "marked" not in path_picture().svg.split("<g", 1)[1].split(">", 1)[0]
    with pytest.raises(ValueError, match="browser, CDN, load balancer, nginx, server, worker"):
        path_picture(marked="firewall")


def test_without_executed_chapters_the_command_says_to_run_make_run(tmp_path, capsys):
    assert cli.main(["book", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "make run" in err and str(tmp_path / "notebooks") in err


def test_make_run_writes_the_book():
    dry = subprocess.run(["make", "-n", "run"], cwd=REPO, capture_output=True, text=True, check=True)
    lines = dry.stdout.splitlines()
    book = next(i for i, line in enumerate(lines) if line.endswith("-m streamlab book"))
    assert book > next(i for i, line in enumerate(lines) if "-m streamlab run-notebooks" in line)


# --------------------------------------------------------------------------
# The real chapters and exercises
# --------------------------------------------------------------------------


def test_every_chapter_states_its_question_and_names_earlier_prerequisites():
    stems = [nb.stem for nb in chapters()]
    assert len(stems) >= 12
    assert not set(PREREQUISITES) - set(stems), "PREREQUISITES names a chapter that is not in notebooks/"
    assert not set(stems) - set(PREREQUISITES), "every chapter says what to read first (contents.PREREQUISITES)"
    for stem, needs in PREREQUISITES.items():
        for needed in needs:
            assert needed in stems and needed < stem, f"{stem} needs {needed}: not an earlier chapter"
    for nb in chapters():
        info = chapter_info(nb)
        assert info.title and not info.title[0].isdigit(), nb.name
        assert info.stated and info.question.endswith("?"), f"{nb.name} states no question in its first cell"


def test_every_exercise_in_the_readme_table_names_real_chapters():
    rows = exercise_rows()
    stems = {nb.stem for nb in chapters()}
    assert {row.stem for row in rows} == {nb.stem for nb in exercises()}, "one row per exercise notebook"
    missing = [row.stem for row in rows if not row.in_table]
    assert not missing, f"notebooks/exercises/README.md's table does not list {missing}"
    for row in rows:
        assert row.chapters and set(row.chapters) <= stems, row
        assert (EXERCISES / f"{row.stem}.ipynb").is_file()
    assert exercises_by_chapter()["01_split_characters"][0].stem == "ex1_detokenizer"


def test_the_real_chapters_links_resolve_in_the_book(tmp_path):
    """The committed chapters' text, as if executed: their own links must work in the book.

    Only the markdown cells are kept: the committed code cells hold no outputs, and their source is shown
    as escaped text, never as a link, so dropping them checks the same links in a fifth of the time.
    """
    (tmp_path / "notebooks").mkdir()
    for path in chapters():
        nb = nbformat.read(path, as_version=4)
        nb.cells = [c for c in nb.cells if c.cell_type == "markdown"]
        nbformat.write(nb, tmp_path / "notebooks" / path.name)
    index = build_book(tmp_path, source=NOTEBOOKS)
    assert not broken_links(index.parent)
    for page in index.parent.glob("*.html"):  # zipped, the book must still hold: no link out of its folder
        for link in Page(page.read_text(encoding="utf-8")).links:
            target = link.partition("#")[0]
            if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                assert index.parent.resolve() in (page.parent / unquote(target)).resolve().parents, (page.name, link)
    assert len(list(index.parent.glob("[0-9][0-9]_*.html"))) == len(chapters())
    assert len(list(index.parent.glob("ex*.html"))) == len(exercises())


def test_the_teachers_page_is_linked_from_the_readme_and_its_links_resolve():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "](docs/teaching.md)" in readme
    page = REPO / "docs" / "teaching.md"
    text = page.read_text(encoding="utf-8")
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"^([a-z]+:|#)", link):
            assert (page.parent / link).resolve().is_file(), f"docs/teaching.md links to {link}, which is not there"
    for needed in ("Session 1", "Session 2", "Session 3", "Grading a class", "What moves between runs"):
        assert needed in text
    assert "--solutions" in text, "the teacher's page says how to check the model answers pass"
