"""The book's glossary: every term a chapter defines, with the sentence that defines it, alphabetically.

Where a chapter first explains a term it wraps the term's first mention in
``<dfn id="SLUG">term</dfn>`` (the slug lowercase ASCII words joined by
hyphens, defined once in the whole book); a later chapter that uses the term
links there, ``[the reading threshold](04_the_reader.ipynb#reading-threshold)``.
``terms`` reads them from a chapter's Markdown (its cells, and the Markdown
its code displays), ``render_glossary`` writes the book's
``glossary.html``: each term, the sentence it is defined in, and a link to
that place on the chapter's page (the book keeps the ``dfn`` ids as anchors).
``tests/test_glossary.py`` checks the slugs, that each is defined once, and
that every link to one leads to it.
"""

from __future__ import annotations

import html
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = ["DFN", "SLUG", "Term", "glossary", "render_glossary", "term_links", "terms"]

DFN = re.compile(r'<dfn\s+id="([^"]*)"\s*>(.*?)</dfn>', re.S)
SLUG = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
# A link to a term: [words](04_the_reader.ipynb#reading-threshold), with or without a folder before it.
TERM_LINK = re.compile(r"\]\((?:[^)\s]*/)?(\d\d_\w+)\.ipynb#([^)\s]+)\)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*_`<\[\"'])")


@dataclass(frozen=True)
class Term:
    """A term as the chapter defines it: its slug, its words, the sentence it is defined in (Markdown), the chapter."""

    slug: str
    term: str
    sentence: str
    stem: str

    @property
    def sort_key(self) -> str:
        plain = unicodedata.normalize("NFKD", _plain(self.term)).encode("ascii", "ignore").decode()
        return re.sub(r"[^a-z0-9 ]", "", plain.lower()).strip() or self.slug


def _plain(text: str) -> str:
    """Markup out: tags, emphasis, code marks; what the words read."""
    text = re.sub(r"<[^>]+>", "", text)
    return " ".join(re.sub(r"\*\*|__|`|(?<!\w)[*_]|[*_](?!\w)", "", text).split())


def _markdown_of(notebook: Path | dict[str, Any]) -> list[str]:
    """A chapter's Markdown, in order: its Markdown cells and the Markdown its code displayed."""
    nb = notebook if isinstance(notebook, dict) else json.loads(Path(notebook).read_text(encoding="utf-8"))
    found = []
    for cell in nb.get("cells", []):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        if cell.get("cell_type") == "markdown":
            found.append(source)
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            value = output.get("data", {}).get("text/markdown")
            if value:
                found.append("".join(value) if isinstance(value, list) else str(value))
    return found


LONGEST = 300  # characters: a longer sentence is cut to its clause (between semicolons) that holds the term
_BLOCK = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*+]|\d+\.)\s)")  # paragraphs, and each item of a list
_MARKER = re.compile(r"^\s*(?:[-*+]|\d+\.|#+)\s+")


def _sentence(paragraph: str, start: int) -> str:
    """The sentence of ``paragraph`` in which the character at ``start`` stands (a list item's marker left out)."""
    bounds = [0] + [m.end() for m in _SENTENCE_END.finditer(paragraph)] + [len(paragraph)]
    begin, end = next(((b, e) for b, e in zip(bounds, bounds[1:]) if b <= start < e), (0, len(paragraph)))
    sentence = paragraph[begin:end]
    if len(sentence) > LONGEST:
        cuts = [0] + [m.end() for m in re.finditer(r";\s", sentence)] + [len(sentence)]
        at = start - begin
        b, e = next((b, e) for b, e in zip(cuts, cuts[1:]) if b <= at < e)
        sentence = ("… " if b else "") + sentence[b:e].strip().rstrip(";") + (" …" if e < len(sentence) else "")
    return _MARKER.sub("", " ".join(sentence.split()))


def terms(notebook: Path, stem: str | None = None) -> list[Term]:
    """Every ``<dfn id>`` of a chapter, in the order the chapter defines them."""
    stem = stem or Path(notebook).stem
    found = []
    for text in _markdown_of(notebook):
        for paragraph in _BLOCK.split(text):
            for m in DFN.finditer(paragraph):
                found.append(Term(m.group(1), _plain(m.group(2)), _sentence(paragraph, m.start()), stem))
    return found


def glossary(notebooks: Iterable[Path]) -> list[Term]:
    """The terms of all these chapters, alphabetically (a slug defined twice is kept where it was first)."""
    seen: dict[str, Term] = {}
    for notebook in notebooks:
        for term in terms(notebook):
            seen.setdefault(term.slug, term)
    return sorted(seen.values(), key=lambda t: (t.sort_key, t.stem))


def term_links(notebook: Path) -> list[tuple[str, str]]:
    """Every link of a chapter to a term of a chapter: (that chapter's file name, the slug)."""
    return [(m.group(1), m.group(2)) for text in _markdown_of(notebook) for m in TERM_LINK.finditer(text)]


def _sentence_html(sentence: str, slug: str) -> str:
    """The defining sentence as HTML: the term in bold, other terms plain, links kept, its Markdown rendered."""
    from nbconvert.filters import markdown2html

    marked = DFN.sub(lambda m: f"<b>{m.group(2)}</b>" if m.group(1) == slug else m.group(2), sentence)
    rendered = markdown2html(marked).strip()
    return re.sub(r"^<p>(.*)</p>$", r"\1", rendered, flags=re.S)


def render_glossary(items: list[Term], place: Callable[[Term], str], chapter_label: Callable[[str], str]) -> str:
    """The glossary as HTML: one entry per term, its sentence and a link to where its chapter defines it.

    ``place(term)`` is that link (``04_the_reader.html#reading-threshold``).
    """
    if not items:
        return '<p class="muted">No chapter marks a term yet (<code>&lt;dfn id="..."&gt;</code>).</p>'
    esc = html.escape
    parts = ['<dl class="glossary">']
    letter = ""
    for term in items:
        first = term.sort_key[:1].upper()
        if first != letter:
            letter = first
            parts.append(f'<dt class="letter" id="letter-{esc(letter.lower())}">{esc(letter)}</dt>')
        target = place(term)
        parts.append(f'<dt id="{esc(term.slug)}"><a href="{esc(target)}">{esc(term.term)}</a></dt>'
                     f"<dd>{_sentence_html(term.sentence, term.slug)}"
                     f' <span class="meta">({esc(chapter_label(term.stem))})</span></dd>')
    parts.append("</dl>")
    return "\n".join(parts)
