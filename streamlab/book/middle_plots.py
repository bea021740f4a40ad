"""Two figures of chapters 7 and 9, in the book's one style (``streamlab.book.style``).

- ``crash_writes``: chapter 7's killed answer, the text the model had made
  against the text the database held, up to the ``kill -9``: the gap between
  the two lines at the kill is what the crash lost.
- ``stall_panels``: chapter 9's reader already streaming while a long prompt
  is read, one panel per server, each with its own prompt's reading shaded
  and named (on one axes the two servers' spans lay on top of each other).

``tests/test_prose_middle.py`` renders both at the notebook's width and checks
that no label overlaps another.
"""

from __future__ import annotations

from typing import Any, Sequence

from matplotlib.ticker import FuncFormatter

from streamlab.book.style import GREY, THRESHOLD_STYLE, VERMILLION, _legend, color_of, figure
from streamlab.client.metrics import READING_THRESHOLD

__all__ = ["crash_writes", "stall_panels"]

_FLOOR_S = 0.001  # a gap shorter than this (pieces read together) is drawn at it, on the log axis


def crash_writes(samples: Sequence[Any], killed_at: float, kept_chars: int, *, ax: Any = None,
                 title: str = "The killed answer: text made against text on disk") -> Any:
    """Characters the model had made and characters the database held, over time, to the kill and after.

    ``samples`` are ``crash_loss.Sample``s; ``kept_chars`` is the length of
    the text the restarted server recovered, drawn after the kill.
    """
    if ax is None:
        _, ax = figure(1, 1, height=3.4)
    start = samples[0].t
    kill = killed_at - start
    # What the model had made is known where it was looked at (the dots); each write is known exactly, by the row's
    # own time, so the database's line steps where the writes were, not where the looks were.
    ax.step([*(s.t - start for s in samples), kill], [*(s.made_chars for s in samples), samples[-1].made_chars],
            where="post", color=GREY, linewidth=1.4, marker=".", markersize=4, label="made by the model (looked at)")
    writes = sorted({(max(s.written - start, 0.0), s.stored_chars) for s in samples if s.written is not None})
    ax.step([0.0, *(t for t, _ in writes), kill], [0, *(c for _, c in writes), writes[-1][1] if writes else 0],
            where="post", color=color_of("/stream"), linewidth=2.2, label="written to the database")
    ax.axvline(kill, color=VERMILLION, linestyle="--", linewidth=1.4, label="kill -9")
    ax.plot([kill], [kept_chars], marker="o", color=VERMILLION, linestyle="none", label="kept after the restart")
    ax.set_xlabel("seconds since the watch began")
    ax.set_ylabel("characters of the answer")
    ax.set_ylim(bottom=0)
    _legend(ax)
    ax.set_title(title)
    return ax


def stall_panels(stalls: Sequence[Any], *, threshold: float | None = READING_THRESHOLD, axes: Any = None,
                 title: str = "Another reader's gaps while a long prompt is read") -> Any:
    """One panel per server: the reader's gap before each piece, its own long prompt's reading shaded and named."""
    if axes is None:
        fig, axes = figure(len(stalls), 1, height=1.2 + 2.0 * len(stalls), sharex=True, sharey=True)
        fig.suptitle(title, fontweight="bold")
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    for i, (ax, stall) in enumerate(zip(axes, stalls)):
        color = color_of(stall.server, i)
        points = stall.gaps_during()
        end = stall.long_first_text or stall.long_end
        if end is not None:
            ax.axvspan(stall.long_sent, end, color=color, alpha=0.15,
                       label=f"its long prompt being read\n({end - stall.long_sent:.1f} s)")
        # Pieces read together have a gap of ~0, which a log axis cannot place: they are drawn at 1 ms.
        ax.plot([t for t, _ in points], [max(g, _FLOOR_S) for _, g in points], marker=".", linewidth=1, color=color,
                label="the other reader's gaps")
        if threshold is not None:
            ax.axhline(threshold, label=f"a reader notices:\n{threshold * 1000:.0f} ms", **THRESHOLD_STYLE)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylabel("gap (s, log)")
        ax.set_ylim(bottom=_FLOOR_S / 2)
        ax.set_title(stall.server, loc="left", fontsize="medium")
        _legend(ax, fontsize="small")
    axes[-1].set_xlabel("seconds since the other reader asked (gaps under 1 ms drawn at 1 ms)")
    return axes
