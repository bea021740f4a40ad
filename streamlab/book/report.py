"""``python -m streamlab report``: one page of the whole run, ``build/report.html``.

For each chapter that ran: its headline line, its key figure, and where the
original write-up measured the same thing, its figure beside ours. The page
is one file with the key figures inlined (base64 PNG), so it opens from disk
in any browser, mails as an attachment and needs no server; the chapters'
other figures are linked by relative path (``figures/NN_name/*.png``).

It reads only what the run left behind: ``results/NN_name.json`` (written by
``streamlab.book.chapter.record``) and ``figures/NN_name/`` (written by
``streamlab.book.figures.save_figures``). ``run-notebooks`` writes it at the end;
``make run`` then screenshots it (``--screenshot``).
"""

from __future__ import annotations

import base64
import html
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from streamlab.lab.results.records import BUILD
from streamlab.book.style import EMOJI_FONTS
from streamlab.net.errors import ArgumentParser, UserError

# Each chapter's key figure: the start of its file name after the NN- order prefix (the slug of its title).
# A chapter not listed here, or whose figure is missing, shows its first figure.
KEY_FIGURES: dict[str, str] = {
    "01_split_characters": "broken-pieces-a-reader-would-see",
    "02_three_ways": "time-to-the-first-text-and-to-the-end",
    "03_bytes_on_the_wire": "one-piece-of-text-four-framings",
    "04_the_reader": "silences-between-pieces-against-the-reader",
    "05_when_the_user_leaves": "tokens-generated-vs-delivered",
    "06_the_proxy": "time-to-the-first-event-and-to-the-end",
    "07_persisting_partial_answers": "how-each-stream-ended",
    "08_reconnect_and_resume": "dropped-after",
    "09_a_stranger_at_the_door": "another-reader-s-gaps",
    "10_the_formats_people_actually_use": "a-stream-cut-cleanly",
    "11_serving_many_readers": "each-reader-s-gaps-with",
}


def _s(value: float) -> str:
    return f"{value:.2f} s"


def _ways(f: dict[str, Any], key: str) -> str:
    return " / ".join(f"{f['ways'][w][key]:.0f}" for w in ("complete", "stream", "ws"))


def _path(f: dict[str, Any], key: str) -> dict[str, Any]:
    return f["paths"][key]


# The original write-up's figures (../shared/DESIGN.md, "The experiments": Qwen2.5-1.5B-Instruct on an Apple M4)
# and where ours come from in each chapter's record: (what, theirs, ours from the recorded figures).
ORIGINAL: dict[str, list[tuple[str, str, Callable[[dict[str, Any]], str]]]] = {
    "01_split_characters": [
        ("pieces holding U+FFFD, one token at a time vs incremental", "6 vs 0",
         lambda f: f"{f['naive_broken']} vs {f['incremental_broken']}"),
        ("joined text equals the original", "yes", lambda f: "yes" if f["joined_equal"] else "no"),
    ],
    "02_three_ways": [
        ("/complete: first text = end", "4.68 s", lambda f: _s(f["ways"]["complete"]["first text (s)"])),
        ("/stream: first text, end", "0.13 s, 4.75 s",
         lambda f: f"{_s(f['ways']['stream']['first text (s)'])}, {_s(f['ways']['stream']['end (s)'])}"),
        ("/ws: first text, end", "0.13 s, 5.12 s",
         lambda f: f"{_s(f['ways']['ws']['first text (s)'])}, {_s(f['ways']['ws']['end (s)'])}"),
        ("bytes on the wire per answer: /complete / /stream / /ws", "596 / 2626 / 2038",
         lambda f: _ways(f, "bytes on the wire")),
    ],
    "03_bytes_on_the_wire": [
        ("bytes per event for 3 bytes of text: SSE / Anthropic / OpenAI / WebSocket", "23 / 118 / 257 / 17",
         lambda f: " / ".join(str(f["bytes_per_event"][k]) for k in (
             "streamlab SSE event", "Anthropic content_block_delta", "OpenAI chat.completion.chunk", "WebSocket frame"))),
    ],
    "04_the_reader": [
        ("tokens per word of prose", "1.38", lambda f: f"{f['tokens_per_word']:.2f}"),
        ("a reader at 238 wpm vs generation", "5.5 vs 21 tokens/s",
         lambda f: f"{f['reading_tps']:.1f} vs {f['generation_tps']:.1f} tokens/s"),
        ("time per output token must stay under (the reader's pace)", "~180 ms",
         lambda f: f"{f.get('reading_pace_s', f['tpot_threshold_s']) * 1000:.0f} ms"),
    ],
    "05_when_the_user_leaves": [
        ("tokens generated, SSE reader gone after 10 pieces: watching vs --naive", "10 vs 100",
         lambda f: f"{f['sse_watching']} vs {f['sse_naive']}"),
        ("tokens generated, WebSocket reader says stop after 10", "10", lambda f: str(f["ws_stop"])),
    ],
    "06_the_proxy": [
        ("buffering proxy (8 KB blocks): first text, end", "4.91 s, 4.91 s",
         lambda f: f"{_s(_path(f, f['buffering_key'])['first_event'])}, {_s(_path(f, f['buffering_key'])['end'])}"),
        ("the proxy honouring X-Accel-Buffering: no: first text", "0.20 s",
         lambda f: _s(_path(f, "stand-in proxy, --honor")["first_event"])),
    ],
}


