"""The chapters' figures, in one style: every chart a chapter shows is drawn here.

Each function draws on a matplotlib Axes (made at the notebook's width if not
given) and returns it, so a chapter can place several on one figure or show
one alone. The style is the same everywhere, so a reader learns it once:

- figures are ``NOTEBOOK_WIDTH`` inches wide, the width a notebook shows them
  at without shrinking their text (wider ones are scaled down, labels and all);
- long labels go on horizontal bars, never under vertical ones;
- every axis says what it measures and in which unit;
- wherever gaps are shown, the reading threshold is drawn and named in the
  legend (``READING_THRESHOLD``), and a gap chart says what share is above it;
- a bar carries its value, so a bar a few pixels long still says something;
- one thing has one colour in every chapter (``COLOR_OF``, ``color_of``):
  ``/stream`` is the same blue in chapter 2, 4 and 6, ``--naive`` the same
  vermillion in chapter 5 and 8.

This module holds the charts. What they share (the width, the palette and
``COLOR_OF``, the threshold, ``STYLE``, and the helpers that write a bar's
value and place a legend) is in ``streamlab.book.style``; its public names are
re-exported here, so ``plots.color_of`` and ``from streamlab.book.plots import
READING_THRESHOLD`` keep working.

``tests/test_plots.py`` renders every function at the notebook's size and
checks that no two labels overlap and that every axis is labelled.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from streamlab.book.style import (
    BLUE,
    COLOR_OF,
    GREEN,
    GREY,
    ORANGE,
    PALETTE,
    THRESHOLD_STYLE,
    VERMILLION,
    _axes,
    _hbars,
    _legend,
    _number,
    _seconds,
    _threshold_legend_name,
    color_of,
    figure,
)
from streamlab.client.metrics import READING_THRESHOLD

__all__ = [
    "backpressure_timeline",
    "broken_by_script",
    "by_concurrency",
    "bytes_per_event",
    "detokenizer_cost",
    "first_text_by_readers",
    "first_text_raw_vs_library",
    "format_costs",
    "gap_ecdf",
    "generated_vs_delivered",
    "paired_bars",
    "refusal_times",
    "share_above",
    "size_leak",
    "stall_gaps",
    "stop_reasons",
    "timeline",
    "truncated_reads",
    "ttft_chart",
    "upstream_after_leaving",
]

_FLOOR_MS = 1.0  # gaps shorter than this (pieces read together: a buffered burst) are drawn at it on a log axis


# -- timelines and time to first text -----------------------------------------------------------


def _stream_rows(ax: Any, rows: Mapping[str, Any]) -> tuple[float, list[tuple[int, Any, list[float], float]]]:
    """Each trace of ``rows`` (label -> ``events``, ``end``) as a row, top down: a bar to its end, a tick at each
    text event, a dot at the first. The longest end, and each row's ``(y, colour, text times, end)`` to label."""
    ends = {label: trace.end or max([e.t for e in trace.events if e.kind == "text"] or [0]) for label, trace in rows.items()}
    drawn = []
    for i, (label, trace) in enumerate(rows.items()):
        y, color = len(rows) - 1 - i, color_of(label, i)
        times = [e.t for e in trace.events if e.kind == "text" and e.text]
        ax.hlines(y, 0, ends[label], color=color, alpha=0.25, linewidth=8)
        ax.vlines(times, y - 0.3, y + 0.3, color=color, linewidth=1)
        if times:
            ax.plot([times[0]], [y], marker="o", color=color, markersize=7)
        drawn.append((y, color, times, ends[label]))
    return max([*ends.values(), 1e-9]), drawn


