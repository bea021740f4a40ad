"""Drive a real browser at the page: headless Chromium through selenium.

The page's claims (the answer grows while it streams, the stop button really
stops the server, a reload shows the partial answer marked) are only proven
by a browser's own ``EventSource`` and ``fetch``, so the tests and
``make run``'s screenshot use one. We use the system's Chromium and its
matching chromedriver (Debian: ``apt-get install chromium chromium-driver``)
and never let selenium download a browser or a driver: the machines this
runs on may have no internet.

    with headless.chromium() as driver:
        driver.get(server.url)
        browser.send_prompt(driver, "Hello")

    python -m streamlab.lab.outside.browser build/screenshot-mid-stream.png

This module holds what a reader does on the page (type, send, watch the
pieces arrive) and the screenshot. Finding and starting Chromium is
``streamlab.lab.outside.headless``'s; what a page of another local origin can
make the server do is ``streamlab.lab.experiments.cross_site``'s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from streamlab.lab.outside.headless import BrowserUnavailable, chromium, wait_for

if TYPE_CHECKING:  # selenium is a test dependency; importing this module must not need it
    from selenium.webdriver import Chrome

__all__ = [
    "DEFAULT_PROMPT",
    "DEFAULT_SCREENSHOT",
    "main",
    "page_state",
    "pieces_received",
    "screenshot_mid_stream",
    "send_prompt",
]

DEFAULT_SCREENSHOT = Path("build") / "screenshot-mid-stream.png"
DEFAULT_PROMPT = (
    "Explain, with a short Markdown list and a small Python code block, "
    "how a web page can show a model's answer while it is still being generated."
)


def page_state(driver: "Chrome") -> str:
    """``idle``, ``streaming`` or ``done``: the page's ``document.body.dataset.state``."""
    return driver.execute_script("return document.body.dataset.state")


def pieces_received(driver: "Chrome") -> int:
    """How many SSE pieces the page has received for its current answer."""
    return driver.execute_script("return window.streamlab ? window.streamlab.pieces.length : 0")


def send_prompt(driver: "Chrome", prompt: str, max_tokens: int | None = None) -> None:
    """Type into the prompt box and press Send, as a reader would."""
    from selenium.webdriver.common.by import By

    wait_for(lambda: driver.execute_script("return !!window.streamlab"), 10, "the page's script")
    if max_tokens is not None:
        field = driver.find_element(By.ID, "max-tokens")
        field.clear()
        field.send_keys(str(max_tokens))
    box = driver.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(prompt)
    driver.find_element(By.ID, "send").click()


def screenshot_mid_stream(
    out: Path | str = DEFAULT_SCREENSHOT,
    *,
    prompt: str = DEFAULT_PROMPT,
    max_tokens: int = 200,
    pieces: int = 36,
    server_args: tuple[str, ...] = (),
    url: str | None = None,
) -> Path:
    """Start a server, send ``prompt`` from the page, and save a PNG once ``pieces`` pieces have arrived.

    Then press Stop, so the server's generation ends at once rather than
    running on to ``max_tokens``. The server gets a fresh database in a
    temporary folder: the screenshot shows one new conversation. Given a
    ``url``, use the server already there instead.
    """
    from streamlab.lab.setups import runner

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if url is not None:
        _screenshot(url, out, prompt, max_tokens, pieces)
        return out
    with tempfile.TemporaryDirectory(prefix="streamlab-shot-") as tmp:
        with runner.serve("--db", str(Path(tmp) / "db.sqlite"), *server_args) as server:
            _screenshot(server.url, out, prompt, max_tokens, pieces)
    return out


def _screenshot(url: str, out: Path, prompt: str, max_tokens: int, pieces: int) -> None:
    from selenium.webdriver.common.by import By

    with chromium() as driver:
        driver.get(url.rstrip("/") + "/")
        driver.execute_script("localStorage.clear(); sessionStorage.clear()")
        driver.get(url.rstrip("/") + "/")  # a new conversation, whatever the server holds
        send_prompt(driver, prompt, max_tokens)
        wait_for(
            lambda: pieces_received(driver) >= pieces or page_state(driver) == "done",
            120,
            f"{pieces} pieces of the answer",
        )
        time.sleep(0.1)  # let the last pieces' animation frame paint
        if not driver.save_screenshot(str(out)):
            raise RuntimeError(f"chromium could not write {out}")
        stop = driver.find_element(By.ID, "stop")
        if stop.is_enabled():
            stop.click()
        wait_for(lambda: page_state(driver) == "done", 30, "the end of the answer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamlab.lab.outside.browser",
        description="Screenshot the page while an answer streams into it (headless Chromium).",
    )
    parser.add_argument("out", nargs="?", default=str(DEFAULT_SCREENSHOT), help="PNG to write")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--pieces", type=int, default=36, help="take the picture after this many pieces")
    parser.add_argument("--url", default=None, help="use the server already running there")
    parser.add_argument(
        "--skip-if-unavailable",
        action="store_true",
        help="exit 0 with a note when there is no chromium/chromedriver/selenium",
    )
    args = parser.parse_args(argv)
    try:
        path = screenshot_mid_stream(
            args.out, prompt=args.prompt, max_tokens=args.max_tokens, pieces=args.pieces, url=args.url
        )
    except BrowserUnavailable as err:
        print(f"streamlab.lab.outside.browser: no screenshot: {err}", file=sys.stderr)
        return 0 if args.skip_if_unavailable else 2
    print(f"streamlab.lab.outside.browser: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
