"""Charts of chapters 11 to 13, each drawn to say one thing, in the book's one style (``streamlab.book.style``).

    load_panels(rows)                  chapter 11: first text, time per token and throughput against readers at once
    token_budget_bars(budget)          chapter 11: one token's time taken apart, llama.cpp's step beside it
    backpressure_panels(series)        chapter 11: a slow reader under each policy: made, queued, held in buffers
    hop_timeline(traces)               chapter 12: each hop's stream, its first text and its end written beside it
    kill_panels(readers, ...)          chapter 13: a reader through a kill, one panel per source, each on its own clock

What they fix against the charts they replace: every axis starts where its
quantity does (0) and says its unit, the threshold included; a legend names
things in words, on every panel that needs one; lines that would lie on top
of each other are drawn once and said so; labels have a column of their own
instead of the space between two rows; and two things measured on different
clocks get a panel each. ``tests/test_late_plots.py`` renders each at the
notebook's width and checks that nothing overlaps.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from matplotlib.ticker import FuncFormatter, NullFormatter

from streamlab.book.plots import _stream_rows
from streamlab.book.replica_plots import received_through_a_kill
from streamlab.book.style import GREY, THRESHOLD_STYLE, _axes, _seconds, _threshold_legend_name, color_of, figure
from streamlab.client.metrics import READING_THRESHOLD

__all__ = ["backpressure_panels", "hop_timeline", "kill_panels", "load_panels", "token_budget_bars"]


def _readers_axis(ax: Any, xs: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([str(v) for v in xs])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("readers at once")
    ax.grid(alpha=0.3)


def load_panels(rows: Sequence[Mapping[str, Any]], *, threshold: float = READING_THRESHOLD, group: str = "engine",
                title: str = "Threads against the batched engine, by readers at once") -> Any:
    """Three panels against readers at once: first text (s), each reader's time per token (ms), tokens/s in all.

    ``rows``: one per (``group``, readers) with ``ttft_p50_s``, ``tpot_p50_s``
    and ``tokens_per_s`` (``load.measure``'s ``data["rows"]``, flattened).
    Every axis starts at 0; the threshold is drawn, in milliseconds, where the
    time per token is.
    """
    fig, axes = figure(1, 3, height=3.8)
    panels = (("ttft_p50_s", 1.0, "first text, median (s)", "Time to the first text"),
              ("tpot_p50_s", 1000.0, "time per token, median (ms)", "Each reader's time per token"),
              ("tokens_per_s", 1.0, "tokens/s, all readers together", "Throughput"))
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row[group]), []).append(row)
    xs = sorted({int(r["readers"]) for r in rows})
    for ax, (key, scale, ylabel, name) in zip(axes, panels):
        for i, (label, members) in enumerate(groups.items()):
            members = sorted(members, key=lambda r: r["readers"])
            ax.plot([r["readers"] for r in members], [r[key] * scale for r in members], marker="o",
                    color=color_of(label, i), label=label)
        if key == "tpot_p50_s":
            ax.axhline(threshold * 1000, label=_threshold_legend_name(threshold, "a reader notices"), **THRESHOLD_STYLE)
        _readers_axis(ax, xs)
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.3)  # room above the lines for the legend
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(title, fontweight="bold")
    return axes


def backpressure_panels(series: Mapping[str, Mapping[str, Sequence[float]]], *,
                        names: Mapping[str, str] | None = None,
                        title: str = "A reader at 1 KB/s: what the server makes, queues and holds") -> Any:
    """Per policy over time, three panels: tokens made, pieces queued, KiB held in asyncio's and the kernel's buffers.

    ``series``: policy -> ``t``, ``tokens``, ``read_pieces``, ``queued``,
    ``transport_bytes``, ``kernel_bytes`` (``backpressure.report``'s). The
    reader takes the same few pieces whatever the policy, so its line is drawn
    once, in grey, on a scale that is linear up to 10 and logarithmic above, so
    that a few pieces and thousands of tokens both show. ``names`` gives each policy
    the words its legend says (the policy's own name otherwise).
    """
    names = names or {}
    _, axes = figure(3, 1, height=8.0)
    made, queued, held = axes
    longest = max(series.values(), key=lambda s: s["t"][-1] if s["t"] else 0, default=None)
    for i, (policy, s) in enumerate(series.items()):
        color, label = color_of(policy, i), names.get(policy, policy)
        made.plot(s["t"], s["tokens"], color=color, label=label)
        queued.plot(s["t"], s["queued"], color=color, label=label)
        kib = [((a or 0) + (b or 0)) / 1024 for a, b in zip(s["transport_bytes"], s["kernel_bytes"])]
        held.plot(s["t"], kib, color=color, label=label)
    if longest is not None:
        made.plot(longest["t"], longest["read_pieces"], color=GREY, linestyle=":", linewidth=1.8,
                  label="pieces the reader took (the same few under every policy)")
    for ax, ylabel, name in ((made, "tokens made\n(log scale above 10)", "What the source made, against what the reader took"),
                             (queued, "pieces queued", "What waited in the generation's queue"),
                             (held, "KiB in asyncio's and\nthe kernel's buffers", "What the sockets' buffers held")):
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.set_xlabel("seconds since the reader connected")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1) * 1.15)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    # Thousands made against a few read: on a linear axis the reader's line lies on the axis itself.
    made.set_yscale("symlog", linthresh=10)
    made.set_ylim(bottom=0, top=max((max(s["tokens"] or [1]) for s in series.values()), default=1) * 4)
    made.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    made.legend(loc="center right", fontsize=8)  # between the thousands made and the few read
    made.figure.suptitle(title, fontweight="bold")
    return axes


def hop_timeline(rows: Mapping[str, Any], *, ax: Any = None, title: str = "When each piece of text arrived",
                 ylabel: str = "path") -> Any:
    """One row per path: a tick at each text event, a bar to the end, and the times in a column of their own.

    ``rows`` maps a label to a Trace (``events``, ``end``). Each row's
    first text and end are written to the right of every bar, one line per
    row, so no row's label can run into the next one's.
    """
    ax = _axes(ax, 1.0 + 0.42 * len(rows))
    span, drawn = _stream_rows(ax, rows)  # the rows as plots.timeline draws them; only the labels differ
    for y, color, times, end in drawn:
        if not times:
            said = f"no text, end {_seconds(end)}"
        elif abs(end - times[0]) < 0.02 * span:
            said = f"first text = end: {_seconds(times[0])}"
        else:
            said = f"first text {_seconds(times[0])}, end {_seconds(end)}"
        ax.annotate(said, (span * 1.03, y), fontsize=8, color=color, va="center", ha="left")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(rows)[::-1])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlim(0, span * 1.55)
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= span * 1.02])
    ax.set_xlabel("seconds after the request was sent")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return ax


def kill_panels(readers: Mapping[str, Sequence[tuple[float, int, int]]], *, killed_at: Mapping[str, float],
                answer_events: Mapping[str, int | None], notes: Mapping[str, str] | None = None,
                titles: Mapping[str, str] | None = None,
                title: str = "Text events received, with the server under the reader killed") -> Any:
    """One panel per reader (``replica_plots.received_through_a_kill``), each on its own time axis.

    Readers whose sources run at different paces (a model, a scripted
    replica) are not drawn on one clock: each panel is titled with what fed
    its reader, and says its own whole answer.
    """
    _, axes = figure(len(readers), 1, height=3.2 * len(readers))
    axes = list(axes) if len(readers) > 1 else [axes]
    for ax, (label, rows) in zip(axes, readers.items()):
        received_through_a_kill({label: rows}, killed_at={label: killed_at[label]} if label in killed_at else {},
                                answer_events=answer_events.get(label),
                                notes={label: notes[label]} if notes and label in notes else None, ax=ax,
                                title=(titles or {}).get(label, label))
        legend = ax.get_legend()
        if legend is not None:
            legend.remove()  # the panel's title names its reader
        if notes and label in notes:  # room after the line's end for what became of the reader
            ax.set_xlim(0, ax.get_xlim()[1] * 1.35)
    axes[0].figure.suptitle(title, fontweight="bold")
    return axes


def token_budget_bars(budget: Mapping[str, Any], *, title: str = "Where one token's time goes") -> Any:
    """One bar of a token's step, its parts end to end (ms); llama.cpp's whole step as a bar below where measured.

    ``budget``: :func:`streamlab.lab.experiments.budget.token_budget`'s result.
    The parts' names are a legend of their own, outside the bars (most of
    them are a sliver of the model's step); the socket's way, beside the next
    step rather than in it, is not drawn.
    """
    fig, ax = figure(1, 1, height=2.4)
    bars = ["streamlab (Generation)"]
    left = 0.0
    for i, row in enumerate(budget["rows"]):
        ax.barh(0, row["ms a token"], left=left, color=color_of(row["part"], i), edgecolor="white",
                label=f"{row['part']}: {row['ms a token']:.2f} ms")
        left += row["ms a token"]
    theirs = [row for row in budget.get("beside", ()) if row["part"].startswith("llama.cpp")]
    if theirs:
        bars.append("llama.cpp (its server)")
        ax.barh(1, theirs[0]["ms a token"], color=GREY, label=f"llama.cpp's step: {theirs[0]['ms a token']:.2f} ms")
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels(bars)
    ax.invert_yaxis()
    ax.set_xlim(0, max([left, *(row["ms a token"] for row in theirs)]) * 1.05)
    ax.set_xlabel("milliseconds a token")
    ax.set_ylabel("who made it")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    return fig
