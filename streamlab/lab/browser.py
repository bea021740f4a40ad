"""Drive a real browser at the page: headless Chromium through selenium.

The page's claims (the answer grows while it streams, the stop button really
stops the server, a reload shows the partial answer marked) are only proven
by a browser's own ``EventSource`` and ``fetch``, so the tests and
``make run``'s screenshot use one. We use the system's Chromium and its
matching chromedriver (Debian: ``apt-get install chromium chromium-driver``)
and never let selenium download a browser or a driver: the machines this
runs on may have no internet.

    with chromium() as driver:
        driver.get(server.url)

    python -m streamlab.lab.browser build/screenshot-mid-stream.png

``cross_site_attempt(port)`` shows the other side: what a page of another
local origin, in the same browser, can make the server do (nothing, when its
Host, Content-Type and Origin checks hold), as a table of attempts.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from http import HTTPStatus
from urllib.parse import urlsplit
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:  # selenium is a test dependency; importing this module must not need it
    from selenium.webdriver import Chrome

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

DEFAULT_SCREENSHOT = Path("build") / "screenshot-mid-stream.png"
DEFAULT_PROMPT = (
    "Explain, with a short Markdown list and a small Python code block, "
    "how a web page can show a model's answer while it is still being generated."
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
def chromium(*, width: int = 1280, height: int = 800, network_log: bool = False) -> Iterator["Chrome"]:
    """A headless Chromium with a fresh profile, its viewport ``width`` x ``height``; quit on the way out.

    The browser's console is kept (``driver.get_log("browser")``) so a test
    can assert the page logged no errors. With ``network_log``, so are its
    DevTools network events (``driver.get_log("performance")``): what went
    over the wire, status codes the page itself is never shown included.
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
    for flag in CHROMIUM_FLAGS:
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
    from streamlab.lab import runner

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


# --------------------------------------------------------------------------
# A page of another origin against the server
# --------------------------------------------------------------------------

ATTACK_PROMPT = "Another site sent this: say something the user never asked for."

# What the attacker page tries, in order: (name, what it does).
CROSS_SITE_ATTEMPTS = (
    (
        "no-cors fetch",
        "fetch POST /stream, mode no-cors, Content-Type text/plain, a JSON body: a simple request, no preflight",
    ),
    (
        "form post",
        "an HTML form POSTs to /generations (application/x-www-form-urlencoded) into a hidden iframe",
    ),
    (
        "json fetch",
        "fetch POST /stream with Content-Type application/json: the browser must ask first (CORS preflight)",
    ),
    (
        "read conversations",
        "fetch GET /conversations and read the body",
    ),
    (
        "websocket",
        "new WebSocket(ws://127.0.0.1:PORT/ws), sending a request once it opens",
    ),
)

# The attacker page: its script does nothing until Python calls attack.start(name),
# and writes each attempt's outcome into attack.results[name].
_ATTACKER_PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>a page on another origin</title><link rel="icon" href="data:,"></head>
<body>
<h1>A page on another origin</h1>
<p>Its script tries to use the model server at <code id="target"></code>.</p>
<form id="form" method="POST" enctype="application/x-www-form-urlencoded" target="sink" hidden>
  <input name="prompt"><input name="max_tokens">
</form>
<iframe name="sink" id="sink" hidden></iframe>
<script>
"use strict";
const CONFIG = __CONFIG__;
const server = CONFIG.server;
const body = JSON.stringify({prompt: CONFIG.prompt, max_tokens: CONFIG.max_tokens});
const form = document.getElementById("form");
document.getElementById("target").textContent = server;
form.action = server + "/generations";
form.elements.prompt.value = CONFIG.prompt;
form.elements.max_tokens.value = String(CONFIG.max_tokens);

const clip = (text) => (text.length > 120 ? text.slice(0, 120) + "..." : text);
const failure = (err) => ({outcome: err.name || "Error", page_read: false, saw: `threw ${err.name}: ${err.message}`});

