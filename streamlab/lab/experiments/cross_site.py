"""A page of another origin against the server: what a cross-site page can make it do.

``cross_site_attempt(port)`` serves an attacker's page from another local
origin, opens it in the same headless Chromium the tests use, and has its
script try what such a page can: a no-cors fetch, a form post, a JSON fetch,
reading the conversations, a WebSocket. The result is a table of attempts:
what the page saw, what went over the wire (from Chromium's network log),
and what the server generated or stored meanwhile (nothing, when its Host,
Content-Type and Origin checks hold).
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from contextlib import contextmanager
from http import HTTPStatus
from typing import Any, Iterator
from urllib.parse import urlsplit

from streamlab.lab.outside.headless import chromium, wait_for

__all__ = [
    "ATTACK_PROMPT",
    "CROSS_SITE_ATTEMPTS",
    "attacker_page",
    "cross_site_attempt",
    "network_summary",
    "serving_page",
]

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