def timeline(rows: Mapping[str, Any], *, ax: Any = None, title: str = "When each piece of text arrived",
             ylabel: str = "stream") -> Any:
    """One row per way of delivering: a tick at each text arrival, a bar up to the end.

    ``rows`` maps a label to a Trace (anything with ``events`` and ``end``).
    """
    ax = _axes(ax, 1.2 + 0.75 * len(rows))
    span, drawn = _stream_rows(ax, rows)

    def note(text: str, x: float, y: float, color: str, va: str = "bottom") -> None:
        # Written from the point towards the middle, so a note near either edge stays inside the axes.
        ax.annotate(text, (x, y), fontsize=8, color=color, va=va, ha="left" if x < 0.5 * span else "right")

    for y, color, times, end in drawn:
        if times and abs(end - times[0]) < 0.02 * span:
            note(f"first text = end: {_seconds(times[0])}", times[0], y + 0.34, color)
        else:
            if times:
                note(f"first text {_seconds(times[0])}", times[0], y + 0.34, color)
            note(f"end {_seconds(end)}", end, y - 0.34, color, va="top")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(rows)[::-1])
    ax.set_ylim(-0.8, len(rows) - 0.2)
    ax.set_xlim(left=0)
    ax.set_xlabel("seconds after the request was sent")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return ax


def ttft_chart(rows: Mapping[str, tuple[float | None, float | None]], *, ax: Any = None,
               title: str = "Time to the first text, and to the end") -> Any:
    """Per way or hop, two bars side by side: time to the first text (solid) and to the end (pale), both labelled.

    ``rows`` maps a label to ``(first text, end)`` in seconds. The picture of
    what chapters 2 and 6 say: streaming moves the first bar, never the second;
    a buffering hop moves the first all the way to the second.
    """
    ax = _axes(ax, 1.0 + 0.62 * len(rows))
    labels = list(rows)
    for i, label in enumerate(labels):
        first, end = rows[label]
        y = len(labels) - 1 - i
        color = color_of(label, i)
        _hbars(ax, [y + 0.19], [first or 0], height=0.36, colors=color,
               labels=["no text" if first is None else f"first text {_seconds(first)}"])
        _hbars(ax, [y - 0.19], [end or 0], height=0.36, colors=color, alpha=0.35, edgecolor=color,
               labels=["" if end is None else f"end {_seconds(end)}"])
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels[::-1])
    ax.set_ylim(-0.6, len(labels) - 0.4)
    ax.set_xlim(0, max([end or first or 0 for first, end in rows.values()] + [1e-3]) * 1.3)
    ax.set_xlabel("seconds after the request was sent")
    ax.set_ylabel("way / hop")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title)
    return ax


# -- gaps ----------------------------------------------------------------------------------------


def share_above(values: Sequence[float], threshold: float) -> float:
    """The fraction of ``values`` strictly above ``threshold`` (0 for none)."""
    return sum(v > threshold for v in values) / len(values) if values else 0.0


