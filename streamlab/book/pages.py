"""``python -m streamlab book``: the executed chapters as a book of web pages, ``build/book/``.

A reader who has not set anything up yet still wants to read the chapters
with their figures. ``make run`` leaves every executed chapter in
``build/notebooks/``; this command turns them into pages anyone can open from
disk, with no server and no Jupyter:

- ``index.html``: the reading order; for each chapter what it asks, how long
  it ran on this machine (``build/results/timings.json``), what to read
  first and its exercise (``streamlab.book.contents``);
- ``NN_name.html``: each executed chapter with its code, tables and figures
  (images inlined), linked to the previous and the next chapter and to the
  contents;
- ``exN_name.html``: each exercise's brief, linked to its chapters;
- ``glossary.html``: every term a chapter defines (``<dfn id="...">``), the
  sentence that defines it, linked to that place (``streamlab.book.glossary``);
- ``checklist.html``: the production checklist, every fix the chapters
  measure, hop by hop along the path (``streamlab.book.checklist``);
- ``report.html`` and the figures it links (``figures/``): the run's
  one-page report, copied in, so the folder zipped is the whole book;
- ``style.css``: the pages' one stylesheet (the book's palette,
  ``streamlab.book.style``).

A code cell tagged ``hide-input`` (the prose it computes, the table it
shapes) shows its output with its code folded under a "code" summary: the
page shows the idea, and the plumbing is one click away.

Links between notebooks (``../07_persisting_partial_answers.ipynb``) become
links between pages; a link to another file of the repository is rewritten
to reach it from ``build/book/``. The folder is written afresh every time, so
a chapter renamed since the last build leaves no stale page behind.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from streamlab.lab.results.records import BUILD, NOTEBOOKS
from streamlab.book.checklist import render_checklist
from streamlab.book.contents import ChapterInfo, ExerciseRow, chapter_info, exercise_rows, exercises_by_chapter
from streamlab.book.glossary import glossary, render_glossary
from streamlab.book.grading import exercises
from streamlab.book.notebooks import chapters
from streamlab.book.path_picture import path_picture
from streamlab.book.style import BLUE, EMOJI_FONTS, GREY, ORANGE
from streamlab.book.wording import plural
from streamlab.net.errors import ArgumentParser, UserError

__all__ = ["build_book", "main", "page_name"]

DROPPED_TAGS = {"injected-parameters"}  # papermill's cell: a temporary results_path, nothing for a reader

CSS = f"""
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif, {EMOJI_FONTS}; max-width: 980px;
       margin: 1.5em auto; padding: 0 1em; color: #222; line-height: 1.5; }}
