"""A raw-socket client that times every byte and every event: the measuring instrument.

HTTP libraries are built to hide what we want to see: when each byte arrived,
how many bytes framed each piece of text, whether the stream ended with its
end marker or was simply cut. So this client writes its requests by hand,
reads with plain ``recv`` calls, and records what it reads into a ``Trace``
(``streamlab.client.trace``, whose recorders parse with the same sans-IO modules the
server uses: ``http``, ``sse``, ``websocket``). Every ``recv`` and every
event is stamped with the time since the request was written.

Every request names the server as ``Host: 127.0.0.1:PORT`` (or whatever
``host`` it connected to) and every POST says ``Content-Type:
application/json``; no request sends an ``Origin`` unless asked to (only a
browser's page has one).

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
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, TypeVar

from streamlab.protocol import websocket as ws
from streamlab.net.aio import run_sync
from streamlab.protocol.http_head import IncompleteBody
from streamlab.client.trace import ResponseRecorder, Trace, TraceEvent, last_id, record_message

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
    "post_request",
    "post_sync",
    "request_body",
    "resume",
    "resume_sync",
    "stream",
    "stream_sync",
    "sync_twin",
    "wait_log",
    "wait_log_sync",
    "websocket",
    "websocket_sync",
]


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
    connecting = asyncio.open_connection(host.strip("[]"), port)
    reader, writer = await asyncio.wait_for(connecting, timeout)
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
    """The ``Host`` value for ``host:port``; an IPv6 literal goes in brackets (``[::1]:8000``)."""
    name = host.strip("[]")
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


def _head(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# --------------------------------------------------------------------------
# HTTP: /complete and /stream
# --------------------------------------------------------------------------


def post_request(
    port: int,
    path: str,
    body: dict[str, Any],
    *,
    host: str = "127.0.0.1",
    http10: bool = False,
    headers: list[tuple[str, str]] | None = None,
) -> bytes:
    """The bytes of a JSON POST as this client writes it: the head, then ``body`` as UTF-8 JSON.

    ``Host`` names the server, ``Content-Type: application/json`` (a server
    refuses a POST without it, 415), ``Content-Length``, ``Connection: close``;
    then ``headers`` (``Accept-Encoding: gzip``, as a browser sends).
    """
    payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
    head = _head([
        f"POST {path} {'HTTP/1.0' if http10 else 'HTTP/1.1'}",
        f"Host: {_host_header(host, port)}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers or ()),
    ])
    return head + payload


async def _read_response(
    reader: asyncio.StreamReader,
    reading: ResponseRecorder,
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
    headers: list[tuple[str, str]] | None = None,
) -> Trace:
    """POST ``body`` as JSON and trace the response, whatever its kind.

    ``stop_after=N`` closes the socket after N text events and
    ``leave_after=S`` S seconds after sending: the reader walking away,
    which only the server's disconnect watch can notice. ``http10`` sends an
    HTTP/1.0 request, as nginx does to its upstreams by default.
    """
    trace = Trace(way=path.strip("/") or "post")
    reading = ResponseRecorder(trace)
    reader, writer = await _connect(host, port, timeout)
    try:
        trace.sent = time.perf_counter()
        writer.write(post_request(port, path, body, host=host, http10=http10, headers=headers))
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
    return _head(lines)


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
    reading = ResponseRecorder(trace, "GET")
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
                record_message(self.trace, event.text, _frame_size(len(event.text.encode("utf-8"))), t)
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
) -> bytes | None:
    """Send the upgrade request and read the answer: the frame bytes that came with it, None if refused."""
    key = ws.new_key()
    trace.sent = time.perf_counter()
    writer.write(ws.client_handshake(_host_header(host, port), path, key, origin=origin))
    await writer.drain()
    reading = ResponseRecorder(trace, "GET")
    while trace.status is None:
        data = await _recv(reader, read_size, deadline)
        if data is None:
            raise TimeoutError("no answer to the WebSocket handshake")
        if not data:
            raise ConnectionError("connection closed during the WebSocket handshake")
        reading.feed(data, trace.got_bytes(len(data)))
    if trace.status == 101:
        ws.check_server_response(trace.status, trace.headers, key)
        return reading.head.rest
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
    ``origin`` sends an ``Origin`` as a browser's page would; by default
    there is none, as from any program that is not a browser.
    """
    trace = Trace(way="ws")
    reader, writer = await _connect(host, port, timeout)
    try:
        deadline = time.perf_counter() + timeout
        early = await _handshake(
            reader, writer, trace, host=host, port=port, path=path, origin=origin, deadline=deadline,
            read_size=read_size,
        )
        if early is None:
            trace.finish()
            return trace
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
# Small JSON requests: /health, /log, /generations
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
    """One request, one whole response (any status): for small JSON endpoints and error cases.

    A ``body`` (a dict goes as JSON) is sent as ``Content-Type:
    application/json``. ``headers`` are added to the request; one that
    names a header this client writes itself (``Host``, ``Content-Type``,
    ``Connection``...) replaces it, so an error case can send a wrong one.
    """
    payload = json.dumps(body).encode("utf-8") if isinstance(body, dict) else (body or b"")
    ours = [("Host", _host_header(host, port)), ("Connection", "close")]
    if body is not None:
        ours += [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
    given = list(headers or [])
    replaced = {name.lower() for name, _ in given}
    fields = [(name, value) for name, value in ours if name.lower() not in replaced] + given
    lines = [f"{method} {path} HTTP/1.1"] + [f"{name}: {value}" for name, value in fields]
    reader, writer = await _connect(host, port, timeout)
    trace = Trace(way="fetch")
    reading = ResponseRecorder(trace, method)
    try:
        trace.sent = time.perf_counter()
        writer.write(_head(lines) + payload)
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
    """``POST /generations/{id}/cancel``: the stop button; returns ``{"id", "status"}`` once it stopped.

    The URL says it all, but the body is ``{}`` sent as JSON: the server
    refuses any POST that is not ``application/json``.
    """
    path = f"/generations/{generation_id}/cancel"
    reply = await fetch(port, "POST", path, body={}, host=host, timeout=timeout)
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


def sync_twin(coroutine_function: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """The same call, run to completion: a script and a notebook cell use it alike."""

    @functools.wraps(coroutine_function)
    def run(*args: Any, **kwargs: Any) -> T:
        return run_sync(coroutine_function(*args, **kwargs))

    name = coroutine_function.__name__
    run.__doc__ = f"Synchronous ``{name}``, for scripts and notebooks.\n\n{coroutine_function.__doc__}"
    return run


post_sync = sync_twin(post)
complete_sync = sync_twin(complete)
stream_sync = sync_twin(stream)
websocket_sync = sync_twin(websocket)
fetch_sync = sync_twin(fetch)
get_json_sync = sync_twin(get_json)
wait_log_sync = sync_twin(wait_log)
events_sync = sync_twin(events)
resume_sync = sync_twin(resume)
create_generation_sync = sync_twin(create_generation)
cancel_generation_sync = sync_twin(cancel_generation)
