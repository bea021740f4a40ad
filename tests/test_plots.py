"""Every chart a chapter draws can be read: rendered at the notebook's size, nothing overlaps, every axis says what.

Each function of ``streamlab.book.plots`` is drawn with data recorded by a real run
of the chapters (``tests/data/recorded_figures.json``, from build/results) or
shaped like it, and measured with matplotlib's own renderer: the bounding boxes
of tick labels, axis labels, titles, annotations and the legend must not
overlap one another. Gap charts must draw the reading threshold and say in the
legend what share of gaps lies above it. The figure-saving hook is tested here
too, on a figure it saves outside a notebook.
"""

from __future__ import annotations

import gc
import json
import random
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from streamlab.book import figures
from streamlab.book import plots  # noqa: E402
from streamlab.book import style
from streamlab.client import metrics
from streamlab.lab.experiments.refusals import Stall  # noqa: E402

DATA = json.loads((Path(__file__).parent / "data" / "recorded_figures.json").read_text(encoding="utf-8"))


def trace(first: float, end: float, pieces: int) -> SimpleNamespace:
    """A Trace-like record: ``pieces`` text events evenly from ``first`` to ``end``."""
    step = (end - first) / max(pieces - 1, 1)
    events = [SimpleNamespace(t=first + k * step, kind="text", text="x") for k in range(pieces)]
    return SimpleNamespace(events=events, end=end, first_text=first)


def gaps(mean: float, n: int, seed: int, slow: float = 0.0) -> list[float]:
    rng = random.Random(seed)
    return [max(0.0, rng.gauss(mean, mean * 0.1)) + (slow if rng.random() < 0.05 else 0.0) for _ in range(n)]


def stalls() -> list[Stall]:
    out = []
    for server, freeze in (("one pass", 4.3), ("in chunks", 0.98)):
        times, t = [], 0.3
        while t < 9:
            t += freeze if 2.0 < t < 2.2 else 0.1
            times.append(t)
        reader = SimpleNamespace(events=[SimpleNamespace(t=x, kind="text", text="x") for x in times])
        out.append(Stall(server, reader, 2.0, 2.0 + freeze, 8.0, 2.5, 1.4))
    return out


def backpressure_series() -> dict[str, dict[str, list[float]]]:
    ts = [k * 0.25 for k in range(40)]
    return {row["policy"]: {"t": ts, "tokens": [min(row["tokens_generated"], 120 * t) for t in ts],
                            "read_pieces": [min(row["pieces_read"], t) for t in ts],
                            "queued": [min(row["peak_queued"], 80 * t) for t in ts],
                            "transport_bytes": [min(64e3, 9e3 * t) for t in ts],
                            "kernel_bytes": [min(131e3, 20e3 * t) for t in ts]}
            for row in DATA["backpressure_table"]}


def load_rows() -> list[dict[str, Any]]:
    return [{"engine": engine, "readers": n, "ttft_p50_s": base * n ** 0.8, "tpot_ms": 84 * n ** (0.9 if engine == "threads" else 0.3),
             "tokens_per_s": 10.7 * (1 if engine == "threads" else n ** 0.5)}
            for engine, base in (("threads", 0.17), ("batched", 0.18)) for n in (1, 2, 4, 8)]


WAYS = {"/complete": DATA["ways"]["complete"], "/stream (SSE)": DATA["ways"]["stream"], "/ws (WebSocket)": DATA["ways"]["ws"]}
SIZES = [3, 4, 5, 2, 6, 3, 7, 4, 2, 3, 5, 9] * 5

