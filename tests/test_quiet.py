"""Quiet runs: no start-up line that says nothing, and emoji drawn as emoji rather than boxes.

The store's line at start says how many answers a crash left streaming; on
a fresh start that is none, and a line saying "0" tells the operator
nothing. Emoji need a colour font: the system packages install one on
Debian, and the page and the book name the fonts each system has.
"""

from __future__ import annotations

from pathlib import Path

from fakes import FakeLM

from streamlab.book import pages, style
from streamlab.lab.setups.runner import serve_in_process

REPO = Path(__file__).resolve().parents[1]
EMOJI_FONT = "Noto Color Emoji"  # what fonts-noto-color-emoji provides


def test_a_fresh_start_says_nothing_about_answers_left_streaming():
    with serve_in_process(FakeLM("Hello.")) as server:
        said = server.start_log
    assert "left streaming" not in said and "0 answers" not in said, said


def test_the_system_packages_bring_an_emoji_font():
    script = (REPO / "scripts" / "system-deps.sh").read_text(encoding="utf-8")
    assert "need+=(fonts-noto-color-emoji)" in script


def test_the_page_and_the_book_name_emoji_fonts_after_their_text_fonts():
    page = (REPO / "streamlab" / "static" / "style.css").read_text(encoding="utf-8")
    assert EMOJI_FONT in page and "var(--emoji)" in page.split("--font:", 1)[1].split(";", 1)[0]
    assert EMOJI_FONT in style.EMOJI_FONTS
    body = pages.CSS.split("body {", 1)[1].split(";", 1)[0]
    assert body.index("sans-serif") < body.index(EMOJI_FONT)  # text in the text font, emoji in the emoji font