def gap_ecdf(
    gaps_by_label: Mapping[str, Sequence[float]],
    *,
    threshold: float | None = READING_THRESHOLD,
    threshold_label: str = "a reader notices",
    schedule: float | None = None,
    ax: Any = None,
    log: bool = True,
    title: str = "How long the reader waits between pieces",
    xlabel: str = "gap between pieces (ms)",
    ylabel: str = "share of gaps at most this long (%)",
) -> Any:
    """THE gap chart: the distribution of gaps (seconds) per label as an ECDF, against the reading threshold.

    Read it as: at x, the line's height is the share of gaps no longer than x.
    The threshold is a dashed line named in the legend, and each label's legend
    entry says what share of its gaps lie above it, and the longest: a line
    that reaches 100% left of the threshold is a stream no reader notices, and
    a buffering hop shows as few gaps above it, but one as long as the answer. Gaps of ~0 (a buffered
    burst) are drawn at 1 ms on the log axis, and the axis says so.
    """
    ax = _axes(ax, 3.8)
    every = [v * 1000 for values in gaps_by_label.values() for v in values]
    # Bursts (pieces read together) have gaps of ~0, which a log axis cannot place: they are drawn at 1 ms. A chart
    # of sub-millisecond delays keeps its resolution instead (0.01 ms) when most of its values are under 1 ms.
    floor = 0.0 if not log else (_FLOOR_MS if sum(v < _FLOOR_MS for v in every) * 2 <= len(every) else _FLOOR_MS / 100)
    clipped = log and any(v < floor for v in every)
    lowest, highest = math.inf, 0.0
    for i, (label, values) in enumerate(gaps_by_label.items()):
        data = sorted(max(v * 1000, floor) for v in values)
        if not data:
            continue
        lowest, highest = min(lowest, data[0]), max(highest, data[-1])
        ys = [(k + 1) / len(data) * 100 for k in range(len(data))]
        longest = f"longest {_seconds(max(values))}"
        name = f"{label}: {share_above(values, threshold):.0%} above, {longest}" if threshold is not None else \
            f"{label}: {longest}"
        ax.step([data[0], *data], [0, *ys], where="post", color=color_of(label, i), linewidth=1.8, label=name)
    for value, name, style in ((threshold, threshold_label, THRESHOLD_STYLE),
                               (schedule, "schedule", {"color": GREY, "linestyle": ":", "linewidth": 1.2})):
        if value is not None:
            ax.axvline(value * 1000, label=_threshold_legend_name(value, name), **style)
            lowest, highest = min(lowest, value * 1000), max(highest, value * 1000)
    if log and highest > 0:
        lowest = lowest if math.isfinite(lowest) else highest / 10
        ax.set_xscale("log")
        ax.set_xlim(lowest / 1.5, highest * 1.5)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        # Within three decades, label the 2s and 5s between powers of ten too (20, 50, 200...); wider, only powers.
        if highest / lowest < 10 ** 2.5:
            ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
        else:
            ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel + (f"; under {floor:g} ms drawn at {floor:g} ms" if clipped else ""))
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 101)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return ax


def stall_gaps(stalls: Sequence[Any], *, threshold: float | None = READING_THRESHOLD, ax: Any = None,
               title: str = "Another reader's gaps while a long prompt is read") -> Any:
    """For each server, the reader's gap before each piece over time, the long prompt's reading shaded."""
    ax = _axes(ax, 3.6)
    for i, stall in enumerate(stalls):
        color = color_of(stall.server, i)
        points = stall.gaps_during()
        ax.plot([t for t, _ in points], [g for _, g in points], marker=".", linewidth=1, color=color, label=stall.server)
        end = stall.long_first_text or stall.long_end
        if end is not None:
            ax.axvspan(stall.long_sent, end, color=color, alpha=0.12)
    if threshold is not None:
        ax.axhline(threshold, label=f"a reader notices:\n{threshold * 1000:.0f} ms", **THRESHOLD_STYLE)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("seconds since the reader asked (shaded: the long prompt being read)")
    ax.set_ylabel("gap before the piece (s)")
    _legend(ax)
    ax.set_title(title)
    return ax


# -- bars -------------------------------------------------------------------------------------------


def paired_bars(rows: Sequence[Mapping[str, Any]], label: str, values: Sequence[str], *, units: str = "",
                value_format: str | None = None, log: bool = False, ylabel: str | None = None, ax: Any = None,
                title: str = "") -> Any:
    """Horizontal bars, one group per row, one bar per value column, each bar labelled with its value.

    Columns take their colour from ``color_of`` (a "streaming" column is
    /stream's blue, a "naive" one vermillion), so the same thing matches
    across chapters. ``log`` for values that span orders of magnitude.
    """
    ax = _axes(ax, max(2.0, 0.9 + 0.3 * len(rows) * len(values)))
    height = 0.8 / len(values)
    for j, column in enumerate(values):
        ys = [i + j * height for i in range(len(rows))]
        xs = [float(r[column]) for r in rows]
        _hbars(ax, ys, xs, height=height * 0.9, colors=color_of(column, j), label=column,
               labels=[value_format.format(x) if value_format else _number(x) for x in xs])
    ax.set_yticks([i + height * (len(values) - 1) / 2 for i in range(len(rows))])
    ax.set_yticklabels([str(r[label]) for r in rows])
    ax.invert_yaxis()
    ax.set_ylabel(ylabel or label)
    ax.set_xlabel(units)
    if log:
        ax.set_xscale("log")
        ax.margins(x=0.3)
    else:
        ax.margins(x=0.2)
    if len(values) > 1:
        _legend(ax)
    ax.set_title(title)
    return ax


