"""What each of a browser's readers sends (chapter 6): ``EventSource``, ``fetch`` and ``WebSocket``, asked alike.

A page that has a session cookie asks all three for an ``Authorization:
Bearer`` header: ``new EventSource(url, {headers})`` (its second argument
knows only ``withCredentials``, so the header is silently dropped),
``fetch(url, {headers})``, and ``new WebSocket(url)`` (which has no place to
put one at all). A small recording server behind the page keeps each
request's head, so what arrived is measured, not read from the API's docs.

The recorder is a plain threaded TCP server on 127.0.0.1: it answers ``/``
with the page (and the cookie), ``/events`` with one event, ``/fetch`` with
a short body, and the WebSocket upgrade with a refusal (the head is all we
want from it).
"""

from __future__ import annotations

import socketserver
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from streamlab.lab.outside.headless import wait_for
from streamlab.lab.setups.runner import serving_in_thread
from streamlab.protocol.http_head import parse_request_head

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

__all__ = ["PAGE", "READERS", "reader_rows", "recording_server"]

TOKEN = "Bearer page-token"
COOKIE = "session=s1"

#: The page: each reader asked for the same header.
PAGE = f"""<!doctype html><meta charset="utf-8"><title>readers</title>
<script>
const asked = {{headers: {{Authorization: "{TOKEN}"}}}};
const source = new EventSource("/events", asked);  // the second argument knows only withCredentials
source.onmessage = () => source.close();
fetch("/fetch", {{method: "POST", body: "{{}}", headers: {{Authorization: "{TOKEN}",
                                                        "Content-Type": "application/json"}}}});
new WebSocket(`ws://${{location.host}}/ws`);  // (url, protocols): nowhere to put a header
</script>
"""

#: The path each reader asks for, and its name in the table.
READERS = {"/events": "EventSource", "/fetch": "fetch", "/ws": "WebSocket"}

_ANSWERS = {
    "/": ("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Set-Cookie", f"{COOKIE}; Path=/")],
          PAGE.encode("utf-8")),
    "/events": ("200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")],
                b"retry: 600000\ndata: hi\n\n"),
    "/fetch": ("200 OK", [("Content-Type", "text/plain")], b"ok"),
    "/ws": ("403 Forbidden", [], b""),
}


class _Recorder(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.heads: dict[str, Any] = {}


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        raw = b""
        self.request.settimeout(5)
        while b"\r\n\r\n" not in raw and len(raw) < 65536:
            data = self.request.recv(65536)
            if not data:
                return
            raw += data
        head = parse_request_head(raw[: raw.index(b"\r\n\r\n") + 4])
        path = head.path.split("?", 1)[0]
        self.server.heads.setdefault(path, head)  # type: ignore[attr-defined]
        status, headers, body = _ANSWERS.get(path, ("404 Not Found", [], b""))
        lines = [f"HTTP/1.1 {status}", *(f"{n}: {v}" for n, v in headers), f"Content-Length: {len(body)}",
                 "Connection: close"]
        self.request.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


@contextmanager
def recording_server() -> Iterator[_Recorder]:
    """The page's server on a free port of 127.0.0.1 (``.server_address``), keeping each path's first request head."""
    with serving_in_thread(_Recorder(), "streamlab-reader-recorder") as server:
        yield server


def reader_rows(driver: Chrome, timeout: float = 20.0) -> list[dict[str, Any]]:
    """Open the page in ``driver`` and return, per reader, what its request carried."""
    with recording_server() as server:
        port = server.server_address[1]
        driver.get(f"http://127.0.0.1:{port}/")
        wait_for(lambda: set(READERS) <= set(server.heads), timeout, "a request from every reader")
        heads = dict(server.heads)
    rows = []
    for path, name in READERS.items():
        head = heads[path]
        rows.append({
            "reader": name, "request": f"{head.method} {path}",
            "Authorization sent": head.header("authorization") == TOKEN,
            "cookie sent": COOKIE in (head.header("cookie") or ""),
            "Origin sent": head.header("origin") is not None,
        })
    return rows
