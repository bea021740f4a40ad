"""The chapters' figures: arrival timelines, gap charts, generated-vs-delivered bars.

Each function draws on a matplotlib Axes (made if not given) and returns it, so
a chapter can place several on one figure or show one alone.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def _axes(ax: Any, figsize: tuple[float, float]) -> Any:
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def timeline(rows: Mapping[str, Any], *, ax: Any = None, title: str = "When each piece of text arrived") -> Any:
    """One row per way of delivering: a tick at each text arrival, a bar up to the end.

    ``rows`` maps a label to a Trace (anything with ``events``, ``first_text`` and ``end``).
    """
    ax = _axes(ax, (9, 1.0 + 0.7 * len(rows)))
    for i, (label, trace) in enumerate(rows.items()):
        y = len(rows) - 1 - i
        color = COLORS[i % len(COLORS)]
        times = [e.t for e in trace.events if e.kind == "text" and e.text]
        ax.hlines(y, 0, trace.end, color=color, alpha=0.25, linewidth=8)
        ax.vlines(times, y - 0.3, y + 0.3, color=color, linewidth=1)
        if times:
            ax.plot([times[0]], [y], marker="o", color=color, markersize=7)
            ax.annotate(f"first text {times[0]:.2f} s", (times[0], y + 0.32), fontsize=8, color=color)
        ax.annotate(f"end {trace.end:.2f} s", (trace.end, y - 0.45), fontsize=8, ha="right", color=color)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(rows)[::-1])
    ax.set_ylim(-0.8, len(rows) - 0.2)
    ax.set_xlabel("seconds after the request was sent")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return ax


def gap_chart(
    gaps_by_label: Mapping[str, Sequence[float]],
    *,
    threshold: float | None = None,
    threshold_label: str = "reader's pace",
    ax: Any = None,
    title: str = "Silences between pieces",
) -> Any:
    """Each gap as a dot (ms), one column per label, with an optional threshold line."""
    ax = _axes(ax, (8, 4))
    for i, (label, values) in enumerate(gaps_by_label.items()):
        xs = [i + (j % 9 - 4) * 0.03 for j in range(len(values))]
        ax.scatter(xs, [v * 1000 for v in values], s=10, alpha=0.6, color=COLORS[i % len(COLORS)])
    if threshold is not None:
        ax.axhline(threshold * 1000, color="black", linestyle="--", linewidth=1)
        ax.annotate(f"{threshold_label}: {threshold * 1000:.0f} ms", (len(gaps_by_label) - 0.5, threshold * 1000),
                    ha="right", va="bottom", fontsize=9)
    ax.set_xticks(range(len(gaps_by_label)))
    ax.set_xticklabels(list(gaps_by_label))
    ax.set_ylabel("gap between pieces (ms)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return ax


def generated_vs_delivered(rows: Sequence[Mapping[str, Any]], *, ax: Any = None,
                           title: str = "Tokens generated vs delivered") -> Any:
    """Paired bars per case: what the model computed, and what reached the reader."""
    ax = _axes(ax, (9, 4))
    labels = [r["case"] for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["generated"] for r in rows], width=0.4, label="generated", color=COLORS[3])
    ax.bar([x + 0.2 for x in xs], [r["delivered"] for r in rows], width=0.4, label="delivered", color=COLORS[2])
    for x, r in zip(xs, rows):
        ax.annotate(str(r["generated"]), (x - 0.2, r["generated"]), ha="center", va="bottom", fontsize=8)
        ax.annotate(str(r["delivered"]), (x + 0.2, r["delivered"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=15, ha="right")
    ax.set_ylabel("tokens")
    ax.set_title(title)
    ax.legend()
    return ax


def refusal_times(rows: Sequence[Mapping[str, Any]], *, ax: Any = None,
                  title: str = "How long each refusal took (ms, log scale)") -> Any:
    """One bar per hostile request: the time to its refusal, coloured by the answer's kind."""
    ax = _axes(ax, (9, 0.8 + 0.28 * len(rows)))
    labels = [f"{r['what a stranger sends']}  →  {r['answer']}" for r in rows]
    values = [max(r["ms to refuse"], 0.01) for r in rows]
    colors = [COLORS[1] if (r["answer"] or 0) >= 1000 else COLORS[0] for r in rows]
    ax.barh(range(len(rows))[::-1], values, color=colors)
    ax.set_yticks(range(len(rows))[::-1])
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds from the last byte sent to the refusal (blue: HTTP status, orange: WebSocket close)")
    ax.set_title(title)
    return ax


