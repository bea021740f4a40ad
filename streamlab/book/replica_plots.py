"""Chapter 13's charts: what a reader received over time when the server under it, or Redis, was killed.

One line per reader: the text events it had received so far, against
seconds since it sent its request, a step up at each event. A marker where
each new connection began, a dashed line where the process was killed. A
reader that resumes climbs on to the answer's end after a flat gap (the
reconnect); a reader whose server kept everything alone stays flat.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from streamlab.book.style import THRESHOLD_STYLE, _axes, _legend, _seconds, color_of

__all__ = ["received_through_a_kill", "through_a_redis_outage"]


def received_through_a_kill(readers: Mapping[str, Sequence[tuple[float, int, int]]], *, killed_at: Mapping[str, float],
                            answer_events: int | None = None, notes: Mapping[str, str] | None = None,
                            ax: Any = None,
                            title: str = "Text events received, with the server under the reader killed") -> Any:
    """``readers``: label -> ``(seconds, events so far, connection)`` rows (``EventSourceRun.timeline()``).

    ``notes``: label -> what became of that reader, written where its line ends.
    """
    ax = _axes(ax, 3.8)
    for i, (label, rows) in enumerate(readers.items()):
        color = color_of(label, i)
        times = [0.0, *[t for t, _, _ in rows]]
        counts = [0, *[n for _, n, _ in rows]]
        ax.step(times, counts, where="post", color=color, linewidth=1.8, label=label)
        starts = [(t, n) for (t, n, c), prev in zip(rows, [None, *rows]) if prev is not None and c != prev[2]]
        for t, n in starts:
            ax.plot([t], [n], marker="o", color=color, markersize=6)
            ax.annotate(f"reconnected: +{_seconds(t - killed_at.get(label, t))}", (t, n), fontsize=8, color=color,
                        xytext=(6, -12), textcoords="offset points")
        if label in killed_at:
            ax.axvline(killed_at[label], **{**THRESHOLD_STYLE, "color": color, "alpha": 0.6})
        if notes and label in notes and rows:
            ax.annotate(notes[label], (rows[-1][0], rows[-1][1]), fontsize=8, color=color, xytext=(6, 4),
                        textcoords="offset points")
    if answer_events is not None:
        ax.axhline(answer_events, color="grey", linewidth=0.8, alpha=0.6)
        ax.annotate(f"the whole answer: {answer_events} events", (0, answer_events), fontsize=8, color="grey",
                    xytext=(2, 3), textcoords="offset points")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds after the reader's request (dashed: its server killed)")
    ax.set_ylabel("text events received")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax, fontsize=8)
    return ax


def through_a_redis_outage(outage: Mapping[str, Any], *, ax: Any = None) -> Any:
    """One answer's text events against seconds since Redis was killed (``failover.redis_outage``'s figures):
    before the kill, and read on with its ``Last-Event-ID`` once Redis is back; the outage shaded, the reader's
    error event and a new answer's first text marked."""
    ax = _axes(ax, 3.2)
    before, after = list(outage["before_s"]), list(outage["after_s"])
    ax.step(before, range(1, len(before) + 1), where="post", label="the reader, before the kill")
    ax.step(after, range(len(before) + 1, len(before) + len(after) + 1), where="post",
            label="read on with its Last-Event-ID, once Redis is back")
    ax.axvspan(0, outage["back_s"], color="0.85", label="Redis down")
    if outage["reader_told_s"] is not None:
        ax.axvline(outage["reader_told_s"], color="C3", linestyle="--", label="the reader's error event")
    if outage["new_first_text_s"] is not None:
        ax.axvline(outage["back_s"] + outage["new_first_text_s"], color="C2", linestyle=":",
                   label="a new answer's first text")
    ax.set_xlabel("seconds since Redis was killed")
    ax.set_ylabel("text events")
    ax.set_title("One answer through a Redis outage")
    _legend(ax, fontsize=8)
    return ax
