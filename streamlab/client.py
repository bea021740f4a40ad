"""A raw-socket client that times every byte and every event: the measuring instrument.

HTTP libraries are built to hide what we want to see: when each byte arrived,
how many bytes framed each piece of text, whether the stream ended with its
end marker or was simply cut. So this client writes its requests by hand,
reads with plain ``recv`` calls, and parses with the same sans-IO modules the
server uses (``http``, ``sse``, ``websocket``). Every ``recv`` and every
event is stamped with the time since the request was written, into a
``Trace``.

    trace = stream_sync(port, "Tell me about ferries", 30)
    trace.first_text, trace.end, trace.ratio

Each coroutine has a ``*_sync`` twin for scripts and notebooks.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, TypeVar

from . import sse
from . import websocket as ws
from .aio import run_sync
from .http import BodyReader, IncompleteBody, Response, ResponseHeadParser

__all__ = [
    "ClientError",
    "Reply",
    "Trace",
    "TraceEvent",
    "cancel_generation",
    "cancel_generation_sync",
    "complete",
    "complete_sync",
    "create_generation",
    "create_generation_sync",
    "events",
    "events_sync",
    "fetch",
    "fetch_sync",
    "get_json",
    "get_json_sync",
    "last_id",
    "post",
    "post_sync",
    "request_body",
    "resume",
    "resume_sync",
    "stream",
    "stream_sync",
    "wait_log",
    "wait_log_sync",
    "websocket",
    "websocket_sync",
]


# --------------------------------------------------------------------------
# What a request looked like from the reader's side
# --------------------------------------------------------------------------


@dataclass
class TraceEvent:
    """One event as the reader got it.

    ``t`` is seconds since the request was written; ``kind`` is ``text``,
    ``end``, ``done``, ``ping``, ``error``, ``close``...; ``nbytes`` is the
    event's size as encoded on the wire (an SSE event without its chunk
    framing, a whole WebSocket frame), where known; ``data`` the parsed JSON;
    ``id`` the stream's last event id when it arrived (SSE ids are sticky),
    None on a stream without ids: what a reconnect sends as ``Last-Event-ID``.
    """

    t: float
    kind: str
    text: str = ""
    nbytes: int | None = None
    data: Any = None
    id: str | None = None


@dataclass
class Trace:
    """Everything one request did on the wire, with times relative to ``sent``.

    ``complete`` is True only when the end marker arrived (``[DONE]``, the
    WebSocket ``done`` message, or a whole ``/complete`` body): a connection
    that just closes looks like a finished answer to many clients, and is
    recorded here as truncated. ``left`` is True when this client walked
    away on purpose (``stop_after``, ``leave_after``).
    """

    way: str
    sent: float = 0.0
    chunks: list[tuple[float, int]] = field(default_factory=list)
    events: list[TraceEvent] = field(default_factory=list)
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    request_id: str | None = None
    text: str = ""
    stop_reason: str | None = None
    tokens: int | None = None
    complete: bool = False
    left: bool = False
    error: Any = None
    close_code: int | None = None
    body: bytes = b""
    first_byte: float | None = None
    first_text: float | None = None
    end: float | None = None
    total_bytes: int = 0

    @property
    def text_bytes(self) -> int:
        """Bytes of text the reader got, in UTF-8."""
        return len(self.text.encode("utf-8"))

    @property
    def ratio(self) -> float:
        """Bytes on the wire per byte of text: the price of each way of delivering."""
        return self.total_bytes / self.text_bytes if self.text_bytes else float("nan")

    @property
    def text_events(self) -> list[TraceEvent]:
        return [e for e in self.events if e.kind == "text" and e.text]

    def gaps(self) -> list[float]:
        """Seconds between consecutive text events: what the reader feels as stutter."""
        times = [e.t for e in self.text_events]
        return [b - a for a, b in zip(times, times[1:])]

    def summary(self) -> dict[str, Any]:
        """One row for a table."""
        return {
            "way": self.way,
            "status": self.status,
            "first_text_s": self.first_text,
            "end_s": self.end,
            "text_events": len(self.text_events),
            "total_bytes": self.total_bytes,
            "text_bytes": self.text_bytes,
            "ratio": self.ratio,
            "stop_reason": self.stop_reason,
            "complete": self.complete,
        }

    # -- recording (used while reading) ------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self.sent

    def got_bytes(self, nbytes: int) -> float:
        """Record one ``recv``; return its time."""
        t = self.now()
        self.chunks.append((t, nbytes))
        self.total_bytes += nbytes
        if self.first_byte is None:
            self.first_byte = t
        return t

    def got_event(
        self, t: float, kind: str, text: str = "", nbytes: int | None = None, data: Any = None
    ) -> None:
        self.events.append(TraceEvent(t, kind, text, nbytes, data))
        if text:
            self.text += text
            if self.first_text is None:
                self.first_text = t

    def got_end(self, t: float, info: Any) -> None:
        """The end marker, with whatever it says about how the answer ended."""
        if isinstance(info, dict):
            self.stop_reason = info.get("stop_reason", self.stop_reason)
            self.tokens = info.get("tokens", self.tokens)
            self.request_id = info.get("id") or self.request_id
        self.end = t

    def got_error(self, t: float, error: Any, nbytes: int | None = None) -> None:
        self.error = error.get("error", error) if isinstance(error, dict) else error
        self.stop_reason = "error"
        self.got_event(t, "error", nbytes=nbytes, data=error)

    def got_head(self, response: Response) -> None:
        self.status = response.status
        self.headers = dict(response.headers)
        self.request_id = self.headers.get("x-request-id")

    def finish(self) -> None:
        if self.end is None and self.chunks:
            self.end = self.chunks[-1][0]


class ClientError(Exception):
    """A request answered with an error status."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


