"""What a stranger might send a model server, and what it should answer: chapter 9's refusal table.

Each ``Case`` is raw bytes written to a fresh connection (and, for a
WebSocket, frames after the handshake), with the answer a careful server
gives: an HTTP status, or a WebSocket close code. ``probe`` sends one and
times the refusal. The same list drives the tests (every row asserted, over
a fake model, in milliseconds) and the chapter (against the real server), so
the table in the book is the table that is tested.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Callable

from . import websocket as ws
from .http import ResponseHeadParser

EVIL = "evil.example"
TOO_LONG = {"prompt": "1" * 8300, "max_tokens": 3, "chat": False}  # 8,300 tokens past an 8,192 context


def _post(path: str, body: bytes, *, content_type: str = "application/json", extra: str = "") -> Callable[[int], bytes]:
    def build(port: int) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
        ).encode() + body

    return build


def _get(path: str, *, host: str | None = None, extra: str = "", version: str = "HTTP/1.1") -> Callable[[int], bytes]:
    def build(port: int) -> bytes:
        host_line = f"Host: {host or f'127.0.0.1:{port}'}\r\n" if host != "" else ""
        return f"GET {path} {version}\r\n{host_line}Connection: close\r\n{extra}\r\n".encode()

    return build


def _raw(data: bytes) -> Callable[[int], bytes]:
    return lambda port: data


def _upgrade(*, origin: str | None = None, host: str | None = None) -> Callable[[int], bytes]:
    def build(port: int) -> bytes:
        return ws.client_handshake(host or f"127.0.0.1:{port}", "/ws", ws.new_key(), origin=origin)

    return build


OK_REQUEST = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()


@dataclass(frozen=True)
class Case:
    """One hostile request: what it is, the bytes, and the answer expected (a status, or a close code)."""

    name: str
    request: Callable[[int], bytes]
    expect: int
    frames: bytes = b""  # WebSocket frames to send after a successful handshake

    @property
    def websocket(self) -> bool:
        return bool(self.frames)


def _frame(opcode: int, payload: bytes, *, mask: bool = True) -> bytes:
    return ws.encode_frame(opcode, payload, mask=mask)


CASES: list[Case] = [
    Case("prompt longer than the context, in tokens", _post("/stream", json.dumps(TOO_LONG).encode()), 400),
    Case("max_tokens out of range", _post("/stream", b'{"prompt": "Hi", "max_tokens": 100000}'), 400),
    Case("a body that is not JSON", _post("/stream", b"prompt=Hi"), 400),
    Case("JSON nested 100,000 deep", _post("/stream", b"[" * 100_000 + b"]" * 100_000), 400),
    Case("text/plain POST (no preflight needed)", _post("/stream", OK_REQUEST, content_type="text/plain"), 415),
    Case("form POST to /generations", _post("/generations", b"prompt=Hi",
                                            content_type="application/x-www-form-urlencoded"), 415),
    Case("POST from another site's page", _post("/stream", OK_REQUEST, extra=f"Origin: http://{EVIL}\r\n"), 403),
    Case("POST from another local port", _post("/stream", OK_REQUEST, extra="Origin: http://127.0.0.1:9\r\n"), 403),
    Case("POST from a sandboxed page (Origin: null)", _post("/stream", OK_REQUEST, extra="Origin: null\r\n"), 403),
    Case("DNS rebinding: GET /log as evil.example", _get("/log", host=EVIL), 403),
    Case("DNS rebinding: GET /conversations", _get("/conversations", host=EVIL), 403),
    Case("DNS rebinding: POST /stream", lambda port: _post("/stream", OK_REQUEST)(port).replace(
        f"Host: 127.0.0.1:{port}".encode(), f"Host: {EVIL}".encode()), 403),
    Case("WebSocket from another site's page", _upgrade(origin=f"http://{EVIL}"), 403),
    Case("WebSocket through DNS rebinding", _upgrade(origin=f"http://{EVIL}", host=EVIL), 403),
    Case("HTTP/1.1 without Host", _get("/health", host=""), 400),
    Case("HTTP/0.9 request line", _raw(b"GET /\r\n"), 400),
    Case("request head over 16 KiB", _get("/health", extra="X-Pad: " + "a" * 20_000 + "\r\n"), 431),
    Case("Content-Length over 1 MiB", _raw(b"POST /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                            b"application/json\r\nContent-Length: 2000000\r\n\r\n"), 413),
    Case("Content-Length and chunked (smuggling)", _raw(
        b"POST /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 400),
    Case("a NUL byte in the path", _get("/static/..%00.html"), 400),
    Case("path traversal", _get("/static/..%2F..%2Fserver%2Fapp.py"), 404),
    Case("a route that does not exist", _get("/admin"), 404),
    Case("a method the route does not take", _raw(b"DELETE /stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 405),
    Case("WebSocket: unmasked frame", _upgrade(), 1002, _frame(1, b'{"prompt": "Hi"}', mask=False)),
    Case("WebSocket: invalid UTF-8 text", _upgrade(), 1007, _frame(1, b"\xff\xfe")),
    Case("WebSocket: binary message", _upgrade(), 1003, _frame(2, b"\x00\x01")),
    Case("WebSocket: message over 1 MiB", _upgrade(), 1009, _frame(1, b"a" * ((1 << 20) + 1))),
    Case("WebSocket: request that is not JSON", _upgrade(), 1008, _frame(1, b"hello")),
    Case("WebSocket: prompt longer than the context", _upgrade(), 1008, _frame(1, json.dumps(TOO_LONG).encode())),
]


@dataclass
class Outcome:
    """What came back: the status (HTTP) or close code (WebSocket), the time it took, the error message."""

    answer: int | None
    seconds: float
    message: str = ""


def probe(port: int, case: Case, *, timeout: float = 15.0) -> Outcome:
    """Send one case on a fresh connection to 127.0.0.1 and wait for the refusal."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        started = time.perf_counter()
        sock.sendall(case.request(port))
        parser = ResponseHeadParser()
        response = None
        data = b""
        while response is None:
            chunk = sock.recv(65536)
            if not chunk:
                return Outcome(None, time.perf_counter() - started, "closed without an answer")
            data += chunk
            response = parser.feed(chunk)
        rest = parser.rest
        if not case.websocket or response.status != 101:
            body = rest
            while (chunk := _recv(sock)) and len(body) < 65536:
                body += chunk
            return Outcome(response.status, time.perf_counter() - started, _message(body))
        started = time.perf_counter()
        sock.sendall(case.frames)
        decoder = ws.FrameDecoder(expect_masked=False)
        frames = decoder.feed(rest)
        while not any(f.opcode == ws.Opcode.CLOSE for f in frames):
            chunk = _recv(sock)
            if not chunk:
                return Outcome(None, time.perf_counter() - started, "closed without a CLOSE frame")
            frames += decoder.feed(chunk)
        close = next(f for f in frames if f.opcode == ws.Opcode.CLOSE)
        code, reason = ws.parse_close_payload(close.payload)
        texts = [f.payload.decode("utf-8", "replace") for f in frames if f.opcode == ws.Opcode.TEXT]
        return Outcome(code, time.perf_counter() - started, _message(texts[-1].encode()) if texts else reason)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except (ConnectionResetError, socket.timeout):
        return b""


def _message(body: bytes) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body[:80].decode("utf-8", "replace")