def generated_vs_delivered(rows: Sequence[Mapping[str, Any]], *, leave_after: int | None = None, ax: Any = None,
                           title: str = "Tokens generated vs delivered") -> Any:
    """Per case and server, two bars: tokens the model computed (coloured by server mode) and what reached the reader."""
    ax = _axes(ax, 1.2 + 0.55 * len(rows))
    labels = [f"{r['case']}  ({r['server']})" for r in rows]
    for i, r in enumerate(rows):
        _hbars(ax, [i - 0.19], [r["generated"]], height=0.36, colors=color_of(r["server"]), labels=[str(r["generated"])])
        _hbars(ax, [i + 0.19], [r["delivered"]], height=0.36, colors=COLOR_OF["delivered"], labels=[str(r["delivered"])])
    handles = [Patch(color=color_of(s), label=f"generated, {s} server") for s in dict.fromkeys(r["server"] for r in rows)]
    handles.append(Patch(color=COLOR_OF["delivered"], label="delivered to the reader"))
    if leave_after is not None:
        handles.append(ax.axvline(leave_after, label=f"the reader left after\n{leave_after} pieces", **THRESHOLD_STYLE))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.margins(x=0.1)
    ax.set_xlabel("tokens")
    ax.set_ylabel("case (server)")
    _legend(ax, handles=handles)
    ax.set_title(title)
    return ax


def broken_by_script(rows: Sequence[Mapping[str, Any]], *, ax: Any = None,
                     title: str = "Broken pieces a reader would see, per script") -> Any:
    """Per script, pieces holding U+FFFD from the naive detokenizer and from the incremental one (zero: drawn and said)."""
    return paired_bars(rows, "text", ["naive broken", "incremental broken"], units="pieces holding U+FFFD",
                       value_format="{:.0f}", ylabel="script", ax=ax, title=title)


def detokenizer_cost(rows: Sequence[Mapping[str, Any]], *, length: str = "answer length (tokens)", ax: Any = None,
                     title: str = "Detokenizing cost per token as the answer grows") -> Any:
    """Per detokenizer, microseconds per token against the answer's length (both log), the last value written."""
    ax = _axes(ax, 3.8)
    columns = [c for c in rows[0] if c != length]
    xs = [r[length] for r in rows]
    for i, column in enumerate(columns):
        ys = [r[column] for r in rows]
        color = color_of(column.replace(" µs/token", ""), i)
        ax.plot(xs, ys, marker="o", color=color, label=column.replace(" µs/token", ""))
        ax.annotate(f"{_number(ys[-1])} µs", (xs[-1], ys[-1]), xytext=(6, 0), textcoords="offset points", va="center",
                    fontsize=8, color=color)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:,}" for x in xs])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.margins(x=0.15)
    ax.set_xlabel(length)
    ax.set_ylabel("µs per token (log)")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return ax


def bytes_per_event(sizes: Mapping[str, int], *, text_bytes: int, ax: Any = None, title: str | None = None) -> Any:
    """One bar per framing: the bytes it takes to deliver one piece of ``text_bytes`` bytes, smallest first."""
    ax = _axes(ax, 1.0 + 0.5 * len(sizes))
    title = title or f"One piece of text, {len(sizes)} framings"
    ordered = sorted(sizes.items(), key=lambda kv: kv[1])
    names = [k for k, _ in ordered]
    _hbars(ax, range(len(ordered)), [v for _, v in ordered], height=0.6,
           colors=[color_of(k, i) for i, k in enumerate(names)],
           labels=[f"{v} bytes ({v / text_bytes:.0f}x the text)" for _, v in ordered])
    ax.set_yticks(range(len(ordered)))
    ax.set_yticklabels(names)
    ax.margins(x=0.3)
    ax.set_xlabel(f"bytes on the wire to deliver {text_bytes} bytes of text")
    ax.set_ylabel("framing")
    ax.set_title(title)
    return ax