def request_body(
    prompt: str,
    max_tokens: int = 100,
    *,
    seed: int | None = None,
    chat: bool | None = None,
    ignore_eos: bool | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The request JSON; fields left at None are left to the server's defaults."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens}
    for name, value in (("seed", seed), ("chat", chat), ("ignore_eos", ignore_eos)):
        if value is not None:
            body[name] = value
    body.update(extra or {})
    return body


# --------------------------------------------------------------------------
# Socket helpers
# --------------------------------------------------------------------------


async def _connect(host: str, port: int, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # our small writes go out at once
    return reader, writer


async def _recv(reader: asyncio.StreamReader, size: int, until: float) -> bytes | None:
    """One read; None when ``until`` (a ``perf_counter`` time) passes first."""
    left = until - time.perf_counter()
    if left <= 0:
        return None
    try:
        return await asyncio.wait_for(reader.read(size), left)
    except asyncio.TimeoutError:
        return None
    except ConnectionError:
        return b""


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 2.0)
    except (OSError, asyncio.TimeoutError):
        pass


def _host_header(host: str, port: int) -> str:
    return f"{host}:{port}"


# --------------------------------------------------------------------------
# HTTP: /complete and /stream
# --------------------------------------------------------------------------


class _ResponseReading:
    """Response bytes in, trace entries out: head, then body, then SSE events if it is a stream."""

    def __init__(self, trace: Trace, method: str = "POST") -> None:
        self.trace = trace
        self.method = method
        self.head = ResponseHeadParser()
        self.body: BodyReader | None = None
        self.events: sse.EventStreamParser | None = None
        self.raw = bytearray()
        self.done = False

    def feed(self, data: bytes, t: float) -> None:
        if self.body is None:
            response = self.head.feed(data)
            if response is None:
                return
            data = self.head.rest
            if 100 <= response.status < 200 and response.status != 101:
                # "100 Continue" and friends are interim: the real response follows.
                self.head = ResponseHeadParser()
                self.feed(data, t)
                return
            self.trace.got_head(response)
            self.body = BodyReader(response, self.method)
            if (response.header("content-type") or "").startswith("text/event-stream"):
                self.events = sse.EventStreamParser()
                self.trace.way = "stream"
        for piece in self.body.feed(data):
            self.raw += piece
            if self.events is not None:
                self._feed_events(piece, t)
        if self.body.done:
            self._body_done(t)

    def _feed_events(self, piece: bytes, t: float) -> None:
        assert self.events is not None
        comments = self.events.comments
        for event in self.events.feed(piece):
            recorded = len(self.trace.events)
            self._on_event(event, t)
            if event.id and len(self.trace.events) > recorded:
                self.trace.events[-1].id = event.id
        for _ in range(self.events.comments - comments):
            self.trace.got_event(t, "ping", data=self.events.last_comment)

    def _on_event(self, event: sse.Event, t: float) -> None:
        trace = self.trace
        nbytes = len(sse.encode_event(event.data, event=None if event.event == "message" else event.event))
        if event.event == "message" and event.data == sse.DONE:
            trace.complete = True
            trace.got_event(t, "done", nbytes=nbytes)
            trace.end = t
            return
        try:
            data = json.loads(event.data)
        except ValueError:
            data = event.data
        if event.event == "end":
            trace.got_event(t, "end", nbytes=nbytes, data=data)
            trace.got_end(t, data)
        elif event.event == "error":
            trace.got_error(t, data, nbytes)
        elif isinstance(data, dict) and "text" in data:
            trace.got_event(t, "text", data["text"], nbytes, data)
        else:
            trace.got_event(t, event.event, nbytes=nbytes, data=data)

    def _body_done(self, t: float) -> None:
        self.done = True
        trace = self.trace
        trace.body = bytes(self.raw)
        if self.events is not None:
            return
        try:
            data = json.loads(trace.body) if trace.body else None
        except ValueError:
            data = trace.body
        if trace.status == 200 and isinstance(data, dict) and "text" in data:
            trace.got_event(t, "text", data["text"], len(trace.body), data)
            trace.got_end(t, data)
            trace.complete = True
        elif trace.status is not None and trace.status >= 400:
            trace.got_error(t, data, len(trace.body))

    def eof(self) -> None:
        """The server closed: a close-delimited body ends here; any other is truncated."""
        if self.body is None or self.done:
            return
        try:
            self.body.eof()
        except IncompleteBody:
            return
        self._body_done(self.trace.now())


def _post_head(path: str, host: str, port: int, length: int, http10: bool) -> bytes:
    version = "HTTP/1.0" if http10 else "HTTP/1.1"
    lines = [
        f"POST {path} {version}",
        f"Host: {_host_header(host, port)}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_response(
    reader: asyncio.StreamReader,
    reading: "_ResponseReading",
    trace: Trace,
    path: str,
    timeout: float,
    read_size: int,
    stop_after: int | None,
    leave_after: float | None = None,
) -> None:
    """Read until the response is done, the reader leaves (after N events or S seconds), or EOF."""
    deadline = trace.sent + timeout
    leave_at = trace.sent + leave_after if leave_after is not None else float("inf")
    while not reading.done:
        data = await _recv(reader, read_size, min(deadline, leave_at))
        if data is None:
            if time.perf_counter() >= leave_at:
                trace.left = True
                break
            raise TimeoutError(f"no complete response from {path} within {timeout} s")
        if not data:
            reading.eof()
            break
        reading.feed(data, trace.got_bytes(len(data)))
        if stop_after is not None and len(trace.text_events) >= stop_after and not reading.done:
            trace.left = True
            break


async def post(
    port: int,
    path: str,
    body: dict[str, Any],
    *,
    host: str = "127.0.0.1",
    stop_after: int | None = None,
    leave_after: float | None = None,
    timeout: float = 120.0,
    read_size: int = 65536,
    http10: bool = False,
) -> Trace:
    """POST ``body`` as JSON and trace the response, whatever its kind.

    ``stop_after=N`` closes the socket after N text events and
    ``leave_after=S`` S seconds after sending: the reader walking away,
    which only the server's disconnect watch can notice. ``http10`` sends an
    HTTP/1.0 request, as nginx does to its upstreams by default.
    """
    payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
    trace = Trace(way=path.strip("/") or "post")
    reading = _ResponseReading(trace)
    reader, writer = await _connect(host, port, timeout)
    try:
        trace.sent = time.perf_counter()
        writer.write(_post_head(path, host, port, len(payload), http10) + payload)
        await writer.drain()
        await _read_response(reader, reading, trace, path, timeout, read_size, stop_after, leave_after)
    finally:
        await _close(writer)
    trace.finish()
    return trace


async def ask(
    port: int,
    path: str,
    prompt: str,
    max_tokens: int = 100,
    *,
    seed: int | None = None,
    chat: bool | None = None,
    ignore_eos: bool | None = None,
    extra: dict[str, Any] | None = None,
    **options: Any,
) -> Trace:
    """POST a generation request to ``path`` (``options`` go to ``post``)."""
    body = request_body(prompt, max_tokens, seed=seed, chat=chat, ignore_eos=ignore_eos, extra=extra)
    return await post(port, path, body, **options)


async def complete(port: int, prompt: str, max_tokens: int = 100, **kwargs: Any) -> Trace:
    """``POST /complete``: the whole answer in one body (keywords as for ``ask``)."""
    return await ask(port, "/complete", prompt, max_tokens, **kwargs)


async def stream(port: int, prompt: str, max_tokens: int = 100, **kwargs: Any) -> Trace:
    """``POST /stream``: one Server-Sent Event per piece (keywords as for ``ask``)."""
    return await ask(port, "/stream", prompt, max_tokens, **kwargs)


# --------------------------------------------------------------------------
# Resumable streams: GET /generations/{id}/events
# --------------------------------------------------------------------------


def _get_head(path: str, host: str, port: int, last_event_id: str | None) -> bytes:
    """The request a browser's ``EventSource`` sends (a reconnect adds ``Last-Event-ID``)."""
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {_host_header(host, port)}",
        "Accept: text/event-stream",
        "Cache-Control: no-cache",
        "Connection: close",
    ]
    if last_event_id is not None:
        lines.append(f"Last-Event-ID: {last_event_id}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def events(
    port: int,
    path: str,
    *,
    last_event_id: str | int | None = None,
    stop_after: int | None = None,
    timeout: float = 120.0,
    host: str = "127.0.0.1",
    read_size: int = 65536,
) -> Trace:
    """``GET path`` as an ``EventSource`` would, and trace every event with its ``id``.

    ``last_event_id`` goes out as ``Last-Event-ID``: "I have everything up
    to that one". ``stop_after=N`` drops the connection after N text events.
    The trace is ``complete`` once the ``end`` event arrived. A ``204``
    (the server has nothing more for us) leaves ``status`` 204 and no events.
    """
    trace = Trace(way="events")
    reading = _ResponseReading(trace, "GET")
    reader, writer = await _connect(host, port, timeout)
    last = None if last_event_id is None else str(last_event_id)
    try:
        trace.sent = time.perf_counter()
        writer.write(_get_head(path, host, port, last))
        await writer.drain()
        await _read_response(reader, reading, trace, path, timeout, read_size, stop_after)
    finally:
        await _close(writer)
    trace.way = "events"
    trace.complete = trace.complete or any(e.kind == "end" for e in trace.events)
    trace.finish()
    return trace


