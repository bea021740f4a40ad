"""What a stranger might send a model server, and what it should answer: chapter 9's refusal table.

Each ``Case`` is raw bytes written to a fresh connection (and, for a
WebSocket, frames after the handshake), with the answer a careful server
gives: an HTTP status, or a WebSocket close code. ``probe`` sends one and
times the refusal. The same list drives the tests (every row asserted, over
a fake model, in milliseconds) and the chapter (against the real server), so
the table in the book is the table that is tested.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from streamlab.client import timed as client
from streamlab.protocol import websocket_frames
from streamlab.protocol import websocket_handshake
from streamlab.protocol.http_head import ResponseHeadParser

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
        return websocket_handshake.client_handshake(host or f"127.0.0.1:{port}", "/ws", websocket_handshake.new_key(), origin=origin)

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
    return websocket_frames.encode_frame(opcode, payload, mask=mask)


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
        decoder = websocket_frames.FrameDecoder(expect_masked=False)
        frames = decoder.feed(rest)
        while not any(f.opcode == websocket_frames.Opcode.CLOSE for f in frames):
            chunk = _recv(sock)
            if not chunk:
                return Outcome(None, time.perf_counter() - started, "closed without a CLOSE frame")
            frames += decoder.feed(chunk)
        close = next(f for f in frames if f.opcode == websocket_frames.Opcode.CLOSE)
        code, reason = websocket_frames.parse_close_payload(close.payload)
        texts = [f.payload.decode("utf-8", "replace") for f in frames if f.opcode == websocket_frames.Opcode.TEXT]
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


# --------------------------------------------------------------------------
# Chapter 9's experiments: run against live servers, return tidy rows
# --------------------------------------------------------------------------


def refusal_table(port: int, cases: list[Case] | None = None, *, tries: int = 3) -> list[dict]:
    """Every case against one server: what was sent, what was due, what came back, how fast.

    Each case is sent ``tries`` times; the time is the median (a single
    millisecond timing on a shared machine is mostly noise), and the answer is
    the one that came back every time, or the list of them when they differ.
    """
    rows = []
    for case in cases or CASES:
        outcomes = [probe(port, case) for _ in range(max(1, tries))]
        answers = sorted({o.answer for o in outcomes}, key=str)
        outcome = outcomes[0]
        answer = answers[0] if len(answers) == 1 else answers
        rows.append({
            "what a stranger sends": case.name,
            "expected": case.expect,
            "answer": answer,
            "as expected": answer == case.expect,
            "ms to refuse": round(statistics.median(o.seconds for o in outcomes) * 1000, 2),
            "says": outcome.message,
        })
    return rows


def digits(tokens: int) -> str:
    """A prompt of exactly ``tokens`` tokens for a SmolLM2/Llama-style tokenizer: one digit each."""
    return "1" * tokens


@dataclass
class Stall:
    """One run of the long-prompt experiment on one server (times in seconds from the reader's request)."""

    server: str
    reader: Any  # the Trace of the reader already streaming
    long_sent: float
    long_first_text: float | None
    long_end: float | None
    short_sent: float
    short_first_text: float | None  # after short_sent

    def gaps_during(self) -> list[tuple[float, float]]:
        """``(time, gap)`` of each of the reader's text events: how long it waited for that piece."""
        times = [e.t for e in self.reader.events if e.kind == "text"]
        return [(b, b - a) for a, b in zip(times, times[1:])]

    def row(self) -> dict:
        start, end = self.long_sent, self.long_first_text or self.long_end
        gaps = self.gaps_during()
        if end is None:
            end = gaps[-1][0] if gaps else start
        # A gap counts when it overlaps the prompt's reading: the piece that ends a
        # freeze usually arrives just after the long prompt's own first token.
        overlapping = [gap for t, gap in gaps if t >= start and t - gap <= end]
        meanwhile = [t for t, _ in gaps if start <= t <= end]
        return {
            "server": self.server,
            "long prompt read in (s)": None if self.long_first_text is None else round(self.long_first_text - self.long_sent, 2),
            "other reader's longest gap (s)": round(max(overlapping), 2) if overlapping else None,
            "other reader's pieces meanwhile": len(meanwhile),
            "5-token request: first text after (s)": None if self.short_first_text is None else round(self.short_first_text, 2),
        }


async def long_prompt_stall(port: int, server: str, *, prompt_tokens: int = 4000, reader_tokens: int = 4000,
                            short_tokens: int = 5, settle: float = 1.0, timeout: float = 600) -> Stall:
    """While one reader streams, a long prompt arrives, then a short request: who waits for whom?

    The reader's answer is a ``/generations`` resource, so that it can be
    stopped cleanly at the end (``cancel``) and its trace kept. ``settle``
    seconds after its first words the ``prompt_tokens``-token prompt is sent,
    and ``settle`` seconds later a request for ``short_tokens`` tokens. Read in
    one pass, the long prompt holds the model: the reader's stream stops and
    the short request waits for the whole prefill. Read in chunks, both slip
    in between the chunks.
    """
    body = {"chat": False, "ignore_eos": True, "seed": 0}
    created = await client.create_generation(port, {"prompt": "Tell me about lighthouses.",
                                                    "max_tokens": reader_tokens, **body})
    reader_task = asyncio.ensure_future(client.events(port, created["events"], timeout=timeout))
    start = time.perf_counter()
    while time.perf_counter() - start < 60:  # wait for the reader's first words
        state = await client.get_json(port, f"/generations/{created['id']}")
        if state["tokens"] > 0:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(settle)
    long_task = asyncio.ensure_future(client.post(
        port, "/stream", {"prompt": digits(prompt_tokens), "max_tokens": 1, **body}, timeout=timeout))
    await asyncio.sleep(settle)
    short = await client.post(port, "/stream", {"prompt": "Hello", "max_tokens": short_tokens, **body}, timeout=timeout)
    long = await long_task
    await client.cancel_generation(port, created["id"])
    reader = await reader_task
    return Stall(
        server=server,
        reader=reader,
        long_sent=long.sent - reader.sent,
        long_first_text=None if long.first_text is None else long.sent + long.first_text - reader.sent,
        long_end=None if long.end is None else long.sent + long.end - reader.sent,
        short_sent=short.sent - reader.sent,
        short_first_text=short.first_text,
    )


async def leave_during_prefill(port: int, server: str, *, prompt_tokens: int = 4000, leave_after: float = 2.0,
                               timeout: float = 600) -> dict:
    """A reader sends a long prompt and leaves ``leave_after`` seconds later: how much of it was still read?"""
    body = {"prompt": digits(prompt_tokens), "max_tokens": 5, "chat": False}
    known = {r["id"] for r in await client.get_json(port, "/log")}
    left_at = time.time() + leave_after
    await client.post(port, "/stream", body, leave_after=leave_after, timeout=timeout)
    mine = [r for r in await client.get_json(port, "/log") if r["id"] not in known]
    record = await client.wait_log(port, mine[0]["id"], timeout=timeout)
    return {
        "server": server,
        "prompt tokens": record["prompt_tokens"],
        "read before stopping": record["prompt_tokens_read"],
        "compute after the reader left (s)": round(max(0.0, record["ended"] - left_at), 2),
        "tokens generated": record["tokens"],
        "noticed by": record["stop_signal"],
    }


async def concurrent_first_tokens(port: int, n: int, *, max_tokens: int = 8, timeout: float = 600) -> list[dict]:
    """``n`` readers ask at the same moment: each one's status, place in line, first text and time per token.

    A reader the server puts in line is told so at once (streamlab's ``queued``
    event, with how many are ahead of it); ``ahead on arrival`` is None for one
    that started at once. Its time per token is the median gap between its
    pieces once they flow: what it reads at, whatever it waited before.
    """
    prompts = [{"prompt": f"Reader {i} asks about lighthouses.", "max_tokens": max_tokens, "chat": False,
                "ignore_eos": True, "seed": i} for i in range(n)]
    traces = await asyncio.gather(*(client.post(port, "/stream", body, timeout=timeout) for body in prompts))
    rows = []
    for t in traces:
        queued = [e.data for e in t.events if e.kind == "queued" and isinstance(e.data, dict)]
        gaps = t.gaps()
        rows.append({"readers": n, "status": t.status, "ahead on arrival": queued[0]["ahead"] if queued else None,
                     "first text (s)": t.first_text, "end (s)": t.end,
                     "time per token (s)": statistics.median(gaps) if gaps else None})
    return rows


async def admission_sweep(ports: dict[str, int], counts: list[int], *, max_tokens: int = 8) -> list[dict]:
    """For each server (by label) and each count of simultaneous readers, every reader's outcome."""
    rows = []
    for label, port in ports.items():
        for n in counts:
            for row in await concurrent_first_tokens(port, n, max_tokens=max_tokens):
                rows.append({"server": label, **row})
    return rows


def slowloris(port: int, *, connections: int = 20, interval: float = 0.5, limit: float = 60.0) -> dict:
    """``connections`` clients each send their request head one byte every ``interval`` seconds.

    Each would hold its connection for ever without a deadline on the whole
    head. Returns how many were cut, with which status, and after how long.
    """
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4096
    socks = [socket.create_connection(("127.0.0.1", port), timeout=limit) for _ in range(connections)]
    for sock in socks:
        sock.setblocking(False)
    started = time.perf_counter()
    cut: dict[int, tuple[float, bytes]] = {}
    position = 0
    try:
        while len(cut) < connections and time.perf_counter() - started < limit:
            for i, sock in enumerate(socks):
                if i in cut:
                    continue
                try:
                    data = sock.recv(65536)
                    cut[i] = (time.perf_counter() - started, data)
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    cut[i] = (time.perf_counter() - started, b"")
                    continue
                try:
                    sock.send(head[position % len(head):position % len(head) + 1])
                except OSError:
                    cut[i] = (time.perf_counter() - started, b"")
            position += 1
            time.sleep(interval)
    finally:
        for sock in socks:
            sock.close()
    statuses = [data[9:12].decode() if data.startswith(b"HTTP/1.1 ") else "closed" for _, data in cut.values()]
    return {
        "connections": connections,
        "byte every (s)": interval,
        "cut": len(cut),
        "answer": max(set(statuses), key=statuses.count) if statuses else None,
        "cut after (s)": round(max((t for t, _ in cut.values()), default=float("nan")), 2),
    }
