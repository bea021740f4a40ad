"""The timing client's WebSocket: handshake, request message, every frame traced until CLOSE.

The same instrument as ``streamlab.client.timed``, over ``/ws`` instead of
HTTP: the upgrade request is written by hand (``streamlab.protocol.websocket``
supplies the bytes and checks the answer), and every frame read is stamped
into the ``Trace`` with its size on the wire. ``streamlab.client.timed``
re-exports ``websocket`` and makes its ``websocket_sync`` twin, so
``client.websocket`` and ``client.websocket_sync`` keep working from there.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from streamlab.client.tracing import ResponseRecorder, Trace, record_message
from streamlab.client.wire import _close, _connect, _host_header, _recv, request_body
from streamlab.protocol import websocket as ws
from streamlab.protocol import websocket_frames
from streamlab.protocol import websocket_handshake

__all__ = ["websocket"]


def _frame_size(payload: int) -> int:
    """Bytes of an unmasked frame (server to client) carrying ``payload`` bytes."""
    return payload + (2 if payload <= 125 else 4 if payload <= 0xFFFF else 10)


class _WebSocketReading:
    """Frames in, trace entries out; answers pings and CLOSE, says stop or leaves when told."""

    def __init__(
        self, trace: Trace, writer: asyncio.StreamWriter, stop_after: int | None, say_stop: bool,
        hang_up: bool = False,
    ) -> None:
        self.trace = trace
        self.writer = writer
        self.conn = ws.Connection(client=True)
        self.stop_after = stop_after
        self.say_stop = say_stop
        self.hang_up = hang_up  # a lost connection says nothing: no CLOSE, the socket just goes
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
                        self.conn.send_close(event.code if websocket_frames.is_valid_close_code(event.code) else 1000)
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
        # Leave without a word about the answer: CLOSE, then hang up (or hang up only, the network lost).
        if not self.hang_up:
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
    key = websocket_handshake.new_key()
    trace.sent = time.perf_counter()
    writer.write(websocket_handshake.client_handshake(_host_header(host, port), path, key, origin=origin))
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
        websocket_handshake.check_server_response(trace.status, trace.headers, key)
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
    drop_after: int | None = None,
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
    ``drop_after=N`` loses the connection right after the Nth: no CLOSE, and
    whatever came after it in the same read is lost too (``Trace.cut_after``).
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
        reading = _WebSocketReading(trace, writer, drop_after if drop_after is not None else stop_after,
                                    say_stop and drop_after is None, hang_up=drop_after is not None)
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
    if drop_after is not None:
        trace.cut_after(drop_after)
    return trace