def last_id(trace: Trace) -> str | None:
    """The id of the last event in ``trace`` that had one: what a reconnect sends as ``Last-Event-ID``."""
    return next((e.id for e in reversed(trace.events) if e.id is not None), None)


async def resume(
    port: int, generation_id: str, *, drop_after: int, timeout: float = 120.0, host: str = "127.0.0.1"
) -> tuple[Trace, Trace]:
    """A network blip, as an ``EventSource`` lives it: read, drop, reconnect with ``Last-Event-ID``.

    Reads the generation's events, drops the connection after
    ``drop_after`` text events, reconnects sending the last id it saw, and
    reads to the end. Returns both traces. From a server that keeps its events, the second
    starts right after the first, and their texts join into the whole
    answer; had the first ended before any id, the second starts over.
    """
    path = f"/generations/{generation_id}/events"
    first = await events(port, path, stop_after=drop_after, timeout=timeout, host=host)
    second = await events(port, path, last_event_id=last_id(first), timeout=timeout, host=host)
    return first, second


# --------------------------------------------------------------------------
# WebSocket: /ws
# --------------------------------------------------------------------------


def _frame_size(payload: int) -> int:
    """Bytes of an unmasked frame (server to client) carrying ``payload`` bytes."""
    return payload + (2 if payload <= 125 else 4 if payload <= 0xFFFF else 10)