def stall_gaps(stalls: Sequence[Any], *, ax: Any = None,
               title: str = "Another reader's gaps while a long prompt is read") -> Any:
    """For each server, the reader's gap before each piece over time, the long prompt's reading shaded."""
    ax = _axes(ax, (9, 3.5))
    for i, stall in enumerate(stalls):
        color = COLORS[i % len(COLORS)]
        points = stall.gaps_during()
        ax.plot([t for t, _ in points], [g for _, g in points], marker=".", linewidth=1, color=color, label=stall.server)
        end = stall.long_first_text or stall.long_end
        if end is not None:
            ax.axvspan(stall.long_sent, end, color=color, alpha=0.12)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the reader asked (shaded: the long prompt being read)")
    ax.set_ylabel("gap before the piece (s)")
    ax.legend(fontsize=8)
    ax.set_title(title)
    return ax


def first_text_by_readers(rows: Sequence[Mapping[str, Any]], *, idle: float | None = None, ax: Any = None,
                          title: str = "Time to first text as readers arrive at once") -> Any:
    """Median and worst time to first text of the readers served, per number of simultaneous readers."""
    import pandas as pd

    ax = _axes(ax, (8, 3.5))
    table = pd.DataFrame(rows)
    served = table[table["status"] == 200]
    for i, (server, group) in enumerate(served.groupby("server", sort=False)):
        stats = group.groupby("readers")["first text (s)"].agg(["median", "max"])
        color = COLORS[i % len(COLORS)]
        ax.plot(stats.index, stats["median"], marker="o", color=color, label=f"{server}: median")
        ax.plot(stats.index, stats["max"], marker="^", linestyle="--", color=color, label=f"{server}: worst")
    if idle is not None:
        ax.axhline(2 * idle, color="grey", linestyle=":", label="2x an idle server")
    ax.set_xlabel("readers asking at the same moment")
    ax.set_ylabel("first text (s), readers served")
    ax.legend(fontsize=8)
    ax.set_title(title)
    return ax


def format_costs(rows: Sequence[Mapping[str, Any]], *, ax: Any = None,
                 title: str = "The same answer, three formats: bytes on the wire") -> Any:
    """Per format, a bar of the bytes on the wire split into the text itself and everything around it."""
    ax = _axes(ax, (8, 0.9 + 0.6 * len(rows)))
    labels = [r["format"] for r in rows][::-1]
    text = [r["text bytes"] for r in rows][::-1]
    framing = [r["bytes on the wire"] - r["text bytes"] for r in rows][::-1]
    ax.barh(labels, text, color=COLORS[2], label="text")
    ax.barh(labels, framing, left=text, color="#bbbbbb", label="framing: JSON, event names, ids, chunk sizes, head")
    for y, r in enumerate(rows[::-1]):
        ax.annotate(f"  {r['bytes on the wire']:,} bytes, {r['bytes per text byte']}x the text",
                    (r["bytes on the wire"], y), va="center", fontsize=9)
    ax.set_xlim(0, max(r["bytes on the wire"] for r in rows) * 1.6)
    ax.set_xlabel("bytes received for one answer")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title)
    return ax


