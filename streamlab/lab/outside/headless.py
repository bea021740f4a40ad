"""Headless Chromium from Python: finding it, starting it, waiting on it.

The browser tests, the screenshot, the cross-site experiment and the report's
pictures all need the same thing: a real Chromium with a fresh profile, a
viewport of an exact size, and a console log to read back. We use the
system's Chromium and its matching chromedriver (Debian: ``apt-get install
chromium chromium-driver``) and never let selenium download a browser or a
driver: the machines this runs on may have no internet. When either is
missing, ``unavailable_reason`` says why, so a test can skip instead of fail.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:  # selenium is a test dependency; importing this module must not need it
    from selenium.webdriver import Chrome

__all__ = [
    "CHROMIUM_FLAGS",
    "BrowserUnavailable",
    "chromium",
    "find_chromium",
    "responses_received",
    "unavailable_reason",
    "wait_for",
]

# Headless, no GPU, and nothing that talks to the network on its own
# (component updates, sync, field trials), so a run is quiet and repeatable.
# --no-sandbox: containers and CI runners as root have no user namespaces.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
)


class BrowserUnavailable(RuntimeError):
    """No usable Chromium, chromedriver or selenium here: the reason is the message."""


def find_chromium() -> tuple[str, str] | None:
    """``(chromium binary, chromedriver)`` found on this machine, or None."""
    binary = next(
        (
            found
            for found in (
                shutil.which("chromium"),
                "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None,
                shutil.which("chromium-browser"),
            )
            if found
        ),
        None,
    )
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        return None
    return binary, driver


def unavailable_reason() -> str | None:
    """Why ``chromium()`` cannot start here, or None if it should."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    if find_chromium() is None:
        return (
            "chromium and chromedriver are not both on PATH"
            " (Debian: apt-get install chromium chromium-driver)"
        )
    return None


@contextmanager
def chromium(
    *, width: int = 1280, height: int = 800, network_log: bool = False, flags: tuple[str, ...] = ()
) -> Iterator["Chrome"]:
    """A headless Chromium with a fresh profile, its viewport ``width`` x ``height``; quit on the way out.

    The browser's console is kept (``driver.get_log("browser")``) so a test
    can assert the page logged no errors. With ``network_log``, so are its
    DevTools network events (``driver.get_log("performance")``): what went
    over the wire, status codes the page itself is never shown included.
    ``flags`` are added to ``CHROMIUM_FLAGS`` (e.g. the one that trusts an
    experiment's own certificate, ``streamlab.hops.tls``).
    """
    reason = unavailable_reason()
    if reason:
        raise BrowserUnavailable(reason)
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    assert found is not None
    binary, driver_path = found
    profile = tempfile.mkdtemp(prefix="streamlab-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, *flags):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    logs = {"browser": "ALL", "performance": "ALL"} if network_log else {"browser": "ALL"}
    options.set_capability("goog:loggingPrefs", logs)
    driver = None
    try:
        try:
            driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
        except WebDriverException as err:
            raise BrowserUnavailable(f"chromium did not start: {err.msg or err}") from err
        _set_viewport(driver, width, height)
        yield driver
    finally:
        if driver is not None:
            try:
                driver.quit()
            except Exception:  # noqa: BLE001 - the browser may already be gone
                pass
        shutil.rmtree(profile, ignore_errors=True)


def _set_viewport(driver: "Chrome", width: int, height: int) -> None:
    """Make the page's own viewport (``innerWidth`` x ``innerHeight``) the size asked for.

    A window size includes whatever browser frame there is; measure the
    difference and size the window again, so screenshots are exactly this big.
    """
    driver.set_window_size(width, height)
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    dw, dh = width - inner[0], height - inner[1]
    if dw or dh:
        driver.set_window_size(width + dw, height + dh)


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns something truthy; TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def responses_received(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chromium's performance-log entries (``goog:loggingPrefs`` ``performance``) -> the response of every
    ``Network.responseReceived`` in order: its ``url``, ``status``, ``protocol``, ``connectionId``..."""
    found = []
    for entry in entries:
        try:
            message = json.loads(entry["message"])["message"]
        except (KeyError, TypeError, ValueError):
            continue
        if message.get("method") == "Network.responseReceived":
            found.append(message["params"]["response"])
    return found