class _WebSocketReading:
    """Frames in, trace entries out; answers pings and CLOSE, says stop or leaves when told."""

    def __init__(
        self, trace: Trace, writer: asyncio.StreamWriter, stop_after: int | None, say_stop: bool
    ) -> None:
        self.trace = trace
        self.writer = writer
        self.conn = ws.Connection(client=True)
        self.stop_after = stop_after
        self.say_stop = say_stop
        self.said_stop = False
        self.finished = False

    def feed(self, data: bytes, t: float) -> None:
        for event in self.conn.receive(data):
            if isinstance(event, ws.TextMessage):
                self._on_message(event.text, t)
            elif isinstance(event, ws.Ping):
                self.trace.got_event(t, "ping", nbytes=_frame_size(len(event.payload)))
                self.writer.write(self.conn.send_pong(event.payload))
            elif isinstance(event, ws.CloseReceived):
                self.trace.close_code = event.code
                self.trace.got_event(
                    t, "close", event.reason, _frame_size(2 + len(event.reason.encode())), event.code
                )
                if not self.conn.close_sent:
                    self.writer.write(
                        self.conn.send_close(event.code if ws.is_valid_close_code(event.code) else 1000)
                    )
                self.finished = True
                return
        self._maybe_leave()

    def _on_message(self, text: str, t: float) -> None:
        trace = self.trace
        nbytes = _frame_size(len(text.encode("utf-8")))
        try:
            data = json.loads(text)
        except ValueError:
            data = text
        if not isinstance(data, dict):
            trace.got_event(t, "message", nbytes=nbytes, data=data)
        elif "text" in data:
            trace.got_event(t, "text", data["text"], nbytes, data)
        elif data.get("done"):
            trace.complete = True
            trace.got_event(t, "done", nbytes=nbytes, data=data)
            trace.got_end(t, data)
        elif "error" in data:
            trace.request_id = data.get("id") or trace.request_id
            trace.got_error(t, data, nbytes)
        else:
            trace.got_event(t, "message", nbytes=nbytes, data=data)

    def _maybe_leave(self) -> None:
        if self.stop_after is None or self.finished or len(self.trace.text_events) < self.stop_after:
            return
        if self.say_stop:
            if not self.said_stop:
                self.writer.write(self.conn.send_text(json.dumps({"stop": True})))
                self.said_stop = True
            return
        # Leave without a word about the answer: CLOSE, then hang up.
        self.writer.write(self.conn.send_close(1001, "going away"))
        self.trace.left = True
        self.finished = True