def size_leak(text_bytes: Sequence[int], plain: Sequence[int], padded: Sequence[int], *, pad_block: int | None = None,
              ax: Any = None, title: str = "Event size reveals token length; padding blurs it",
              padded_label: str | None = None, event: str = "SSE event") -> Any:
    """Each piece: its event's size against its text's size, plain and padded (to blocks, or ``padded_label``)."""
    ax = _axes(ax, 3.8)
    ax.scatter(text_bytes, plain, s=16, color=BLUE, label="plain event")
    ax.scatter(text_bytes, padded, s=16, marker="s", color=ORANGE,
               label=padded_label or f"padded to {pad_block}-byte blocks")
    ax.set_xlabel("bytes of text in the piece (token length)")
    ax.set_ylabel(f"bytes of the {event} (what TLS shows)")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return ax


def refusal_times(rows: Sequence[Mapping[str, Any]], *, ax: Any = None,
                  title: str = "How long each refusal took (ms, log scale)") -> Any:
    """One bar per hostile request: the time to its refusal, coloured by the answer's kind, its answer written on it."""
    ax = _axes(ax, 1.0 + 0.27 * len(rows))
    values = [max(r["ms to refuse"], 0.01) for r in rows]
    colors = [ORANGE if (r["answer"] or 0) >= 1000 else BLUE for r in rows]
    _hbars(ax, range(len(rows)), values, height=0.7, colors=colors,
           labels=[f"{r['answer']}, {r['ms to refuse']:g} ms" for r in rows])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["what a stranger sends"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.margins(x=0.25)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("milliseconds from the last byte sent to the refusal")
    ax.set_ylabel("what a stranger sends")
    _legend(ax, handles=[Patch(color=BLUE, label="HTTP status"), Patch(color=ORANGE, label="WebSocket close code")])
    ax.set_title(title)
    return ax


def first_text_by_readers(rows: Sequence[Mapping[str, Any]], *, idle: float | None = None, ax: Any = None,
                          title: str = "Time to first text as readers arrive at once") -> Any:
    """Median and worst time to first text of the readers served, per number of simultaneous readers."""
    import pandas as pd

    ax = _axes(ax, 3.6)
    table = pd.DataFrame(rows)
    served = table[table["status"] == 200]
    for i, (server, group) in enumerate(served.groupby("server", sort=False)):
        stats = group.groupby("readers")["first text (s)"].agg(["median", "max"])
        color = color_of(server, i)
        ax.plot(stats.index, stats["median"], marker="o", color=color, label=f"{server}: median")
        ax.plot(stats.index, stats["max"], marker="^", linestyle="--", color=color, label=f"{server}: worst")
    if idle is not None:
        ax.axhline(2 * idle, color=GREY, linestyle=":", label="2x an idle server")
    xs = sorted(set(served["readers"]))
    ax.set_xticks(xs)
    ax.set_xlabel("readers asking at the same moment")
    ax.set_ylabel("first text (s), readers served")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return ax


def format_costs(rows: Sequence[Mapping[str, Any]], *, ax: Any = None, title: str | None = None) -> Any:
    """Per format, a bar of the bytes on the wire split into the text itself and everything around it."""
    ax = _axes(ax, 1.2 + 0.55 * len(rows))
    title = title or f"The same answer, {len(rows)} formats: bytes on the wire"
    labels = [r["format"] for r in rows][::-1]
    text = [r["text bytes"] for r in rows][::-1]
    framing = [r["bytes on the wire"] - r["text bytes"] for r in rows][::-1]
    ax.barh(labels, text, color=COLOR_OF["text bytes"], label="text")
    bars = ax.barh(labels, framing, left=text, color=COLOR_OF["framing"],
                   label="framing (JSON, event names,\nids, chunk sizes, head)")
    ax.bar_label(bars, labels=[f"{r['bytes on the wire']:,} bytes, {r['bytes per text byte']}x the text"
                               for r in rows[::-1]], padding=3, fontsize=8)
    ax.set_xlim(0, max(r["bytes on the wire"] for r in rows) * 1.55)
    ax.set_xlabel("bytes received for one answer")
    ax.set_ylabel("format")
    _legend(ax)
    ax.set_title(title)
    return ax


def first_text_raw_vs_library(rows: Sequence[Mapping[str, Any]], *, ax: Any = None,
                              title: str = "Time to the first text: raw socket vs the format's own client") -> Any:
    """Per format, paired bars: first text on a raw socket, and first text the client library handed over."""
    ax = _axes(ax, 1.2 + 0.6 * len(rows))
    raw = [(r["first text (s)"] or 0) * 1000 for r in rows]
    lib = [(r["library: first text (s)"] or 0) * 1000 for r in rows]
    for i, r in enumerate(rows):
        color = color_of(r["format"], i)
        _hbars(ax, [i - 0.19], [raw[i]], height=0.36, colors=color, labels=[f"{raw[i]:.0f} ms raw"])
        _hbars(ax, [i + 0.19], [lib[i]], height=0.36, colors=color, alpha=0.45, hatch="//", edgecolor="white",
               labels=[f"{lib[i]:.0f} ms via {r['client library']}"])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["format"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max([*raw, *lib, 1]) * 1.6)
    ax.set_xlabel("first text (ms)")
    ax.set_ylabel("format")
    _legend(ax, handles=[Patch(color=GREY, label="raw socket\n(streamlab.client.timed)"),
                         Patch(facecolor=GREY, alpha=0.45, hatch="//", edgecolor="white",
                               label="the format's own\nclient library")])
    ax.set_title(title)
    return ax


def truncated_reads(rows: Sequence[Mapping[str, Any]], *, whole_chars: int | None = None, ax: Any = None,
                    title: str = "A stream cut cleanly: what each reader got, and whether it was told") -> Any:
    """One bar per reader: the characters it handed over, red when nothing said the answer was cut."""
    ax = _axes(ax, 1.2 + 0.36 * len(rows))
    labels = [f"{r['reader']}  [{r['format']}]" + ("  behind a relay" if "relay" in r.get("path", "") else "")
              for r in rows]
    values = [r["text received (chars)"] for r in rows]
    told = [r["the reader said it was cut"] for r in rows]
    _hbars(ax, range(len(rows)), values, height=0.7, colors=[GREEN if t else VERMILLION for t in told],
           labels=[f"{v} chars, {'told: cut' if t else 'silent'}" for v, t in zip(values, told)])
    handles = [Patch(color=VERMILLION, label="silent: no exception,\nno flag"), Patch(color=GREEN, label="the reader said\nit was cut")]
    if whole_chars:
        handles.append(ax.axvline(whole_chars, label=f"the whole answer: {whole_chars} chars", **THRESHOLD_STYLE))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max([*values, whole_chars or 0]) * 1.45)
    ax.set_xlabel("characters handed to the program")
    ax.set_ylabel("reader [format]")
    _legend(ax, handles=handles)
    ax.set_title(title)
    return ax


