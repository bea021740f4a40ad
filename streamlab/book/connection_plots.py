"""Chapter 14's chart: many event streams from one page, each one's wait for a connection and its answer.

One panel per path (an origin, a protocol), one row per stream: a thin line
while the stream waited for its response, a bar from its first event to its
end, a dot at the first event, and a dashed line where the first stream of
the panel ended. A stream that waited for a connection starts right of the
dashed line. Same style and width as ``streamlab.book.plots``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from streamlab.book.style import GREY, THRESHOLD_STYLE, _legend, _seconds, color_of, figure

__all__ = ["stream_slots"]


def _get(stream: Any, name: str) -> Any:
    return stream[name] if isinstance(stream, Mapping) else getattr(stream, name)


def stream_slots(paths: Mapping[str, Sequence[Any]], *, title: str = "Eight event streams from one page",
                 subtitles: Mapping[str, str] | None = None) -> Any:
    """``paths`` maps a label to its streams (``StreamTiming`` or their dicts): one panel each; returns the axes."""
    rows = max(len(streams) for streams in paths.values())
    fig, axes = figure(len(paths), 1, height=0.9 + (0.32 * rows + 0.55) * len(paths), sharex=True)
    axes = list(axes) if len(paths) > 1 else [axes]
    span = max(_get(s, "end") or 0 for streams in paths.values() for s in streams)
    for n, (ax, (label, streams)) in enumerate(zip(axes, paths.items())):
        color = color_of(label, n)
        ends = [_get(s, "end") for s in streams if _get(s, "end") is not None]
        for i, s in enumerate(streams):
            y = len(streams) - 1 - i
            opened, first, end = _get(s, "opened"), _get(s, "first_event"), _get(s, "end")
            ax.hlines(y, 0, first if first is not None else span, color=GREY, linewidth=1.2)
            if first is not None and end is not None:
                ax.hlines(y, first, end, color=color, linewidth=7, alpha=0.8)
                ax.plot([first], [y], marker="o", color=color, markersize=6)
                place = "left" if first < 0.5 * span else "right"
                x = end + 0.01 * span if place == "left" else first - 0.015 * span
                note = ax.annotate(f"first event {_seconds(first)}", (x, y), fontsize=7, va="center", color=color,
                                   ha=place)
                note.set_bbox({"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.9})  # over the lines
            elif opened is not None:
                ax.plot([opened], [y], marker="|", color=GREY)
        if ends:
            ax.axvline(min(ends), **THRESHOLD_STYLE)
        ax.set_yticks(range(len(streams)))
        ax.set_yticklabels([f"stream {_get(s, 'stream')}" for s in streams][::-1], fontsize=8)
        ax.set_ylim(-0.7, len(streams) - 0.3)
        ax.set_xlim(0, span * 1.02)
        ax.set_ylabel("stream")
        ax.set_title((subtitles or {}).get(label, label), fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("seconds after the page opened every stream")  # shared by every panel
    handles = [Line2D([], [], color=GREY, linewidth=1.2, label="waiting for its response"),
               Patch(color=color_of(next(iter(paths)), 0), alpha=0.8, label="first event to end"),
               Line2D([], [], label="the first stream's end", **THRESHOLD_STYLE)]
    _legend(axes[0], handles=handles, fontsize=8)
    fig.suptitle(title)
    return axes