async def _handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    trace: Trace,
    *,
    host: str,
    port: int,
    path: str,
    origin: str | None,
    deadline: float,
    read_size: int,
) -> tuple[str, bytes] | None:
    """Send the upgrade request and read the answer; return (key, early frame bytes), or None if refused."""
    key = ws.new_key()
    trace.sent = time.perf_counter()
    writer.write(ws.client_handshake(_host_header(host, port), path, key, origin=origin))
    await writer.drain()
    reading = _ResponseReading(trace, "GET")
    while trace.status is None:
        data = await _recv(reader, read_size, deadline)
        if data is None:
            raise TimeoutError("no answer to the WebSocket handshake")
        if not data:
            raise ConnectionError("connection closed during the WebSocket handshake")
        reading.feed(data, trace.got_bytes(len(data)))
    if trace.status == 101:
        ws.check_server_response(trace.status, trace.headers, key)
        return key, reading.head.rest
    while not reading.done:  # a refusal: read its JSON error body
        data = await _recv(reader, read_size, deadline)
        if not data:
            reading.eof()
            break
        reading.feed(data, trace.got_bytes(len(data)))
    return None


async def websocket(
    port: int,
    prompt: str,
    max_tokens: int = 100,
    *,
    host: str = "127.0.0.1",
    stop_after: int | None = None,
    say_stop: bool = False,
    seed: int | None = None,
    chat: bool | None = None,
    ignore_eos: bool | None = None,
    extra: dict[str, Any] | None = None,
    path: str = "/ws",
    origin: str | None = None,
    timeout: float = 120.0,
    read_size: int = 65536,
) -> Trace:
    """Open a WebSocket, send the request message, trace every frame until CLOSE.

    ``sent`` is when the upgrade request was written, so the handshake's
    round trip counts, as it would for a user. ``stop_after=N`` acts after N
    text messages: with ``say_stop`` it sends ``{"stop": true}`` and reads on
    to the ``done`` message; without, it sends CLOSE and hangs up.
    """
    trace = Trace(way="ws")
    reader, writer = await _connect(host, port, timeout)
    try:
        deadline = time.perf_counter() + timeout
        shook = await _handshake(
            reader,
            writer,
            trace,
            host=host,
            port=port,
            path=path,
            origin=origin,
            deadline=deadline,
            read_size=read_size,
        )
        if shook is None:
            trace.finish()
            return trace
        _, early = shook
        reading = _WebSocketReading(trace, writer, stop_after, say_stop)
        body = request_body(prompt, max_tokens, seed=seed, chat=chat, ignore_eos=ignore_eos, extra=extra)
        writer.write(reading.conn.send_text(json.dumps(body, ensure_ascii=False)))
        await writer.drain()
        if early:
            reading.feed(early, trace.now())
        while not reading.finished:
            data = await _recv(reader, read_size, deadline)
            if data is None:
                raise TimeoutError(f"the WebSocket answer did not end within {timeout} s")
            if not data:
                break
            reading.feed(data, trace.got_bytes(len(data)))
            await writer.drain()
    finally:
        await _close(writer)
    trace.finish()
    return trace


# --------------------------------------------------------------------------
# Small JSON requests: /health, /log
# --------------------------------------------------------------------------