def first_text_raw_vs_library(rows: Sequence[Mapping[str, Any]], *, ax: Any = None,
                              title: str = "Time to the first text: raw socket vs the format's own client") -> Any:
    """Per format, paired bars: first text on a raw socket, and first text the client library handed over."""
    ax = _axes(ax, (8, 3.2))
    xs = range(len(rows))
    raw = [(r["first text (s)"] or 0) * 1000 for r in rows]
    lib = [(r["library: first text (s)"] or 0) * 1000 for r in rows]
    ax.bar([x - 0.2 for x in xs], raw, width=0.4, color=COLORS[0], label="raw socket (streamlab.client)")
    ax.bar([x + 0.2 for x in xs], lib, width=0.4, color=COLORS[1], label="client library")
    for x, a, b in zip(xs, raw, lib):
        ax.annotate(f"{a:.0f}", (x - 0.2, a), ha="center", va="bottom", fontsize=8)
        ax.annotate(f"{b:.0f}", (x + 0.2, b), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r['format']}\n({r['client library']})" for r in rows], fontsize=9)
    ax.set_ylabel("first text (ms)")
    ax.set_ylim(0, max([*raw, *lib, 1]) * 1.35)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax.set_title(title)
    return ax


def truncated_reads(rows: Sequence[Mapping[str, Any]], *, whole_chars: int | None = None, ax: Any = None,
                    title: str = "A stream cut cleanly: what each reader got, and whether it was told") -> Any:
    """One bar per reader: the characters it handed over, red when nothing said the answer was cut."""
    ax = _axes(ax, (9, 0.9 + 0.4 * len(rows)))
    labels = [f"{r['reader']}  [{r['format']}]" + ("  behind a relay" if "relay" in r.get("path", "") else "")
              for r in rows][::-1]
    values = [r["text received (chars)"] for r in rows][::-1]
    told = [r["the reader said it was cut"] for r in rows][::-1]
    ax.barh(range(len(rows)), values, color=[COLORS[2] if t else COLORS[3] for t in told])
    for y, (v, t) in enumerate(zip(values, told)):
        ax.annotate(f" {v} chars, {'told: cut' if t else 'silent'}", (v, y), va="center", fontsize=8)
    if whole_chars:
        ax.axvline(whole_chars, color="black", linestyle="--", linewidth=1)
        ax.annotate(f"the whole answer: {whole_chars} chars", (whole_chars, len(rows) - 0.5), ha="right",
                    va="bottom", fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, max([*values, whole_chars or 0]) * 1.35)
    ax.set_xlabel("characters handed to the program (red: no exception, no flag; green: the reader said it was cut)")
    ax.set_title(title)
    return ax


def upstream_after_leaving(rows: Sequence[Mapping[str, Any]], *, leave_after: int, ax: Any = None,
                           title: str = "Tokens the upstream generated for a client who left") -> Any:
    """One bar per path: tokens generated upstream, against what the client read and what it asked for."""
    ax = _axes(ax, (8, 3.5))
    labels = [r["path"] for r in rows]
    values = [r["upstream generated"] or 0 for r in rows]
    asked = max(r["asked for"] for r in rows)
    colors = [COLORS[3] if v > leave_after + 2 else COLORS[2] for v in values]
    ax.bar(range(len(rows)), values, color=colors)
    for x, v in enumerate(values):
        ax.annotate(str(v), (x, v), ha="center", va="bottom", fontsize=9)
    ax.axhline(leave_after, color="black", linestyle="--", linewidth=1,
               label=f"the client read {leave_after} pieces and left")
    ax.axhline(asked, color="grey", linestyle=":", linewidth=1, label=f"it asked for {asked}")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=10, fontsize=9)
    ax.set_ylim(0, asked * 1.3)
    ax.set_ylabel("tokens generated upstream")
    ax.set_title(title)
    return ax


# -- chapter 11: serving many readers ----------------------------------------------------------