@dataclass
class Chapter:
    """What the run left for one chapter."""

    name: str
    headline: str | None
    figures: dict[str, Any]
    images: list[Path] = field(default_factory=list)

    @property
    def key_figure(self) -> Path | None:
        """The figure the report shows: the one named in KEY_FIGURES, else the chapter's first."""
        wanted = KEY_FIGURES.get(self.name)
        for image in self.images:
            if wanted and image.stem.split("-", 1)[-1].startswith(wanted):
                return image
        return self.images[0] if self.images else None

    def comparisons(self) -> list[tuple[str, str, str]]:
        """(what, the original write-up's figure, ours) for each figure the original measured too."""
        rows = []
        for what, theirs, ours in ORIGINAL.get(self.name, []):
            try:
                value = ours(self.figures)
            except (KeyError, TypeError, IndexError, ValueError):
                value = "not measured in this run"
            rows.append((what, theirs, value))
        return rows


def chapters(out: Path = BUILD) -> list[Chapter]:
    """Every chapter with results or figures under ``out``, in order."""
    results, figures = out / "results", out / "figures"
    names = {p.stem for p in results.glob("[0-9][0-9]_*.json")} | {p.name for p in figures.glob("[0-9][0-9]_*") if p.is_dir()}
    found = []
    for name in sorted(names):
        path = results / f"{name}.json"
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        images = sorted((figures / name).glob("*.png")) if (figures / name).is_dir() else []
        found.append(Chapter(name, data.get("headline"), data.get("figures") or {}, images))
    return found