@dataclass
class Reply:
    """A whole small response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def fetch(
    port: int,
    method: str,
    path: str,
    *,
    body: bytes | dict | None = None,
    headers: list[tuple[str, str]] | None = None,
    host: str = "127.0.0.1",
    timeout: float = 30.0,
) -> Reply:
    """One request, one whole response (any status): for small JSON endpoints and error cases."""
    payload = json.dumps(body).encode("utf-8") if isinstance(body, dict) else (body or b"")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {_host_header(host, port)}", "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    lines += [f"{name}: {value}" for name, value in headers or []]
    reader, writer = await _connect(host, port, timeout)
    trace = Trace(way="fetch")
    reading = _ResponseReading(trace, method)
    try:
        trace.sent = time.perf_counter()
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()
        while not reading.done:
            data = await _recv(reader, 65536, trace.sent + timeout)
            if data is None:
                raise TimeoutError(f"no response to {method} {path} within {timeout} s")
            if not data:
                reading.eof()
                break
            reading.feed(data, trace.got_bytes(len(data)))
    finally:
        await _close(writer)
    if trace.status is None:
        raise ConnectionError(f"{method} {path}: connection closed without a response")
    if not reading.done:
        raise IncompleteBody(f"{method} {path}: response body cut short")
    return Reply(trace.status, trace.headers, bytes(reading.raw))


async def get_json(port: int, path: str, *, host: str = "127.0.0.1", timeout: float = 30.0) -> Any:
    """``GET path`` and decode its JSON; an error status raises ``ClientError``."""
    reply = await fetch(port, "GET", path, host=host, timeout=timeout)
    if reply.status >= 400:
        raise ClientError(reply.status, reply.body.decode("utf-8", "replace"))
    return reply.json()


async def create_generation(
    port: int, body: dict[str, Any], *, host: str = "127.0.0.1", timeout: float = 30.0
) -> dict[str, Any]:
    """``POST /generations``: start an answer; its ``id``, ``conversation_id``, ``message_id``, ``events``."""
    reply = await fetch(port, "POST", "/generations", body=body, host=host, timeout=timeout)
    if reply.status != 201:
        raise ClientError(reply.status, reply.body.decode("utf-8", "replace"))
    return reply.json()


async def cancel_generation(
    port: int, generation_id: str, *, host: str = "127.0.0.1", timeout: float = 30.0
) -> dict[str, Any]:
    """``POST /generations/{id}/cancel``: the stop button; returns ``{"id", "status"}`` once it stopped."""
    path = f"/generations/{generation_id}/cancel"
    reply = await fetch(port, "POST", path, body=b"", host=host, timeout=timeout)
    if reply.status >= 400:
        raise ClientError(reply.status, reply.body.decode("utf-8", "replace"))
    return reply.json()


async def wait_log(
    port: int, request_id: str, timeout: float = 60.0, *, host: str = "127.0.0.1", interval: float = 0.05
) -> dict[str, Any]:
    """Poll ``/log/{id}`` until the server has finished with that request.

    The client's view ends when it stops reading; the server's (how many
    tokens it generated, how it noticed) may end a token or a whole answer
    later. This is how an experiment waits for it.
    """
    deadline = time.perf_counter() + timeout
    while True:
        record = await get_json(port, f"/log/{request_id}", host=host)
        if record.get("done"):
            return record
        if time.perf_counter() > deadline:
            raise TimeoutError(f"request {request_id} not done after {timeout} s: {record}")
        await asyncio.sleep(interval)


# --------------------------------------------------------------------------
# Synchronous twins
# --------------------------------------------------------------------------

T = TypeVar("T")


def _sync(coroutine_function: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """The same call, run to completion: a script and a notebook cell use it alike."""

    @functools.wraps(coroutine_function)
    def run(*args: Any, **kwargs: Any) -> T:
        return run_sync(coroutine_function(*args, **kwargs))

    name = coroutine_function.__name__
    run.__doc__ = f"Synchronous ``{name}``, for scripts and notebooks.\n\n{coroutine_function.__doc__}"
    return run


post_sync = _sync(post)
complete_sync = _sync(complete)
stream_sync = _sync(stream)
websocket_sync = _sync(websocket)
fetch_sync = _sync(fetch)
get_json_sync = _sync(get_json)
wait_log_sync = _sync(wait_log)
events_sync = _sync(events)
resume_sync = _sync(resume)
create_generation_sync = _sync(create_generation)
cancel_generation_sync = _sync(cancel_generation)