const attempts = {
  "no-cors fetch": async () => {
    const response = await fetch(server + "/stream", {
      method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body});
    const text = await response.text();
    return {
      outcome: response.type === "opaque" ? "opaque response" : `${response.type} response`,
      page_read: response.type !== "opaque",
      saw: `resolved: type "${response.type}", status ${response.status}, body ${JSON.stringify(clip(text))}`,
    };
  },
  "form post": () => new Promise((resolve) => {
    const frame = document.getElementById("sink");
    frame.onload = () => {
      let doc;
      try {
        doc = frame.contentWindow.document;
      } catch (err) {
        const reason = err.message.split(": ").pop();
        resolve({outcome: "iframe loaded, unreadable", page_read: false,
                 saw: `the iframe loaded; reading it threw ${err.name} (${reason})`});
        return;
      }
      if (doc.URL === "about:blank") return;  // the frame's first, empty document
      resolve({outcome: "iframe loaded, readable", page_read: true,
               saw: "the iframe loaded and the page read it: " + JSON.stringify(clip(doc.body.innerText))});
    };
    form.submit();
  }),
  "json fetch": async () => {
    const response = await fetch(server + "/stream", {
      method: "POST", headers: {"Content-Type": "application/json"}, body});
    const text = await response.text();
    return {outcome: `HTTP ${response.status}`, page_read: true,
            saw: `status ${response.status}, read ${JSON.stringify(clip(text))}`};
  },
  "read conversations": async () => {
    const response = await fetch(server + "/conversations");
    const text = await response.text();
    return {outcome: `HTTP ${response.status}`, page_read: true,
            saw: `status ${response.status}, read ${JSON.stringify(clip(text))}`};
  },
  "websocket": () => new Promise((resolve) => {
    let opened = false, errored = false;
    const socket = new WebSocket(CONFIG.websocket);
    socket.onopen = () => { opened = true; socket.send(body); };
    socket.onerror = () => { errored = true; };
    socket.onmessage = (event) => {
      resolve({outcome: "message", page_read: true, saw: "opened; read " + JSON.stringify(clip(String(event.data)))});
      socket.close();
    };
    socket.onclose = (event) => resolve({
      outcome: `close ${event.code}`, page_read: false,
      saw: (opened ? "opened, then " : "never opened: ") + (errored ? "an error event, then " : "")
           + `close code ${event.code}` + (event.wasClean ? "" : " (not clean)"),
    });
  }),
};

window.attack = {
  results: {},
  start(name) {
    const started = performance.now();
    this.results[name] = {settled: false};
    Promise.resolve().then(attempts[name]).catch(failure).then((result) => {
      this.results[name] = Object.assign({settled: true, ms: Math.round(performance.now() - started)}, result);
    });
  },
};
</script>
</body>
</html>
"""


def attacker_page(server_port: int, *, prompt: str = ATTACK_PROMPT, max_tokens: int = 5) -> str:
    """The attacker's HTML page, aimed at the model server on ``127.0.0.1:server_port``."""
    config = {
        "server": f"http://127.0.0.1:{server_port}",
        "websocket": f"ws://127.0.0.1:{server_port}/ws",
        "prompt": prompt,
        "max_tokens": max_tokens,
    }
    # Safe inside <script>: no "</" can close the element early.
    return _ATTACKER_PAGE.replace("__CONFIG__", json.dumps(config).replace("</", "<\\/"))