def _image(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif, EMOJI; max-width: 1000px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; }
.meta { color: #666; margin-top: 0; }
section { border-top: 1px solid #ddd; padding: 1em 0 1.5em; }
h2 { margin: 0 0 0.3em; font-size: 1.25em; }
.headline { font-family: ui-monospace, Menlo, Consolas, monospace, EMOJI; font-size: 0.9em; background: #f4f6f8;
            padding: 0.5em 0.7em; border-left: 4px solid #0072B2; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { text-align: left; padding: 0.25em 0.8em 0.25em 0; border-bottom: 1px solid #eee; vertical-align: top; }
th { color: #555; font-weight: 600; }
img { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
.more { font-size: 0.85em; color: #555; }
.none { color: #999; font-style: italic; }
""".replace("EMOJI", EMOJI_FONTS)  # a font for the emoji the answers hold, where the machine has one


def render(items: list[Chapter], *, out: Path, timings: dict[str, Any] | None = None) -> str:
    """The page, as one HTML string (key figures inlined; the others linked relative to ``out``)."""
    esc = html.escape
    total = (f" (the last timed run: {len(timings.get('chapters', {}))} chapters in {timings['total']:.0f} s)"
             if timings and timings.get("total") else "")
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>streamlab: the run in one page</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>streamlab: the run in one page</h1>",
        f'<p class="meta">Written {esc(time.strftime("%Y-%m-%d %H:%M"))} from <code>results/</code> and '
        f"<code>figures/</code>: {len(items)} chapters{esc(total)}. Each chapter's headline, its key figure, and the "
        "original write-up's figure beside ours where it measured the same thing (Qwen2.5-1.5B-Instruct on an "
        "Apple M4 there; the values differ, the shape must not).</p>",
    ]
    for chapter in items:
        title = chapter.name.replace("_", " ", 1).replace("_", " ")
        parts.append(f'<section id="{esc(chapter.name)}"><h2>{esc(title)}</h2>')
        if chapter.headline:
            parts.append(f'<p class="headline">{esc(chapter.headline)}</p>')
        else:
            parts.append('<p class="none">no headline recorded (the chapter did not finish)</p>')
        rows = chapter.comparisons()
        if rows:
            parts.append("<table><tr><th>measured</th><th>original write-up</th><th>ours</th></tr>")
            parts += [f"<tr><td>{esc(w)}</td><td>{esc(t)}</td><td><b>{esc(o)}</b></td></tr>" for w, t, o in rows]
            parts.append("</table>")
        key = chapter.key_figure
        if key is not None:
            parts.append(f'<img src="{_image(key)}" alt="{esc(key.stem)}" title="{esc(key.name)}">')
            others = [p for p in chapter.images if p != key]
            links = ", ".join(f'<a href="{esc(p.relative_to(out).as_posix())}">{esc(p.stem)}</a>' for p in others)
            parts.append(f'<p class="more">key figure: {esc(key.name)}'
                         + (f"; the chapter's other figures: {links}" if others else "") + " (SVG beside each PNG)</p>")
        else:
            parts.append('<p class="none">no figure saved</p>')
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(out: Path = BUILD) -> Path:
    """Write ``out/report.html`` from ``out/results`` and ``out/figures``; return its path."""
    out = Path(out)
    timings_path = out / "results" / "timings.json"
    timings = json.loads(timings_path.read_text(encoding="utf-8")) if timings_path.is_file() else None
    path = out / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(chapters(out), out=out, timings=timings), encoding="utf-8")
    return path


def screenshot(page: Path, png: Path, *, width: int = 1100, max_height: int = 16000) -> dict[str, Any]:
    """Open ``page`` from disk in headless Chromium, photograph all of it, and say how its images loaded.

    Returns ``{"images": [naturalWidth of each <img>], "text": the page's text}``;
    raises ``streamlab.lab.outside.headless.BrowserUnavailable`` where there is no Chromium.
    """
    from streamlab.lab.outside import headless

    with headless.chromium(width=width, height=800) as driver:
        driver.get(Path(page).resolve().as_uri())
        headless.wait_for(lambda: driver.execute_script(
            "return document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)"),
            30, "the report's images to load")
        height = driver.execute_script("return document.documentElement.scrollHeight")
        headless._set_viewport(driver, width, min(int(height), max_height))
        png = Path(png)
        png.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(png))
        return {"images": driver.execute_script("return Array.from(document.images).map(i => i.naturalWidth)"),
                "text": driver.execute_script("return document.body.innerText")}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m streamlab report",
        description="One page of the whole run, OUT/report.html: each chapter's headline, its key figure, and the"
        " original write-up's figure beside ours. It reads only what the run left: OUT/results/ and OUT/figures/.",
    )
    parser.add_argument("--out", type=Path, default=BUILD, help="the run's folder (default: build/)")
    parser.add_argument("--screenshot", type=Path, default=None, help="also photograph the page (headless Chromium)")
    parser.add_argument("--skip-if-unavailable", action="store_true", help="no Chromium: say so and exit 0")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        raise UserError(f"--out {args.out} is {'a file' if args.out.exists() else 'not there'}: name the folder a run"
                        " wrote (default: build/; python -m streamlab run-notebooks makes it)")
    if args.screenshot is not None and args.screenshot.is_dir():
        raise UserError(f"--screenshot {args.screenshot} is a folder: name the PNG file to write")
    path = write_report(args.out)
    print(f"streamlab report: wrote {path}")
    if args.screenshot:
        from streamlab.lab.outside.headless import BrowserUnavailable

        try:
            seen = screenshot(path, args.screenshot)
        except BrowserUnavailable as err:
            print(f"streamlab report: no screenshot: {err}", file=sys.stderr)
            return 0 if args.skip_if_unavailable else 2
        broken = sum(1 for w in seen["images"] if not w)
        print(f"streamlab report: wrote {args.screenshot} ({len(seen['images'])} figures, {broken} not loaded)")
        return 1 if broken else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
