"""Chapters 11 to 13's charts (streamlab.book.late_plots), drawn at the notebook's width: nothing overlaps or spills,
every axis says what it shows, and each says the one thing it was drawn for."""

from __future__ import annotations

from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from test_plots import backpressure_series, drawn, outside, overlaps, trace  # noqa: E402

from streamlab.book import late_plots, style  # noqa: E402


def load_rows() -> list[dict[str, Any]]:
    return [{"engine": engine, "readers": n, "ttft_p50_s": 0.1 * n ** 0.8, "tpot_p50_s": 0.047 * n ** k,
             "tokens_per_s": 18 * n ** (0.5 if engine == "batched" else 0.1)}
            for engine, k in (("threads", 0.9), ("batched", 0.4)) for n in (1, 8)]


def kill_rows(pace: float, events: int, gap_after: int | None) -> list[tuple[float, int, int]]:
    rows, t, connection = [], 0.1, 1
    for n in range(1, events + 1):
        if gap_after is not None and n == gap_after + 1:
            t, connection = t + 1.0, 2
        rows.append((t, n, connection))
        t += pace
    return rows


HOPS = {"direct": trace(0.09, 0.84, 16), "nginx ignores X-Accel-Buffering": trace(0.84, 0.84, 16),
        "stand-in gzip, sync flush": trace(0.11, 0.86, 16), "nginx cache everything, reconnect after event 5":
        trace(0.002, 0.002, 16), "nginx cache, honouring the origin, reconnect after event 5": trace(0.002, 0.003, 11),
        "buffering runtime": trace(0.85, 0.85, 16), "streaming runtime": trace(0.12, 0.87, 16)}

def budget(llama_cpp_ms: float | None = 21.0) -> dict[str, Any]:
    parts = {"model step": 33.5, "sampling": 0.77, "detokenizer and stop checks": 0.08,
             "hand-over to the event loop": 0.83, "the rest": 0.23}
    step = sum(parts.values())
    beside = [{"part": "llama.cpp's whole step, the same GGUF", "ms a token": llama_cpp_ms}] if llama_cpp_ms else []
    return {"rows": [{"part": k, "ms a token": v, "share of the step": v / step} for k, v in parts.items()],
            "beside": beside, "step_ms": step}


CHARTS: dict[str, Callable[[], Any]] = {
    "token_budget_bars": lambda: late_plots.token_budget_bars(budget()),
    "load_panels": lambda: late_plots.load_panels(load_rows()),
    "backpressure_panels": lambda: late_plots.backpressure_panels(
        backpressure_series(), names={"unbounded": "unbounded", "bounded": "bounded at 256",
                                      "bounded_timeout": "bounded at 256, 2 s timeout"}),
    "hop_timeline": lambda: late_plots.hop_timeline(HOPS, title="The same 16-token answer through every hop"),
    "kill_panels": lambda: late_plots.kill_panels(
        {"shared log": kill_rows(0.03, 40, 12), "in memory, sticky": kill_rows(0.01, 12, None)},
        killed_at={"shared log": 0.47, "in memory, sticky": 0.22},
        answer_events={"shared log": 40, "in memory, sticky": 40},
        notes={"in memory, sticky": "then 404: the rest lost"},
        titles={"shared log": "Shared log: the model, through the workers",
                "in memory, sticky": "In memory, sticky: a scripted replica (its own pace)"}),
}


@pytest.mark.parametrize("name", list(CHARTS))
def test_a_late_chart_can_be_read_at_the_notebooks_width(name):
    fig = drawn(CHARTS[name])
    assert fig.get_figwidth() <= style.NOTEBOOK_WIDTH + 1e-9
    assert overlaps(fig) == []
    assert outside(fig) == []
    for ax in fig.axes:
        assert ax.get_xlabel().strip() and ax.get_ylabel().strip() and ax.get_title().strip(), name
    plt.close("all")


def test_every_late_chart_function_is_tested():
    assert set(late_plots.__all__) <= set(CHARTS)


def test_the_load_panels_start_at_zero_and_give_the_threshold_its_unit():
    fig = drawn(CHARTS["load_panels"])
    assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert "a reader notices: 200 ms" in legend
    plt.close("all")


def test_the_backpressure_panels_name_policies_in_words_and_draw_the_reader_once():
    fig = drawn(CHARTS["backpressure_panels"])
    for ax in fig.axes:  # every panel has its legend, and no code name in it
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels and not any("_" in label for label in labels), labels
    made = fig.axes[0]
    assert sum("pieces the reader took" in t.get_text() for t in made.get_legend().get_texts()) == 1
    plt.close("all")


def test_each_hops_times_stand_in_a_column_of_their_own():
    fig = drawn(CHARTS["hop_timeline"])
    ax = fig.axes[0]
    notes = ax.texts
    assert len(notes) == len(HOPS) and len({round(t.get_position()[0], 6) for t in notes}) == 1
    assert any(t.get_text() == "first text = end: 0.84 s" for t in notes)
    plt.close("all")


def test_a_reader_killed_on_each_source_gets_its_own_clock():
    fig = drawn(CHARTS["kill_panels"])
    scripted, model = fig.axes[1], fig.axes[0]
    assert scripted.get_xlim() != model.get_xlim() and len(fig.axes) == 2
    plt.close("all")


def test_the_token_budget_lays_the_parts_end_to_end_and_llama_cpp_only_where_measured():
    fig = drawn(CHARTS["token_budget_bars"])
    ours = [p for p in fig.axes[0].patches if abs(p.get_y() + p.get_height() / 2) < 1e-9]
    assert sum(p.get_width() for p in ours) == pytest.approx(budget()["step_ms"])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["streamlab (Generation)", "llama.cpp (its server)"]
    plt.close("all")
    alone = drawn(lambda: late_plots.token_budget_bars(budget(None)))
    assert [t.get_text() for t in alone.axes[0].get_yticklabels()] == ["streamlab (Generation)"]
    plt.close("all")