a {{ color: {BLUE}; }}
nav {{ display: flex; justify-content: space-between; gap: 1em; font-size: 0.92em; padding: 0.5em 0;
      border-bottom: 1px solid #ddd; }}
nav.bottom {{ border-top: 1px solid #ddd; border-bottom: none; margin-top: 2em; }}
nav span {{ flex: 1; }} nav .up {{ text-align: center; }} nav .next {{ text-align: right; }}
.about {{ background: #f4f6f8; border-left: 4px solid {BLUE}; padding: 0.6em 1em; margin: 1em 0 1.5em; }}
.about p {{ margin: 0.25em 0; }}
.exercise-box {{ border-left-color: {ORANGE}; }}
.meta, .muted {{ color: {GREY}; }}
table {{ border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }}
th, td {{ text-align: left; padding: 0.3em 0.7em 0.3em 0; border-bottom: 1px solid #e4e4e4; vertical-align: top; }}
th {{ color: #555; font-weight: 600; }}
table.contents td:first-child, table.contents td:nth-child(3) {{ white-space: nowrap; }}
img, svg {{ max-width: 100%; height: auto; }}
pre {{ overflow-x: auto; font-size: 0.85em; line-height: 1.35; }}
code {{ font-size: 0.92em; }}
pre, code {{ font-family: ui-monospace, Menlo, Consolas, monospace, {EMOJI_FONTS}; }}
.input_area {{ background: #f7f7f7; border: 1px solid #e6e6e6; border-radius: 3px; margin: 0.6em 0 0.2em;
              padding: 0 0.6em; }}
.output_area pre, .output_text pre {{ margin: 0.3em 0; padding: 0.2em 0.6em; }}
.output_stderr pre {{ background: #fdecea; }}
.anchor-link {{ visibility: hidden; text-decoration: none; margin-left: 0.3em; }}
h1:hover .anchor-link, h2:hover .anchor-link, h3:hover .anchor-link {{ visibility: visible; }}
.rendered_html table, .dataframe {{ border-collapse: collapse; }}
.dataframe td, .dataframe th {{ padding: 0.2em 0.6em; text-align: right; }}
.prompt {{ display: none; }}
details.hidden-input > summary {{ color: {GREY}; font-size: 0.85em; cursor: pointer; margin: 0.4em 0 0.1em; }}
details.hidden-input[open] > summary {{ margin-bottom: 0; }}
dfn {{ font-style: normal; font-weight: 600; }}
:target {{ background: #fff3d6; }}
dl.glossary dt {{ font-weight: 600; margin-top: 0.8em; }}
dl.glossary dt.letter {{ font-size: 1.3em; color: {GREY}; border-bottom: 1px solid #ddd; margin-top: 1.2em; }}
dl.glossary dd {{ margin: 0.2em 0 0 1.2em; }}
ul.checklist li {{ margin: 0.3em 0; }}
figure.path {{ margin: 1em 0; }}
"""

# The basic template, with the input of a hide-input cell folded under a summary (its outputs stay open).
TEMPLATE = """{%- extends 'index.html.j2' -%}
{% block input_group -%}
{%- if 'hide-input' in cell.metadata.get('tags', []) -%}
<details class="hidden-input"><summary>code</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{%- endblock input_group %}
"""


def page_name(stem: str) -> str:
    """The page of a chapter or exercise: ``07_persisting_partial_answers`` → ``07_persisting_partial_answers.html``."""
    return f"{stem}.html"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not timed"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _pygments_css() -> str:
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(style="default").get_style_defs(".highlight")


@dataclass
class Links:
    """Where a link written in a notebook leads from the book's folder."""

    book: Path
    pages: set[str]  # stems that have a page here
    known: set[str]  # chapters and exercises that exist in the source, with or without a page

    _ATTR = re.compile(r'\b(href|src)="([^"]*)"')
    _SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")

    def target(self, link: str, base: Path) -> str:
        """``link`` as written in a notebook in folder ``base``, made to work from the book."""
        if not link or link.startswith(("#", "//")) or self._SCHEME.match(link):
            return link
        path, hash_, fragment = link.partition("#")
        stem = Path(unquote(path)).stem
        if path.endswith(".ipynb"):
            if stem in self.pages:
                return page_name(stem) + hash_ + fragment
            if stem in self.known:
                return f"index.html#{stem}"
        where = (base / unquote(path)).resolve()
        if where.exists():
            return quote(Path(os.path.relpath(where, self.book.resolve())).as_posix()) + hash_ + fragment
        return link

    def rewrite(self, text: str, base: Path) -> str:
        return self._ATTR.sub(lambda m: f'{m.group(1)}="{html.escape(self.target(html.unescape(m.group(2)), base))}"',
                              text)


class Renderer:
    """nbconvert's HTML of cells, without prompts or papermill's injected cell (one exporter for every page)."""

    def __init__(self) -> None:
        from jinja2 import DictLoader
        from nbconvert import HTMLExporter

        self.exporter = HTMLExporter(template_name="basic", exclude_input_prompt=True, exclude_output_prompt=True,
                                     extra_loaders=[DictLoader({"streamlab_book.html.j2": TEMPLATE})],
                                     template_file="streamlab_book.html.j2")

    def body(self, nb: Any) -> str:
        nb.cells = [c for c in nb.cells if not DROPPED_TAGS & set(c.get("metadata", {}).get("tags", []))]
        text, _ = self.exporter.from_notebook_node(nb)
        return text


def _page(title: str, body: str) -> str:
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>", '<link rel="stylesheet" href="style.css"></head><body>',
        body, "</body></html>", ""])


def _nav(prev: tuple[str, str] | None, nxt: tuple[str, str] | None, where: str) -> str:
    esc = html.escape
    left = f'<a href="{esc(prev[0])}" rel="prev">&larr; {esc(prev[1])}</a>' if prev else ""
    right = f'<a href="{esc(nxt[0])}" rel="next">{esc(nxt[1])} &rarr;</a>' if nxt else ""
    return (f'<nav class="{where}"><span class="prev">{left}</span><span class="up"><a href="index.html">Contents</a>'
            ' · <a href="glossary.html">Glossary</a> · <a href="checklist.html">Checklist</a>'
            f'</span><span class="next">{right}</span></nav>')


def _chapter_label(info: ChapterInfo) -> str:
    return f"{info.number}. {info.title}"


def _chapter_ref(stem: str, infos: dict[str, ChapterInfo], pages: set[str]) -> str:
    info = infos.get(stem)
    label = _chapter_label(info) if info else stem
    href = page_name(stem) if stem in pages else f"index.html#{stem}"
    return f'<a href="{html.escape(href)}">{html.escape(label)}</a>'


def _exercise_ref(row: ExerciseRow, pages: set[str]) -> str:
    label = f"Exercise {row.number}" + (f" ({row.time})" if row.time else "")
    if row.stem not in pages:
        return html.escape(label)
    return f'<a href="{html.escape(page_name(row.stem))}">{html.escape(label)}</a>'


def _inline_markdown(text: str) -> str:
    """A table cell's few marks (``code``, **bold**) as HTML, everything else escaped."""
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)


def _timings(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / "results" / "timings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def build_book(out: Path = BUILD, *, source: Path = NOTEBOOKS) -> Path:
    """Write ``out/book/`` from the executed chapters in ``out/notebooks/``; return its index.

    ``source`` is the folder of the chapters as committed (the reading
    order, and the exercises in ``source/exercises/``). A ``UserError`` when
    ``out/notebooks/`` holds no executed chapter.
    """
    import nbformat

    out, source = Path(out), Path(source)
    executed = chapters(out / "notebooks") if (out / "notebooks").is_dir() else []
    if not executed:
        raise UserError(f"{out / 'notebooks'} holds no executed chapter: run `make run` first (or python -m"
                        " streamlab run-notebooks), then python -m streamlab book")
    book = out / "book"
    if book.exists():
        shutil.rmtree(book)
    book.mkdir(parents=True)

    readme = source / "exercises" / "README.md"
    by_chapter = exercises_by_chapter(readme)
    rows = {row.stem: row for row in exercise_rows(readme)}
    briefs = exercises(source / "exercises") if (source / "exercises").is_dir() else []
    built = {nb.stem: nb for nb in executed}
    order = sorted({nb.name: nb for nb in [*chapters(source), *executed]}.values(), key=lambda p: p.name)
    infos = {nb.stem: chapter_info(built.get(nb.stem, nb), by_chapter) for nb in order}
    pages = set(built) | {nb.stem for nb in briefs}
    links = Links(book, pages, set(infos) | {nb.stem for nb in briefs})
    timings = _timings(out)
    seconds = timings.get("chapters") or {}
    renderer = Renderer()

    (book / "style.css").write_text(CSS + _pygments_css() + "\n", encoding="utf-8")
    stems = [nb.stem for nb in executed]
    for i, stem in enumerate(stems):
        info = infos[stem]
        prev = (page_name(stems[i - 1]), _chapter_label(infos[stems[i - 1]])) if i else None
        nxt = (page_name(stems[i + 1]), _chapter_label(infos[stems[i + 1]])) if i + 1 < len(stems) else None
        body = links.rewrite(renderer.body(nbformat.read(built[stem], as_version=4)), source)
        about = _about(info, infos, pages, seconds.get(stem), stem in (timings.get("failed") or {}))
        text = "\n".join([_nav(prev, nxt, "top"), about, f"<main>{body}</main>", _nav(prev, nxt, "bottom")])
        (book / page_name(stem)).write_text(_page(f"{_chapter_label(info)} · streamlab", text), encoding="utf-8")

    for i, nb in enumerate(briefs):
        row = rows.get(nb.stem, ExerciseRow(nb.stem, "", "", ()))
        prev = (page_name(briefs[i - 1].stem), f"Exercise {_number(briefs[i - 1].stem)}") if i else None
        nxt = ((page_name(briefs[i + 1].stem), f"Exercise {_number(briefs[i + 1].stem)}")
               if i + 1 < len(briefs) else None)
        text = "\n".join([_nav(prev, nxt, "top"), _exercise_about(nb, row, infos, pages),
                          f"<main>{links.rewrite(renderer.body(_brief(nb)), nb.parent)}</main>",
                          _nav(prev, nxt, "bottom")])
        (book / page_name(nb.stem)).write_text(_page(f"Exercise {row.number or nb.stem} · streamlab", text),
                                               encoding="utf-8")

    def place(term: Any) -> str:  # where the chapter defines it; a chapter not in this run: its row of the index
        return f"{page_name(term.stem)}#{term.slug}" if term.stem in pages else f"index.html#{term.stem}"

    def label(stem: str) -> str:
        return _chapter_label(infos[stem]) if stem in infos else stem

    terms = glossary(built.get(nb.stem, nb) for nb in order)
    _extra_page(book, "glossary.html", "Glossary", links.rewrite(render_glossary(terms, place, label), source),
                "Every term a chapter defines, with the sentence that defines it; each term leads to that place.")
    _extra_page(book, "checklist.html", "A production checklist",
                render_checklist(lambda stem: _chapter_ref(stem, infos, pages) if stem in infos else
                                 html.escape(f"chapter {int(stem[:2])}")),
                "Every fix the chapters measure, one line each, at the hop where it goes; each names the chapter that"
                " shows why.")
    report = _copy_report(out, book)
    index = book / "index.html"
    index.write_text(_index(out, order, infos, pages, timings, briefs, rows, report=report, terms=len(terms)),
                     encoding="utf-8")
    return index


def _extra_page(book: Path, name: str, title: str, body: str, about: str) -> None:
    nav = _nav(None, None, "top")
    text = "\n".join([nav, f"<main><h1>{html.escape(title)}</h1>", f'<p class="meta">{html.escape(about)}</p>', body,
                      "</main>", _nav(None, None, "bottom")])
    (book / name).write_text(_page(f"{title} · streamlab", text), encoding="utf-8")


def _copy_report(out: Path, book: Path) -> bool:
    """The run's report into the book, with the figures it links: the folder zipped is then the whole book."""
    report = out / "report.html"
    if not report.is_file():
        return False
    shutil.copy2(report, book / "report.html")
    figures = out / "figures"
    if figures.is_dir():
        for image in figures.glob("*/*"):
            if image.suffix in {".png", ".svg"}:
                target = book / "figures" / image.parent.name / image.name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(image, target)
    return True


def _number(stem: str) -> str:
    match = re.match(r"ex(\d+)", stem)
    return match.group(1) if match else stem


def _brief(notebook: Path) -> Any:
    """An exercise notebook's brief: its cells before the first code cell."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
    nb.cells = nb.cells[:first_code]
    return nb


def _about(info: ChapterInfo, infos: dict[str, ChapterInfo], pages: set[str], seconds: float | None,
           failed: bool) -> str:
    esc = html.escape
    needs = ", ".join(_chapter_ref(s, infos, pages) for s in info.prerequisites) or "nothing before it"
    work = ", ".join(_exercise_ref(row, pages) for row in info.exercises) or "none yet"
    ran = f"{_duration(seconds)} on this machine" + (" (its last run failed: this page shows that run)" if failed else "")
    return (f'<aside class="about"><p><b>It asks:</b> {_inline_markdown(info.question)}</p>'
            f"<p><b>Read first:</b> {needs}</p><p><b>Ran in:</b> {esc(ran)}</p>"
            f"<p><b>Exercise:</b> {work}</p></aside>")


def _exercise_about(notebook: Path, row: ExerciseRow, infos: dict[str, ChapterInfo], pages: set[str]) -> str:
    esc = html.escape
    chapters_ = ", ".join(_chapter_ref(s, infos, pages) for s in row.chapters) or "not named"
    return (f'<aside class="about exercise-box"><p><b>Chapter:</b> {chapters_}</p>'
            + (f"<p><b>Time:</b> {esc(row.time)}</p>" if row.time else "")
            + f"<p><b>Where to write it:</b> <code>{esc(notebook.name)}</code> in the exercises you were given"
            " (the course's <code>make exercises</code> writes them to <code>build/exercises/</code>); this page"
            " is its brief, the notebook also holds the code to start from and the checks.</p></aside>")


def _index(out: Path, order: list[Path], infos: dict[str, ChapterInfo], pages: set[str], timings: dict[str, Any],
           briefs: list[Path], rows: dict[str, ExerciseRow], *, report: bool = False, terms: int = 0) -> str:
    esc = html.escape
    seconds = timings.get("chapters") or {}
    timed = [seconds[nb.stem] for nb in order if nb.stem in seconds]
    machine = (f"The times are this machine's, from the run that finished {esc(str(timings.get('finished', '?')))}"
               f" on {timings.get('cpus', '?')} CPU cores ({len(timed)} chapters in {_duration(sum(timed))});"
               " on another machine, or a busier one, they move, often by a third." if timed else
               "No timings were recorded (build/results/timings.json is missing).")
    summary = (' A one-page summary of the same run, each chapter\'s headline and key figure:'
               ' <a href="report.html">report.html</a>.' if report else "")
    parts = [
        "<h1>streamlab: the book</h1>",
        f'<p class="meta">Written {esc(time.strftime("%Y-%m-%d %H:%M"))} from the executed chapters in'
        f" <code>{esc(out.name)}/notebooks/</code>. Every figure and table is the one this run measured.{summary}</p>",
        "<p>How a language model's text reaches a reader, measured against a real model. Read the chapters in"
        " this order: each names what to read first. Each exercise has its brief here; the notebook to work in"
        " comes with the exercises.</p>",
        f'<figure class="path">{path_picture().svg}<figcaption class="meta">Every hop between the model and the'
        " reader can hold a stream back, cut it or replay it; each chapter measures one or two of them. The fixes, hop"
        ' by hop: <a href="checklist.html">the production checklist</a>. What each term means, where a chapter'
        f' defines it: <a href="glossary.html">the glossary</a> ({esc(plural(terms, "term"))}).</figcaption></figure>',
        f'<p class="meta">{machine}</p>',
        '<table class="contents"><tr><th>Chapter</th><th>What it asks</th><th>Ran in</th><th>Read first</th>'
        "<th>Exercise</th></tr>",
    ]
    for nb in order:
        info = infos[nb.stem]
        title = (f'<a href="{esc(page_name(nb.stem))}">{esc(_chapter_label(info))}</a>' if nb.stem in pages
                 else f'{esc(_chapter_label(info))} <span class="muted">(not in this run)</span>')
        needs = ", ".join(f"{infos[s].number}" if s in infos else esc(s) for s in info.prerequisites) or "—"
        work = ", ".join(_exercise_ref(row, pages) for row in info.exercises) or "—"
        parts.append(f'<tr id="{esc(nb.stem)}"><td>{title}</td><td>{_inline_markdown(info.question)}</td>'
                     f"<td>{esc(_duration(seconds.get(nb.stem)))}</td><td>{needs}</td><td>{work}</td></tr>")
    parts.append("</table>")
    if briefs:
        parts += ["<h2>The exercises</h2>", "<table><tr><th>Exercise</th><th>Time</th><th>What you write</th>"
                  "<th>Chapter</th></tr>"]
        for nb in briefs:
            row = rows.get(nb.stem, ExerciseRow(nb.stem, "", "", ()))
            chapters_ = ", ".join(_chapter_ref(s, infos, pages) for s in row.chapters) or "—"
            parts.append(f'<tr><td><a href="{esc(page_name(nb.stem))}">Exercise {esc(_number(nb.stem))}</a></td>'
                         f"<td>{esc(row.time)}</td><td>{_inline_markdown(row.what)}</td><td>{chapters_}</td></tr>")
        parts.append("</table>")
    return _page("streamlab: the book", "\n".join(parts))


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m streamlab book",
        description="The executed chapters as web pages, OUT/book/: index.html (the reading order, what each"
        " chapter asks, its run time, what to read first, its exercise), a page per chapter with its figures,"
        " and each exercise's brief. It reads OUT/notebooks/ (written by make run) and OUT/results/timings.json.",
    )
    parser.add_argument("--out", type=Path, default=BUILD, help="the run's folder (default: build/)")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} is a file: name the folder a run wrote (default: build/)")
    started = time.perf_counter()
    index = build_book(args.out)
    pages = len(list(index.parent.glob("*.html"))) - 1
    print(f"streamlab book: wrote {index} ({pages} pages) in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
