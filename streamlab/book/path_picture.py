"""One picture of the path a streamed answer takes, with the hop a chapter is about marked.

Every hop between the model and the reader can hold a stream back, cut it or
replay it, and each chapter measures one or two of them. The book draws the
path once, the same way everywhere: browser, CDN, load balancer, nginx, the
server, the worker that runs the model. ``path_picture(marked="nginx")`` is
that picture with nginx marked, as SVG (text kept as text): a notebook shows
it as it shows a figure (``display(path_picture(marked="nginx"))``), the book
writes ``path_picture().svg`` into a page.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Iterable

__all__ = ["HOPS", "PathPicture", "hop_named", "path_picture"]

# The hops, from the reader to the model, and what each one is, in a few words.
HOPS: tuple[tuple[str, str], ...] = (
    ("browser", "the reader's page"),
    ("CDN", "an edge cache"),
    ("load balancer", "picks a replica"),
    ("nginx", "the reverse proxy"),
    ("server", "streams the answer"),
    ("worker", "runs the model"),
)
_ALIASES = {"balancer": "load balancer", "lb": "load balancer", "proxy": "nginx", "reverse proxy": "nginx",
            "page": "browser", "reader": "browser", "model": "worker", "edge": "CDN", "cache": "CDN"}

MARK = "#E69F00"  # the book's orange (streamlab.book.style.ORANGE): the hop the chapter measures
INK, LINE, FILL = "#222222", "#7F7F7F", "#F4F6F8"
BOX_W, BOX_H, GAP, MARGIN = 112, 52, 30, 12


def hop_named(name: str) -> str:
    """The hop a name means (``"nginx"``, ``"Load balancer"``, ``"lb"``), or a ``ValueError`` naming the hops."""
    wanted = " ".join(str(name).split()).lower()
    for hop, _ in HOPS:
        if wanted == hop.lower():
            return hop
    if wanted in _ALIASES:
        return _ALIASES[wanted]
    raise ValueError(f"no hop named {name!r}: the path is {', '.join(h for h, _ in HOPS)}")


@dataclass(frozen=True, repr=False)
class PathPicture:
    """The path as SVG; a notebook displays it (``_repr_svg_``), a page embeds ``svg``."""

    svg: str
    marked: tuple[str, ...]

    def _repr_svg_(self) -> str:
        return self.svg

    def __repr__(self) -> str:  # what a text-only front end shows in place of the picture
        return f"<the path {' → '.join(h for h, _ in HOPS)}" + (f", {', '.join(self.marked)} marked>" if self.marked
                                                                 else ">")


def path_picture(marked: str | Iterable[str] | None = None, *, caption: str | None = None) -> PathPicture:
    """The path browser → CDN → load balancer → nginx → server → worker, ``marked`` hop(s) in orange.

    ``marked``: a hop's name, several, or None for the path alone.
    ``caption``: a line under the picture (by default, which hop is marked).
    """
    names = [marked] if isinstance(marked, str) else list(marked or [])
    chosen = tuple(dict.fromkeys(hop_named(n) for n in names))
    esc = html.escape
    width = MARGIN * 2 + len(HOPS) * BOX_W + (len(HOPS) - 1) * GAP
    top = 8
    label = caption if caption is not None else (f"the hop measured here: {' and '.join(chosen)}" if chosen else "")
    height = BOX_H + (58 if label else 38)
    title = "The path of a streamed answer: " + " → ".join(h for h, _ in HOPS) + (
        f" ({', '.join(chosen)} marked)" if chosen else "")
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        f' role="img" aria-label="{esc(title)}" font-family="system-ui, -apple-system, Segoe UI, sans-serif">',
        f"<title>{esc(title)}</title>",
        f'<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7"'
        f' orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{LINE}"/></marker></defs>',
    ]
    for i, (hop, what) in enumerate(HOPS):
        x = MARGIN + i * (BOX_W + GAP)
        on = hop in chosen
        parts.append(
            f'<g class="hop{" marked" if on else ""}" data-hop="{esc(hop)}">'
            f'<rect x="{x}" y="{top}" width="{BOX_W}" height="{BOX_H}" rx="7" fill="{MARK if on else FILL}"'
            f' stroke="{INK if on else LINE}" stroke-width="{2 if on else 1}"/>'
            f'<text x="{x + BOX_W / 2}" y="{top + 22}" text-anchor="middle" font-size="14" fill="{INK}"'
            f' font-weight="{700 if on else 400}">{esc(hop)}</text>'
            f'<text x="{x + BOX_W / 2}" y="{top + 40}" text-anchor="middle" font-size="11" fill="{INK}">'
            f"{esc(what)}</text></g>")
        if i:
            start = x - GAP + 3
            parts.append(f'<line x1="{start}" y1="{top + BOX_H / 2}" x2="{x - 3}" y2="{top + BOX_H / 2}"'
                         f' stroke="{LINE}" stroke-width="1.5" marker-start="url(#arrow)" marker-end="url(#arrow)"/>')
    parts.append(f'<text x="{MARGIN}" y="{top + BOX_H + 24}" font-size="12" fill="{INK}">the request goes right,'
                 " the answer's events come back left</text>")
    if label:
        parts.append(f'<text x="{MARGIN}" y="{top + BOX_H + 44}" font-size="12" fill="{INK}"'
                     f' font-weight="{700 if chosen else 400}">{esc(label)}</text>')
    parts.append("</svg>")
    return PathPicture("".join(parts), chosen)