# Every chart function, drawn as a chapter draws it. A new function in plots.py must be added here (see the test below).
CHARTS: dict[str, Callable[[], Any]] = {
    "timeline": lambda: plots.timeline({k: trace(f, e, 1 if k == "/complete" else 40) for k, (f, e) in WAYS.items()},
                                       title="First prompt, 40 tokens, three ways"),
    "timeline, a reconnect that ends at once": lambda: plots.timeline(
        {"nginx cache, first reader": trace(0.1, 11.0, 20), "nginx cache, reconnect after event 5": trace(0.001, 0.003, 15)},
        ylabel="path"),
    "ttft_chart": lambda: plots.ttft_chart(WAYS),
    "ttft_chart, the hops of chapter 6": lambda: plots.ttft_chart(DATA["paths"], title="The same stream through each hop"),
    "gap_ecdf": lambda: plots.gap_ecdf({"/stream (SSE)": gaps(0.1, 120, 1, 0.15), "/ws (WebSocket)": gaps(0.1, 120, 2)}),
    "gap_ecdf, a buffered hop": lambda: plots.gap_ecdf(
        {"direct": [0.29, *gaps(0.09, 29, 3)], "stand-in proxy, 8 KiB blocks": [2.47, *[0.0] * 29],
         "stand-in proxy, --honor": [0.2, *gaps(0.09, 29, 4)]}, title="The reader's silences through each hop"),
    "gap_ecdf, one way against the reading pace": lambda: plots.gap_ecdf(
        {"/stream": gaps(0.1, 117, 5)}, threshold=0.216, threshold_label="1 / reading speed"),
    "gap_ecdf, many servers, a schedule": lambda: plots.gap_ecdf(
        {f"{s} (sse)": gaps(0.05, 400, i, 0.02) for i, s in enumerate(("streamlab", "uvicorn+starlette", "uvicorn+sse-starlette"))},
        schedule=0.05, title="Gaps between events, 500 streams at once"),
    "gap_ecdf, sub-millisecond delays": lambda: plots.gap_ecdf(
        {"/stream": gaps(0.0008, 32, 6), "/ws": gaps(0.0007, 32, 7)}, threshold=None,
        title="From piece made to piece received, per piece", xlabel="delay to the client's socket (ms)"),
    "stall_gaps": lambda: plots.stall_gaps(stalls()),
    "paired_bars": lambda: plots.paired_bars(DATA["waits"], "words", ["wait, streaming (s)", "wait, no streaming (s)"],
                                             units="seconds before the first word", value_format="{:.2f} s",
                                             title="The wait the reader feels"),
    "paired_bars, one column": lambda: plots.paired_bars(DATA["model_table"], "way", ["first token (ms)"],
                                                         units="milliseconds", title="Time to the first token"),
    "generated_vs_delivered": lambda: plots.generated_vs_delivered(DATA["leaving"], leave_after=DATA["leave_after"]),
    "broken_by_script": lambda: plots.broken_by_script(DATA["scripts"]),
    "detokenizer_cost": lambda: plots.detokenizer_cost(
        [{"answer length (tokens)": n, "naive µs/token": 1.1, "window µs/token": 1.9, "full re-decode µs/token": 0.13 * n}
         for n in (128, 512, 1024, 4096)]),
    "bytes_per_event": lambda: plots.bytes_per_event(DATA["bytes_per_event"], text_bytes=3),
    "size_leak": lambda: plots.size_leak(SIZES, [s + 20 for s in SIZES], [32 * (1 + (s + 20) // 32) for s in SIZES],
                                         pad_block=32),
    "refusal_times": lambda: plots.refusal_times(DATA["refusals"]),
    "first_text_by_readers": lambda: plots.first_text_by_readers(DATA["crowd"], idle=0.21),
    "format_costs": lambda: plots.format_costs(DATA["formats"]),
    "first_text_raw_vs_library": lambda: plots.first_text_raw_vs_library(DATA["formats"]),
    "truncated_reads": lambda: plots.truncated_reads(DATA["truncation"], whole_chars=DATA["text_chars"]),
    "upstream_after_leaving": lambda: plots.upstream_after_leaving(DATA["relay"], leave_after=10),
    "stop_reasons": lambda: plots.stop_reasons(DATA["by_reason"]),
    "by_concurrency": lambda: plots.by_concurrency(load_rows(), "tpot_ms", ylabel="time per token, median (ms)",
                                                   threshold=200, title="Time per output token"),
    "backpressure_timeline": lambda: plots.backpressure_timeline(backpressure_series()),
}
GAP_CHARTS = [name for name in CHARTS if name.startswith(("gap_ecdf", "stall_gaps")) and "sub-millisecond" not in name]


def drawn(make: Callable[[], Any]) -> Any:
    """The figure ``make`` draws, rendered as the notebook renders it."""
    plt.close("all")
    result = make()
    ax = result[0] if hasattr(result, "__len__") else result
    fig = ax.figure
    fig.canvas.draw()
    return fig


def in_view(label: Any, ax: Any, axis: str, renderer: Any) -> bool:
    """A tick label is drawn only when its tick is inside the axes along its axis."""
    box, frame = label.get_window_extent(renderer), ax.get_window_extent(renderer)
    centre = (box.x0 + box.x1) / 2 if axis == "x" else (box.y0 + box.y1) / 2
    lo, hi = (frame.x0, frame.x1) if axis == "x" else (frame.y0, frame.y1)
    return lo - 1 <= centre <= hi + 1


def text_boxes(fig: Any) -> list[tuple[str, Any]]:
    """``(what, bounding box)`` of every piece of text a reader reads, and of each legend as one block."""
    renderer = fig.canvas.get_renderer()
    boxes: list[tuple[str, Any]] = []

    def add(what: str, artist: Any) -> None:
        if artist.get_visible() and (not hasattr(artist, "get_text") or artist.get_text().strip()):
            boxes.append((what, artist.get_window_extent(renderer)))

    for n, ax in enumerate(fig.axes):
        for axis_name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            for label in axis.get_ticklabels(which="both"):
                if label.get_visible() and label.get_text().strip() and in_view(label, ax, axis_name, renderer):
                    boxes.append((f"axes {n} {axis_name} tick {label.get_text()!r}", label.get_window_extent(renderer)))
            add(f"axes {n} {axis_name} label", axis.label)
        for title in (ax.title, ax._left_title, ax._right_title):
            add(f"axes {n} title", title)
        for text in ax.texts:
            add(f"axes {n} annotation {text.get_text()!r}", text)
        if ax.get_legend() is not None:
            add(f"axes {n} legend", ax.get_legend())
    if fig._suptitle is not None:
        add("suptitle", fig._suptitle)
    return boxes


def outside(fig: Any) -> list[str]:
    """Text that spills past the figure's edge: the notebook then shows a wider image, shrunk to fit."""
    frame = fig.bbox
    return [what for what, box in text_boxes(fig)
            if box.x0 < frame.x0 - 2 or box.x1 > frame.x1 + 2 or box.y0 < frame.y0 - 2 or box.y1 > frame.y1 + 2]


def overlaps(fig: Any) -> list[str]:
    found = []
    for (a, box_a), (b, box_b) in combinations(text_boxes(fig), 2):
        width = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        height = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        if width > 1 and height > 1:  # pixels: touching is not overlapping
            found.append(f"{a} overlaps {b}")
    return found


@pytest.mark.parametrize("name", list(CHARTS))
def test_a_chart_can_be_read_at_the_notebooks_width(name):
    fig = drawn(CHARTS[name])
    assert fig.get_figwidth() <= style.NOTEBOOK_WIDTH + 1e-9, "wider than the notebook: shown shrunk, text and all"
    assert overlaps(fig) == []
    assert outside(fig) == []
    for ax in fig.axes:
        assert ax.get_xlabel().strip(), f"{name}: an x axis without a label"
        assert ax.get_ylabel().strip(), f"{name}: a y axis without a label"
        assert ax.get_title().strip() or fig._suptitle is not None, f"{name}: a panel without a title"


@pytest.mark.parametrize("name", GAP_CHARTS)
def test_gap_charts_draw_the_threshold_and_the_share_above_it(name):
    fig = drawn(CHARTS[name])
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert dashed, "no threshold line"
    assert any("a reader notices" in t or "reading speed" in t for t in legend), legend
    if name.startswith("gap_ecdf"):
        curves = [t for t in legend if "above" in t]
        assert len(curves) == len([line for line in ax.get_lines() if line.get_linestyle() == "-"]), legend


def test_the_share_above_the_threshold_is_the_one_measured():
    values = [0.1] * 7 + [0.3] * 3
    ax = plots.gap_ecdf({"/stream": values})
    assert plots.share_above(values, metrics.READING_THRESHOLD) == 0.3
    assert any(t.get_text() == "/stream: 30% above, longest 0.30 s" for t in ax.get_legend().get_texts())
    plt.close("all")


def test_a_burst_is_drawn_at_1_ms_and_said_so_while_sub_millisecond_delays_keep_their_resolution():
    burst = drawn(CHARTS["gap_ecdf, a buffered hop"]).axes[0]  # beside streams whose gaps are the model's pace
    assert min(burst.get_lines()[1].get_xdata()) == 1.0 and "under 1 ms drawn at 1 ms" in burst.get_xlabel()
    fine = drawn(CHARTS["gap_ecdf, sub-millisecond delays"]).axes[0]
    assert min(fine.get_lines()[0].get_xdata()) < 1.0 and "drawn at" not in fine.get_xlabel()
    plt.close("all")


def test_a_thing_has_one_colour_in_every_chapter():
    assert style.color_of("/stream (SSE)") == style.color_of("/stream") == style.color_of("wait, streaming (s)")
    assert style.color_of("wait, no streaming (s)") == style.color_of("/complete")
    assert style.color_of("--naive") == style.color_of("relay --naive") != style.color_of("watching")
    assert style.color_of("naive broken") != style.color_of("incremental broken")
    assert style.color_of("stand-in proxy, 8 KiB blocks") != style.color_of("stand-in proxy, --honor")


def test_every_chart_function_is_tested():
    public = {name for name, value in vars(plots).items()
              if callable(value) and not name.startswith("_") and getattr(value, "__module__", "") == plots.__name__
              and name not in {"color_of", "share_above", "figure"}}
    covered = {name.split(",")[0] for name in CHARTS}
    assert public <= covered, f"chart functions without a readability test: {sorted(public - covered)}"


def test_figures_are_saved_by_title_in_order_and_a_rerun_replaces_them(tmp_path):
    folder = figures.folder_for(tmp_path / "results" / "02_three_ways.json")
    assert folder == tmp_path / "figures" / "02_three_ways"
    (folder).mkdir(parents=True)
    (folder / "01-stale.png").write_bytes(b"old")
    saver = figures.FigureSaver(folder)
    saver.clear()
    first = drawn(CHARTS["ttft_chart"])
    second = drawn(CHARTS["gap_ecdf"])
    saver.save(first)
    saver.save(second)
    saver.save(first)  # shown twice: saved under the same name
    plt.close("all")
    del first, second
    gc.collect()  # a new figure may now get a closed one's id: it must still get a name of its own
    saver.save(drawn(CHARTS["stop_reasons"]))
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["01-time-to-the-first-text-and-to-the-end.png", "01-time-to-the-first-text-and-to-the-end.svg",
                     "02-how-long-the-reader-waits-between-pieces.png", "02-how-long-the-reader-waits-between-pieces.svg",
                     "03-how-each-stream-ended-as-stored.png", "03-how-each-stream-ended-as-stored.svg"]
    assert (folder / names[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert figures.slug("Tokens generated vs delivered: /stream (SSE), µs") == "tokens-generated-vs-delivered-stream-sse-s"
    plt.close("all")