READING_THRESHOLD = 0.2  # seconds: a gap between pieces longer than ~180-220 ms is one a reader notices


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
) -> Any:
    """The distribution of gaps (seconds) per label as an ECDF, the threshold drawn, the share above it in the legend.

    Read it as: at x, the line's height is the share of gaps no longer than x. A
    line that reaches 100% left of the threshold is a stream no reader notices.
    """
    ax = _axes(ax, (8, 4))
    for i, (label, values) in enumerate(gaps_by_label.items()):
        data = sorted(v * 1000 for v in values)
        if not data:
            continue
        ys = [(k + 1) / len(data) * 100 for k in range(len(data))]
        name = f"{label} ({share_above(values, threshold):.0%} above)" if threshold is not None else label
        ax.step(data, ys, where="post", color=COLORS[i % len(COLORS)], label=name)
    if threshold is not None:
        ax.axvline(threshold * 1000, color="black", linestyle="--", linewidth=1)
        ax.annotate(f"{threshold_label}: {threshold * 1000:.0f} ms", (threshold * 1000, 97), rotation=90,
                    ha="right", va="top", fontsize=8)
    if schedule is not None:
        ax.axvline(schedule * 1000, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"schedule: {schedule * 1000:.0f} ms", (schedule * 1000, 50), rotation=90, ha="right",
                    va="center", fontsize=8, color="grey")
    if log:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        # Between the powers of ten, label the 2s and 5s only (20, 50, 200...): readable, never crowded.
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    ax.set_xlabel("gap between pieces (ms)")
    ax.set_ylabel("share of gaps at most this long (%)")
    ax.set_ylim(0, 101)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return ax


def paired_bars(rows: Sequence[Mapping[str, Any]], label: str, values: Sequence[str], *, units: str = "",
                ax: Any = None, title: str = "") -> Any:
    """Horizontal bars, one group per row, one bar per value column, each bar labelled with its value."""
    ax = _axes(ax, (8, 0.8 + 0.55 * len(rows) * len(values)))
    height = 0.8 / len(values)
    for j, column in enumerate(values):
        ys = [i + j * height for i in range(len(rows))]
        xs = [float(r[column]) for r in rows]
        bars = ax.barh(ys, xs, height=height * 0.9, color=COLORS[j % len(COLORS)], label=column)
        ax.bar_label(bars, labels=[f"{x:.3g}" for x in xs], padding=3, fontsize=8)
    ax.set_yticks([i + height * (len(values) - 1) / 2 for i in range(len(rows))])
    ax.set_yticklabels([str(r[label]) for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(units)
    ax.margins(x=0.15)
    if len(values) > 1:
        ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title)
    return ax


def by_concurrency(rows: Sequence[Mapping[str, Any]], y: str, *, group: str = "engine", x: str = "readers",
                   ylabel: str | None = None, threshold: float | None = None, ax: Any = None, title: str = "") -> Any:
    """One line per group (e.g. engine) of column ``y`` against ``x`` (e.g. readers at once)."""
    ax = _axes(ax, (6, 3.5))
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(str(r[group]), []).append(r)
    for i, (name, members) in enumerate(groups.items()):
        members = sorted(members, key=lambda r: r[x])
        ax.plot([r[x] for r in members], [r[y] for r in members], marker="o", color=COLORS[i % len(COLORS)], label=name)
    if threshold is not None:
        ax.axhline(threshold, color="black", linestyle="--", linewidth=1, label=f"a reader notices: {threshold:g}")
    ax.set_xscale("log", base=2)
    xs = sorted({r[x] for r in rows})
    ax.set_xticks(xs)
    ax.set_xticklabels([str(v) for v in xs])
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or y)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return ax


def backpressure_timeline(series: Mapping[str, Mapping[str, Sequence[float]]], *, axes: Any = None,
                          title: str = "A reader at 1 KB/s: what the server makes, holds and sends") -> Any:
    """Per policy over time: tokens made against pieces read, pieces queued, bytes held in socket buffers."""
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    made, queued, held = axes
    for i, (policy, s) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        made.plot(s["t"], s["tokens"], color=color, label=f"{policy}: made")
        made.plot(s["t"], s["read_pieces"], color=color, linestyle=":", label=f"{policy}: read")
        queued.plot(s["t"], s["queued"], color=color, label=policy)
        buffered = [(a or 0) / 1024 + (b or 0) / 1024 for a, b in zip(s["transport_bytes"], s["kernel_bytes"])]
        held.plot(s["t"], buffered, color=color, label=policy)
    made.set_ylabel("tokens made / pieces read")
    queued.set_ylabel("pieces queued, not yet taken")
    held.set_ylabel("KiB in asyncio + kernel send buffers")
    for ax in axes:
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
    made.legend(fontsize=7)
    queued.legend(fontsize=7)
    made.figure.suptitle(title)
    made.figure.tight_layout()
    return axes