def upstream_after_leaving(rows: Sequence[Mapping[str, Any]], *, leave_after: int, ax: Any = None,
                           title: str = "Tokens the upstream generated for a client who left") -> Any:
    """One bar per path: tokens generated upstream, against what the client read and what it asked for."""
    ax = _axes(ax, 1.4 + 0.45 * len(rows))
    values = [r["upstream generated"] or 0 for r in rows]
    asked = max(r["asked for"] for r in rows)
    _hbars(ax, range(len(rows)), values, height=0.65, colors=[color_of(r["path"], i) for i, r in enumerate(rows)],
           labels=[str(v) for v in values])
    ax.axvline(leave_after, label=f"the client read {leave_after}\npieces and left", **THRESHOLD_STYLE)
    ax.axvline(asked, color=GREY, linestyle=":", linewidth=1.2, label=f"it asked for {asked}")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["path"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, asked * 1.25)
    ax.set_xlabel("tokens generated upstream")
    ax.set_ylabel("path")
    _legend(ax)
    ax.set_title(title)
    return ax


def stop_reasons(counts: Mapping[str, int], *, ax: Any = None,
                 title: str = "How each stream ended, as stored") -> Any:
    """One bar per stop reason: how many stored answers ended that way."""
    ax = _axes(ax, 1.0 + 0.38 * len(counts))
    names = list(counts)
    _hbars(ax, range(len(names)), [counts[n] for n in names], height=0.65, colors=[PALETTE[i % len(PALETTE)]
                                                                                   for i in range(len(names))],
           labels=[str(counts[n]) for n in names])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlim(0, max([*counts.values(), 1]) * 1.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("stored answers")
    ax.set_ylabel("stop reason")
    ax.set_title(title)
    return ax


# -- lines over concurrency and time (chapter 11) ---------------------------------------------------


def by_concurrency(rows: Sequence[Mapping[str, Any]], y: str, *, group: str = "engine", x: str = "readers",
                   xlabel: str = "readers at once", ylabel: str | None = None, threshold: float | None = None,
                   legend: bool = True, ax: Any = None, title: str = "") -> Any:
    """One line per group (e.g. engine) of column ``y`` against ``x`` (e.g. readers at once)."""
    ax = _axes(ax, 3.5)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(str(r[group]), []).append(r)
    for i, (name, members) in enumerate(groups.items()):
        members = sorted(members, key=lambda r: r[x])
        ax.plot([r[x] for r in members], [r[y] for r in members], marker="o", color=color_of(name, i), label=name)
    if threshold is not None:
        ax.axhline(threshold, label=f"a reader notices: {threshold:g}", **THRESHOLD_STYLE)
    ax.set_xscale("log", base=2)
    xs = sorted({r[x] for r in rows})
    ax.set_xticks(xs)
    ax.set_xticklabels([str(v) for v in xs])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel or y)
    if legend or threshold is not None:
        ax.legend(loc="best")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return ax