@contextmanager
def serving_page(html: str) -> Iterator[str]:
    """Serve ``html`` at ``/`` of a free port of 127.0.0.1 (a thread), yielding its URL; stopped on the way out."""
    page = html.encode("utf-8")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if urlsplit(self.path).path != "/":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="attacker-page", daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def cross_site_attempt(
    server_port: int,
    *,
    prompt: str = ATTACK_PROMPT,
    max_tokens: int = 5,
    timeout: float = 10.0,
    settle: float = 0.3,
) -> dict[str, Any]:
    """What a page of another local origin can make the model server on ``127.0.0.1:server_port`` do.

    A page is served from another free port of 127.0.0.1 (another origin:
    the port is part of it) and opened in headless Chromium. Its script makes
    the attempts of ``CROSS_SITE_ATTEMPTS`` one at a time; after each, this
    function asks the server itself (``GET /log``, ``GET /conversations``)
    whether anything was generated or stored. Returns::

        {"server": "http://127.0.0.1:8000", "attacker": "http://127.0.0.1:41234",
         "attempts": [row, ...], "generated": 0, "stored": 0, "seconds": 2.1}

    ``generated`` and ``stored`` count the ``/log`` records and conversations
    that appeared on the server while the page ran (counted ``settle``
    seconds after the browser closed). A request that got through is on
    ``/log`` before its answer leaves the server, so before the page can see
    an outcome; each attempt still waits up to ``settle`` seconds for one. Every row has the same
    keys, so ``pandas.DataFrame(result["attempts"])`` is a table:

    - ``attempt``, ``what``: the attempt's name and what the page does;
    - ``outcome``: the page's result in short (``opaque response``,
      ``iframe loaded, unreadable``, ``TypeError``, ``close 1006``...), and
      ``browser_saw``: in full, as the page's script saw it;
    - ``page_read``: whether the page got to read anything the server said;
    - ``wire``: what went over the wire, from Chromium's network log
      (``POST /stream → 415 Unsupported Media Type``): status codes the page
      itself is never shown;
    - ``server_generated``, ``server_stored``: new ``/log`` records and
      conversations during this attempt;
    - ``ms``: how long the attempt took in the browser; ``console``: what
      Chromium's console said meanwhile (what a developer sees in DevTools).

    Nothing here needs the server's cooperation: it is any server's port.
    """
    from streamlab.client.timed import get_json_sync

    began = time.perf_counter()

    def counts() -> tuple[int, int]:
        return len(get_json_sync(server_port, "/log")), len(get_json_sync(server_port, "/conversations"))

    def settled_counts(before: tuple[int, int]) -> tuple[int, int]:
        """The counts after up to ``settle`` seconds: sooner if something new shows up."""
        deadline = time.monotonic() + settle
        while True:
            now = counts()
            if now != before or time.monotonic() >= deadline:
                return now
            time.sleep(0.05)

    first = counts()
    rows: list[dict[str, Any]] = []
    html = attacker_page(server_port, prompt=prompt, max_tokens=max_tokens)
    with serving_page(html) as page_url, chromium(network_log=True) as driver:
        driver.get(page_url)
        wait_for(lambda: driver.execute_script("return !!window.attack"), timeout, "the attacker page's script")
        driver.get_log("performance")  # keep only what the attempts cause
        driver.get_log("browser")
        for name, what in CROSS_SITE_ATTEMPTS:
            before = counts()
            driver.execute_script("window.attack.start(arguments[0])", name)
            try:
                result = wait_for(
                    lambda name=name: driver.execute_script(
                        "const r = window.attack.results[arguments[0]]; return r && r.settled ? r : null", name
                    ),
                    timeout,
                    f"the attempt {name!r} to settle",
                )
            except TimeoutError:
                result = {"outcome": "pending", "page_read": False, "saw": f"no outcome within {timeout:g} s"}
            after = settled_counts(before)
            rows.append(
                {
                    "attempt": name,
                    "what": what.replace("PORT", str(server_port)),
                    "outcome": result.get("outcome"),
                    "browser_saw": result.get("saw"),
                    "page_read": bool(result.get("page_read")),
                    "wire": "; ".join(network_summary(driver.get_log("performance"), server_port)),
                    "server_generated": after[0] - before[0],
                    "server_stored": after[1] - before[1],
                    "ms": result.get("ms"),
                    "console": [entry.get("message", "") for entry in driver.get_log("browser")],
                }
            )
    time.sleep(settle)  # the browser is gone: whatever it started has reached the server by now
    last = counts()
    return {
        "server": f"http://127.0.0.1:{server_port}",
        "attacker": page_url.rstrip("/"),
        "attempts": rows,
        "generated": last[0] - first[0],
        "stored": last[1] - first[1],
        "seconds": round(time.perf_counter() - began, 2),
    }


