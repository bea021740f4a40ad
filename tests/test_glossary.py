"""The glossary and the checklist the book gathers from the chapters (streamlab.book.glossary, .checklist).

The glossary is read from small chapters written here, then from the real
ones: every ``<dfn id>`` a well-formed slug, each defined once in the book,
and every link to a term leading to a chapter that defines it. The
checklist's chapters must exist, and its hops be the path picture's.
"""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from streamlab.book.checklist import CHECKLIST, render_checklist
from streamlab.book.glossary import SLUG, glossary, render_glossary, term_links, terms
from streamlab.book.notebooks import chapters
from streamlab.book.path_picture import HOPS


def chapter(tmp_path, name, *cells):
    nb = new_notebook()
    nb.cells = list(cells)
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def test_terms_come_with_the_sentence_that_defines_them(tmp_path):
    path = chapter(tmp_path, "04_the_reader", new_markdown_cell(
        "# 4. The reader\n\nA first sentence. The <dfn id=\"reading-threshold\">reading threshold</dfn>, 200 ms, is"
        " the longest gap a reader does not notice (e.g. a pause). A last sentence.\n\nAnother paragraph with"
        " <dfn id=\"tpot\">**time per output token**</dfn>."),
        new_code_cell("x", outputs=[new_output("display_data", data={
            "text/markdown": "Computed: the <dfn id=\"gap\">gap</dfn> between pieces.", "text/plain": ""})]))
    found = terms(path)
    assert [(t.slug, t.term) for t in found] == [("reading-threshold", "reading threshold"),
                                                  ("tpot", "time per output token"), ("gap", "gap")]
    assert found[0].sentence.startswith("The <dfn") and found[0].sentence.endswith("(e.g. a pause).")
    assert found[2].sentence == 'Computed: the <dfn id="gap">gap</dfn> between pieces.'
    assert [t.slug for t in glossary([path])] == ["gap", "reading-threshold", "tpot"]


def test_a_list_item_loses_its_marker_and_a_long_sentence_keeps_the_clause_of_its_term(tmp_path):
    long_one = ("The set-up: " + "a private server on a loopback port, " * 6 + "then Redis; its <dfn id=\"aof\">"
                "append-only file</dfn> on, so a Redis killed comes back; three replicas " + "and more, " * 12 + ".")
    path = chapter(tmp_path, "13_more_than_one_server", new_markdown_cell(
        "What reaches the server:\n\n- **<dfn id=\"abort-controller\">`AbortController`</dfn>**: an object whose"
        " `signal` is handed to `fetch`.\n- **`EventSource`**: it closes.\n\n" + long_one))
    found = {t.slug: t.sentence for t in terms(path)}
    assert found["abort-controller"].startswith("**<dfn") and found["abort-controller"].endswith("to `fetch`.")
    assert found["aof"].startswith("… its <dfn") and found["aof"].endswith("comes back …")


def test_the_glossary_renders_each_term_linked_to_its_place(tmp_path):
    path = chapter(tmp_path, "06_the_proxy", new_markdown_cell(
        'Their <dfn id="idle-timeout">idle timeout</dfn> is `60 s`, see [chapter 4](04_the_reader.ipynb#tpot).'))
    page = render_glossary(glossary([path]), lambda t: f"{t.stem}.html#{t.slug}", lambda stem: "6. The proxy")
    assert '<dt id="idle-timeout"><a href="06_the_proxy.html#idle-timeout">idle timeout</a></dt>' in page
    assert "Their <b>idle timeout</b> is <code>60 s</code>" in page and 'href="04_the_reader.ipynb#tpot"' in page
    assert "(6. The proxy)" in page
    assert term_links(path) == [("04_the_reader", "tpot")]


def test_every_term_of_the_book_has_a_slug_defined_once_and_every_link_to_one_leads_to_it():
    defined: dict[str, list[str]] = {}
    for nb in chapters():
        for term in terms(nb):
            defined.setdefault(term.slug, []).append(nb.stem)
            assert SLUG.match(term.slug), f"{nb.name}: <dfn id={term.slug!r}>: lowercase ASCII words and hyphens"
            assert term.term and term.sentence, f"{nb.name}: <dfn id={term.slug!r}> defines nothing"
    twice = {slug: stems for slug, stems in defined.items() if len(stems) > 1}
    assert not twice, f"each term is defined once in the book: {twice}"
    for nb in chapters():
        for stem, slug in term_links(nb):
            if SLUG.match(slug) and slug in defined:
                assert defined[slug] == [stem], f"{nb.name} links {stem}#{slug}, defined in {defined[slug]}"


def test_every_chapter_the_checklist_names_exists_and_every_hop_is_on_the_path():
    stems = {nb.stem for nb in chapters()}
    hops = {hop for hop, _ in HOPS}
    for item in CHECKLIST:
        assert item.chapters and set(item.chapters) <= stems, item
        assert item.hop in hops, item
        assert item.fix and item.why and not item.why.endswith("."), item
    fixes = " ".join(item.fix for item in CHECKLIST)
    for needed in ("Cache-Control: no-cache", "X-Accel-Buffering: no", ": ping", "204", "proxy_buffering off",
                   "proxy_read_timeout", "Host", "Origin", "AbortController", "TCP_USER_TIMEOUT"):
        assert needed in fixes, needed
    assert len({item.fix for item in CHECKLIST}) == len(CHECKLIST), "one line per fix"


def test_the_checklist_renders_hop_by_hop_in_the_path_s_order():
    page = render_checklist(lambda stem: f'<a href="{stem}.html">{stem}</a>')
    order = [page.index(f'<h2 id="{hop.replace(" ", "-").lower()}">') for hop, _ in HOPS
             if any(item.hop == hop for item in CHECKLIST)]
    assert order == sorted(order)
    assert page.count("<li>") == len(CHECKLIST) and page.startswith("<svg")
