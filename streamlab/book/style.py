"""The chapters' one style: the figure size, the colours, the reading threshold, the shared drawing helpers.

Everything a chart of ``streamlab.book.plots`` shares with the others lives
here, so the rules the reader learns once are written once:

- figures are ``NOTEBOOK_WIDTH`` inches wide, the width a notebook shows them
  at without shrinking their text (wider ones are scaled down, labels and all);
- one thing has one colour in every chapter (``COLOR_OF``, ``color_of``):
  ``/stream`` is the same blue in chapter 2, 4 and 6, ``--naive`` the same
  vermillion in chapter 5 and 8;
- the reading threshold (``READING_THRESHOLD``) is drawn the same way
  (``THRESHOLD_STYLE``) wherever gaps are shown;
- a bar carries its value (``_hbars``), and a legend sits outside the axes
  (``_legend``), so neither ever covers a bar, a value or a label.

Importing it applies ``STYLE`` to matplotlib's ``rcParams``: a chart drawn
by hand in a chapter after ``import streamlab.book.plots`` looks the same.
``streamlab.book.plots`` re-exports the public names.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import matplotlib.pyplot as plt

from streamlab.book.figures import autosave

__all__ = [
    "BLUE",
    "COLORS",
    "COLOR_OF",
    "EMOJI_FONTS",
    "GREEN",
    "GREY",
    "NOTEBOOK_WIDTH",
    "ORANGE",
    "PALETTE",
    "PURPLE",
    "SKY",
    "STYLE",
    "THRESHOLD_STYLE",
    "VERMILLION",
    "YELLOW",
    "color_of",
    "figure",
]

# Where a page finds the emoji its text holds (chapter 1's parrot and melting face), after the text fonts: each
# system's colour font, then Noto Color Emoji, which scripts/system-deps.sh installs on Debian. A machine with none
# of them draws a box; the page's own stylesheet (streamlab/static/style.css) names the same fonts.
EMOJI_FONTS = '"Apple Color Emoji", "Segoe UI Emoji", "Segoe UI Symbol", "Noto Color Emoji", "Twemoji Mozilla", emoji'

NOTEBOOK_WIDTH = 9.0  # inches: ~900 px at the notebook's 100 dpi, the width a notebook page shows unscaled

# Okabe & Ito's palette: told apart by readers with any kind of colour blindness, and in grey on a printout.
BLUE, VERMILLION, GREEN, PURPLE, ORANGE, SKY, YELLOW, GREY = (
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#7F7F7F")
PALETTE = [BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION, YELLOW, GREY]
COLORS = PALETTE  # the name the chapters used before the palette had a meaning

# The same thing, the same colour, in every chapter. ``color_of`` matches a label to the longest key it contains,
# so "/stream (SSE)" is /stream's blue and "SSE, reader leaves (--naive)" is --naive's vermillion.
COLOR_OF: dict[str, str] = {
    # the ways of delivering (chapters 2-4): waiting for the whole answer is the vermillion of waste
    "/complete": VERMILLION, "no streaming": VERMILLION, "/stream": BLUE, "SSE": BLUE, "streaming": BLUE,
    "/ws": PURPLE, "WebSocket": PURPLE,
    # detokenizers (chapter 1)
    "naive": VERMILLION, "incremental": GREEN, "window": GREEN, "full re-decode": ORANGE,
    # a server that watches its reader, and one that never does (chapters 5, 8, 10)
    "watching": GREEN, "--naive": VERMILLION, "generated": ORANGE, "delivered": SKY,
    "keeps events": GREEN, "--forget": ORANGE, "--forget --naive": VERMILLION,
    "relay": GREEN, "relay --naive": VERMILLION, "direct (no relay)": BLUE,
    "kernel defaults": VERMILLION, "--tcp-user-timeout": GREEN,  # chapter 5's reader whose network vanished
    # the hops of chapter 6
    "direct": BLUE, "8 KiB blocks": VERMILLION, "blocks": VERMILLION, "--honor": GREEN,
    "X-Accel-Buffering: no": SKY, "no header": ORANGE, "no pings": VERMILLION, "pings every": GREEN,
    # chapter 9's servers
    "one pass": VERMILLION, "in chunks": GREEN, "no limit": VERMILLION, "--max-active": GREEN,
    # chapter 10's formats
    "streamlab SSE": BLUE, "OpenAI": ORANGE, "Anthropic": "#8C564B", "text bytes": GREEN, "framing": "#BBBBBB",
    # chapter 11: engines, rival servers, backpressure policies
    "threads": ORANGE, "batched": GREEN, "bare loop": GREY, "Generation": BLUE,
    "streamlab": BLUE, "uvicorn+starlette": ORANGE, "sse-starlette": PURPLE, "streamlab-ws": SKY,
    "websockets": YELLOW, "unbounded": VERMILLION, "bounded": BLUE, "bounded_timeout": GREEN,
}

THRESHOLD_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.2}

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 8.5,
    "legend.framealpha": 0.9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "axes.prop_cycle": plt.cycler(color=PALETTE),
    "svg.fonttype": "none",  # SVG text stays text: small files, editable on a slide, and quick to write
}
plt.rcParams.update(STYLE)
# Figures here are laid out by matplotlib's constrained layout; a cell that still calls plt.tight_layout() gets
# tight layout instead, which is as good for one panel: no need to warn the reader about the switch.
warnings.filterwarnings("ignore", message="The figure layout has changed to tight")


def color_of(label: str, index: int = 0) -> str:
    """The colour of ``label`` in every chapter: its own, the longest key it contains, else the palette's ``index``."""
    if label in COLOR_OF:
        return COLOR_OF[label]
    keys = [k for k in COLOR_OF if k in label]
    return COLOR_OF[max(keys, key=len)] if keys else PALETTE[index % len(PALETTE)]


def _axes(ax: Any, height: float, width: float = NOTEBOOK_WIDTH) -> Any:
    """``ax``, or a new one at the notebook's width; and, in a chapter, its figures saved from here on."""
    autosave()
    if ax is None:
        _, ax = plt.subplots(figsize=(width, height), layout="constrained")
    return ax


def figure(rows: int = 1, cols: int = 1, *, height: float = 3.5, **kw: Any) -> tuple[Any, Any]:
    """A figure of ``rows`` x ``cols`` panels at the notebook's width, laid out so no label is cut."""
    autosave()
    return plt.subplots(rows, cols, figsize=(NOTEBOOK_WIDTH, height), layout="constrained", **kw)


def _seconds(value: float) -> str:
    """A time as a reader says it: 0.24 s, 3.9 s, 36 s; milliseconds under a tenth of a second."""
    if value < 0.1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def _number(value: float) -> str:
    """A value as a label: three significant figures, whole numbers with thousands separated from 100 up."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _hbars(ax: Any, ys: Sequence[float], values: Sequence[float], *, height: float, colors: Any,
           labels: Sequence[str], label: str | None = None, **kw: Any) -> Any:
    """Horizontal bars, each with its value written just past its end (readable however short the bar)."""
    bars = ax.barh(ys, values, height=height, color=colors, label=label, **kw)
    for text in ax.bar_label(bars, labels=list(labels), padding=3, fontsize=8):
        text.set_bbox({"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85})  # legible over a line
    return bars


def _legend(ax: Any, **kw: Any) -> Any:
    """A legend outside the axes, to their right: it never covers a bar, a value or a label."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, **kw)


def _threshold_legend_name(threshold: float, label: str) -> str:
    return f"{label}: {threshold * 1000:.0f} ms"