def network_summary(entries: list[dict], port: int) -> list[str]:
    """Chromium's performance-log entries → one line per request to ``127.0.0.1:port``, in order.

    ``POST /stream → 415 Unsupported Media Type``; a preflight comes first
    (``OPTIONS /stream (preflight) → 405 Method Not Allowed``) and the request
    it stopped reads ``POST /stream: not sent (CORS PreflightMissingAllowOriginHeader)``;
    an answer the browser got but kept from the page says so, with the CORS
    error that kept it.
    """
    prefixes = (f"http://127.0.0.1:{port}/", f"ws://127.0.0.1:{port}/")
    events: list[tuple[str, dict]] = []
    for entry in entries:
        try:
            message = json.loads(entry["message"])["message"]
            events.append((message["method"], message.get("params") or {}))
        except (KeyError, TypeError, ValueError):
            continue
    requests: dict[str, dict[str, Any]] = {}  # requestId → what is known, in order of sending
    for method, params in events:
        if method == "Network.requestWillBeSent":
            url, initiator = params["request"]["url"], params.get("initiator") or {}
            if url.startswith(prefixes):
                requests.setdefault(params["requestId"], {}).update(
                    method=params["request"]["method"],
                    path=urlsplit(url).path,
                    preflight_of=initiator.get("requestId") if initiator.get("type") == "preflight" else None,
                )
        elif method == "Network.webSocketCreated" and params.get("url", "").startswith(prefixes):
            requests.setdefault(params["requestId"], {}).update(
                method="GET", path=urlsplit(params["url"]).path, websocket=True
            )
    for method, params in events:
        facts = requests.get(params.get("requestId", ""))
        if facts is None:
            continue
        if method == "Network.responseReceived":
            facts.setdefault("status", params["response"]["status"])
        elif method == "Network.responseReceivedExtraInfo":
            facts.setdefault("status", params["statusCode"])
        elif method == "Network.webSocketHandshakeResponseReceived":
            facts["status"] = params["response"]["status"]
        elif method == "Network.webSocketFrameError":
            found = re.search(r"response code: (\d+)", params.get("errorMessage", ""))
            if found:
                facts["status"] = int(found[1])
            else:
                facts["error"] = params.get("errorMessage")
        elif method == "Network.loadingFailed":
            cors = (params.get("corsErrorStatus") or {}).get("corsError")
            if cors:
                facts["cors"] = cors
            elif not params.get("canceled"):
                facts["error"] = params.get("errorText")

    def line(facts: dict[str, Any]) -> str:
        what = f"{facts.get('method', '?')} {facts.get('path', '?')}"
        if facts.get("websocket"):
            what += " (WebSocket upgrade)"
        if facts.get("preflight_of"):
            what += " (preflight)"
        status, cors = facts.get("status"), facts.get("cors")
        if status is None:
            if cors and cors.startswith("Preflight"):
                return f"{what}: not sent (CORS {cors})"
            return f"{what}: no answer ({f'CORS {cors}' if cors else facts.get('error') or 'none seen'})"
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        text = f"{what} → {status} {phrase}".rstrip()
        if cors:
            text += f", kept from the page (CORS {cors})"
        return text

    preflights = {f["preflight_of"]: f for f in requests.values() if f.get("preflight_of")}
    lines = []
    for request_id, facts in requests.items():
        if facts.get("preflight_of"):
            continue
        if request_id in preflights:
            lines.append(line(preflights[request_id]))
        lines.append(line(facts))
    lines += [line(f) for f in preflights.values() if f["preflight_of"] not in requests]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamlab.lab.browser",
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
        print(f"streamlab.lab.browser: no screenshot: {err}", file=sys.stderr)
        return 0 if args.skip_if_unavailable else 2
    print(f"streamlab.lab.browser: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