def backpressure_timeline(series: Mapping[str, Mapping[str, Sequence[float]]], *, axes: Any = None,
                          title: str = "A reader at 1 KB/s: what the server makes, holds and sends") -> Any:
    """Per policy over time, one panel each: tokens made against pieces read, pieces queued, bytes held in buffers."""
    if axes is None:
        _, axes = figure(3, 1, height=7.5)
    made, queued, held = axes
    for i, (policy, s) in enumerate(series.items()):
        color = color_of(policy, i)
        made.plot(s["t"], s["tokens"], color=color, label=f"{policy}: made")
        made.plot(s["t"], s["read_pieces"], color=color, linestyle=":", label=f"{policy}: read")
        queued.plot(s["t"], s["queued"], color=color, label=policy)
        buffered = [(a or 0) / 1024 + (b or 0) / 1024 for a, b in zip(s["transport_bytes"], s["kernel_bytes"])]
        held.plot(s["t"], buffered, color=color, label=policy)
    made.set_ylabel("tokens made /\npieces read")
    queued.set_ylabel("pieces queued")
    held.set_ylabel("KiB in asyncio +\nkernel buffers")
    for ax in axes:
        ax.set_xlabel("seconds since the reader connected")
        ax.grid(alpha=0.3)
    made.legend(loc="upper left", ncol=2)
    queued.legend(loc="upper left")
    made.figure.suptitle(title, fontweight="bold")
    return axes


# -- end of the chapters' figures ---------------------------------------------------------------------
