"""The one-page report: built from a run's results and figures, opened from disk in headless Chromium.

The fixture is a small run folder: chapters 1 and 2 with results and figures
drawn by ``streamlab.book.plots`` and saved by ``streamlab.book.figures`` (as a chapter
saves them), chapter 7 with results but no figure, and a chapter 12 the report
has no mapping for. The browser test loads the page over ``file://`` (no
server), checks that every image decodes, and leaves a screenshot beside
the run folder (pytest's temporary folder; ``build/`` is the book's) to look at.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from streamlab.lab.outside import headless
from streamlab.book import figures
from streamlab.book import plots
from streamlab.book import report  # noqa: E402

HEADLINES = {
    "01_split_characters": "01 split characters: 14 broken pieces naive, 0 incremental; joined text equals the original: True",
    "02_three_ways": "02 three ways: /complete first text 3.92 s = end 3.92 s; /stream first text 0.24 s, end 4.07 s",
    "07_persisting_partial_answers": "07 persisted partial answers: stop reasons stored ['completed']",
    "12_what_else_sits_between": "12 what else sits between: a chapter the report has no mapping for",
}
WAYS = {"complete": {"first text (s)": 3.92, "end (s)": 3.92, "bytes on the wire": 507.7},
        "stream": {"first text (s)": 0.24, "end (s)": 4.07, "bytes on the wire": 1709.7},
        "ws": {"first text (s)": 0.25, "end (s)": 4.12, "bytes on the wire": 1113.7}}


def record(out: Path, name: str, **figures_: object) -> None:
    path = out / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"headline": HEADLINES[name], "figures": figures_}), encoding="utf-8")


def save(out: Path, name: str, *draws: object) -> None:
    """Save each drawing as the chapter's hook would: in order, named by title."""
    saver = figures.FigureSaver(figures.folder_for(out / "results" / f"{name}.json"))
    for draw in draws:
        plt.close("all")
        ax = draw()
        saver.save(ax.figure)
    plt.close("all")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    record(out, "01_split_characters", naive_broken=14, incremental_broken=0)  # no joined_equal recorded
    save(out, "01_split_characters",
         lambda: plots.detokenizer_cost([{"answer length (tokens)": n, "window µs/token": 1.9, "full re-decode µs/token": n / 8}
                                         for n in (128, 512)]),
         lambda: plots.broken_by_script([{"text": "Vietnamese", "naive broken": 14, "incremental broken": 0}]))
    record(out, "02_three_ways", ways=WAYS)
    save(out, "02_three_ways",
         lambda: plots.gap_ecdf({"/stream (SSE)": [0.1, 0.11, 0.3], "/ws (WebSocket)": [0.1, 0.09]}),
         lambda: plots.ttft_chart({"/complete": (3.92, 3.92), "/stream (SSE)": (0.24, 4.07), "/ws (WebSocket)": (0.25, 4.12)},
                                  title="Time to the first text, and to the end: three ways"))
    record(out, "07_persisting_partial_answers")
    record(out, "12_what_else_sits_between")
    save(out, "12_what_else_sits_between",
         lambda: plots.paired_bars([{"way": "gzip", "first text (ms)": 4900.0}, {"way": "no gzip", "first text (ms)": 200.0}],
                                   "way", ["first text (ms)"], units="ms", title="First text through gzip"),
         lambda: plots.gap_ecdf({"gzip": [4.9]}, title="A second figure"))
    report.write_report(out)
    return out


def test_each_chapter_shows_its_key_figure_or_its_first(run):
    found = {c.name: c for c in report.chapters(run)}
    assert list(found) == sorted(HEADLINES)
    assert found["02_three_ways"].key_figure.name == "02-time-to-the-first-text-and-to-the-end-three-ways.png"
    assert found["01_split_characters"].key_figure.name.startswith("02-broken-pieces")
    assert found["12_what_else_sits_between"].key_figure.name.startswith("01-first-text-through-gzip")  # no mapping: first
    assert found["07_persisting_partial_answers"].key_figure is None


def test_the_original_figures_stand_beside_ours(run):
    chapter = {c.name: c for c in report.chapters(run)}["02_three_ways"]
    rows = {what: (theirs, ours) for what, theirs, ours in chapter.comparisons()}
    assert rows["/complete: first text = end"] == ("4.68 s", "3.92 s")
    assert rows["bytes on the wire per answer: /complete / /stream / /ws"] == ("596 / 2626 / 2038", "508 / 1710 / 1114")
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "6 vs 0" in page and "14 vs 0" in page
    assert "not measured in this run" in page  # chapter 1's record lacks one: said so, not guessed
    assert all(headline.split(":")[0] in page for headline in HEADLINES.values())
    assert page.count('<img src="data:image/png;base64,') == 3  # one key figure per chapter that saved one
    assert 'href="figures/12_what_else_sits_between/02-a-second-figure.png"' in page


@pytest.mark.browser
@pytest.mark.skipif(headless.unavailable_reason() is not None, reason=f"no headless browser: {headless.unavailable_reason()}")
def test_the_report_opens_from_disk_and_every_image_loads(run):
    shot = run.parent / "report.png"
    seen = report.screenshot(run / "report.html", shot)
    assert len(seen["images"]) == 3 and all(width > 0 for width in seen["images"]), seen["images"]
    for headline in HEADLINES.values():
        assert headline in seen["text"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
