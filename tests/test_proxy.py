"""Tests for streamlab.hops.proxy: the heads, and the proxy on real sockets (its forwarders: test_forwarders.py).

The integration tests run a small asyncio upstream written here (no model
needed) that sends an event stream on a schedule, and a raw-socket client
that notes when each event arrives. Everything binds to 127.0.0.1 on a free
port and stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamlab.net.errors import UserError
from streamlab.protocol.http_body import LAST_CHUNK, BodyReader, IncompleteBody, encode_chunk
from streamlab.protocol.http_head import (
    Request,
    RequestHeadParser,
    Response,
    ResponseHeadParser,
    parse_request_head,
    parse_response_head,
    response_head,
)
from streamlab.hops.exchange import (
    CLIENT_LEFT,
    COMPLETE,
    CUT_AFTER,
    IDLE_TIMEOUT,
    INTERRUPTED,
    OUTCOMES,
    UPSTREAM_CUT,
    UPSTREAM_ERROR,
)
from streamlab.hops.heads import client_response_head, upstream_request_head
from streamlab.hops.proxy import parse_args, serve_proxy
from streamlab.protocol.sse import EventStreamParser, encode_comment, encode_done, encode_event
from streamlab.net.processes import free_port

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[1]


def run(coro):
    return asyncio.run(coro)


def _response(*headers: tuple[str, str]) -> Response:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return parse_response_head(f"HTTP/1.1 200 OK\r\n{lines}\r\n".encode())


# --------------------------------------------------------------------------
# Heads (pure)
# --------------------------------------------------------------------------


def test_upstream_request_head_drops_hop_by_hop_and_adds_forwarding():
    request = parse_request_head(
        b"POST /stream HTTP/1.1\r\nHost: example.test\r\nConnection: keep-alive, X-Secret\r\n"
        b"X-Secret: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\n"
        b"X-Forwarded-For: 10.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    )
    head = upstream_request_head(request, 5, client_ip="127.0.0.1", upstream="127.0.0.1:9")
    sent = parse_request_head(head)
    assert (sent.method, sent.target, sent.version) == ("POST", "/stream", "HTTP/1.1")
    assert sent.header("host") == "example.test"  # kept as the reader sent it
    assert sent.header("x-forwarded-for") == "10.0.0.1, 127.0.0.1"
    assert sent.header("content-length") == "5"  # the de-chunked body
    assert sent.header("connection") == "close"
    assert sent.header("accept") == "text/event-stream"
    for name in ("x-secret", "keep-alive", "te", "transfer-encoding"):
        assert sent.header(name) is None, name


def test_upstream_request_head_fills_in_host_for_http10():
    request = parse_request_head(b"GET / HTTP/1.0\r\n\r\n")
    sent = parse_request_head(upstream_request_head(request, 0, client_ip="127.0.0.1", upstream="127.0.0.1:9"))
    assert sent.header("host") == "127.0.0.1:9"
    assert sent.header("content-length") is None


def test_upstream_request_head_keeps_a_websocket_upgrade():
    request = parse_request_head(
        b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    sent = parse_request_head(upstream_request_head(request, 0, client_ip="127.0.0.1", upstream="u"))
    assert sent.header("connection") == "Upgrade"
    assert sent.header("upgrade") == "websocket"
    assert sent.header("sec-websocket-key") == "dGhlIHNhbXBsZSBub25jZQ=="


def test_client_response_head_reframes_a_chunked_body():
    response = _response(
        ("Content-Type", "text/event-stream"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "keep-alive"),
        ("X-Accel-Buffering", "no"),
    )
    head = parse_response_head(client_response_head(response, "buffering block=64"))
    assert head.status == 200
    assert head.header("transfer-encoding") is None
    assert head.header("content-length") is None  # close-delimited
    assert head.header("connection") == "close"
    assert head.header("content-type") == "text/event-stream"
    assert head.header("x-accel-buffering") == "no"
    assert head.header("x-streamlab-proxy") == "buffering block=64"


def test_client_response_head_keeps_a_content_length():
    head = parse_response_head(client_response_head(_response(("Content-Length", "12")), "passthrough"))
    assert head.content_length() == 12


# --------------------------------------------------------------------------
# An upstream and a client, on real sockets
# --------------------------------------------------------------------------

Step = tuple[float, bytes]  # wait this many seconds, then send these body bytes
EVENT = encode_event("x" * 24)  # 32 bytes on the wire
assert len(EVENT) == 32


def sse_steps(n: int = 10, gap: float = 0.08, *, pause: float = 0.0, ping_every: float | None = None) -> list[Step]:
    """n events ``gap`` apart, then the end marker; optionally a pause after the first event."""
    steps: list[Step] = [(gap, EVENT)]
    if pause and ping_every:
        steps += [(ping_every, encode_comment("ping"))] * round(pause / ping_every)
    elif pause:
        steps.append((pause, b""))  # silence
    steps += [(gap, EVENT)] * (n - 1)
    steps.append((0.0, encode_done()))
    return steps


@dataclass
class Upstream:
    """A scripted server: a response head, then body bytes on a schedule.

    It watches its connection while sending, like our real server, and notes
    when the proxy closed it (``eof_after``, seconds after the request).
    """

    steps: list[Step]
    headers: list[tuple[str, str]] = field(default_factory=lambda: [("Content-Type", "text/event-stream")])
    chunked: bool = True
    raw_head: bytes | None = None  # send this instead of a proper head
    port: int = 0
    requests: list[tuple[Request, bytes]] = field(default_factory=list)
    eof_after: list[float] = field(default_factory=list)
    completed: int = 0

    @property
    def duration(self) -> float:
        return sum(delay for delay, _ in self.steps)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (ConnectionError, IncompleteBody):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser, request = RequestHeadParser(), None
        while request is None:
            data = await reader.read(65536)
            if not data:
                return
            request = parser.feed(data)
        body = BodyReader.for_request(request)
        pieces = body.feed(parser.rest)
        while not body.done:
            data = await reader.read(65536)
            if not data:
                body.eof()
            pieces += body.feed(data)
        self.requests.append((request, b"".join(pieces)))
        started = time.monotonic()
        closed = asyncio.Event()

        async def watch() -> None:
            with suppress(ConnectionError):
                while await reader.read(65536):
                    pass
            self.eof_after.append(time.monotonic() - started)
            closed.set()

        watcher = asyncio.create_task(watch())
        try:
            head = self.raw_head
            if head is None:
                head = response_head(200, self.headers, chunked=self.chunked)
            writer.write(head)
            for delay, data in self.steps:
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(closed.wait(), delay)
                if closed.is_set():
                    return  # the proxy hung up: stop "generating"
                writer.write(encode_chunk(data) if self.chunked else data)
                await writer.drain()
            if self.chunked:
                writer.write(LAST_CHUNK)
            await writer.drain()
            self.completed += 1
        finally:
            watcher.cancel()


@asynccontextmanager
async def upstream(steps: list[Step], **kwargs) -> AsyncIterator[Upstream]:
    up = Upstream(steps, **kwargs)
    tasks: set[asyncio.Task] = set()

    async def on_connect(reader, writer):
        task = asyncio.current_task()
        tasks.add(task)
        try:
            await up.handle(reader, writer)
        except asyncio.CancelledError:
            pass  # stopped at the end of a test (Python 3.11 logs a cancelled handler)
        finally:
            tasks.discard(task)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    up.port = server.sockets[0].getsockname()[1]
    try:
        yield up
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


@dataclass
class Trace:
    """What a client saw: the head, the body, and when each event and read arrived."""

    response: Response | None = None
    body: bytes = b""
    reads: list[tuple[float, int]] = field(default_factory=list)  # (seconds, body bytes)
    event_times: list[float] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    @property
    def first_event(self) -> float:
        return self.event_times[0]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"


async def fetch(
    port: int,
    request: bytes = b"GET /stream HTTP/1.1\r\nHost: test\r\n\r\n",
    *,
    leave_after: float | None = None,
) -> Trace:
    """Send raw request bytes; read the response, timing every event; maybe leave early."""
    trace = Trace()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(request)
    parser, body, sse = ResponseHeadParser(), None, EventStreamParser()
    try:
        while True:
            timeout = None if leave_after is None else leave_after - (time.monotonic() - started)
            try:
                data = await asyncio.wait_for(reader.read(65536), timeout)
            except asyncio.TimeoutError:
                return trace  # the reader leaves
            now = time.monotonic() - started
            if body is None:
                if not data:
                    return trace
                trace.response = parser.feed(data)
                if trace.response is None:
                    continue
                body, data = BodyReader(trace.response), parser.rest
            elif not data:
                body.eof()  # the end of a close-delimited body
            chunk = b"".join(body.feed(data)) if data else b""
            if chunk:
                trace.reads.append((now, len(chunk)))
                trace.body += chunk
                for event in sse.feed(chunk):
                    trace.event_times.append(now)
                    trace.events.append(event.data)
            if body.done:
                return trace
    finally:
        writer.close()


async def proxy_log(port: int) -> list[dict]:
    trace = await fetch(port, b"GET /_proxy/log HTTP/1.1\r\nHost: test\r\n\r\n")
    assert trace.response is not None and trace.response.status == 200
    return json.loads(trace.body)



# --------------------------------------------------------------------------
# Buffering and pass-through, timed
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("honor", "accel_header", "passthrough"),
    [(False, False, False), (False, True, False), (True, False, False), (True, True, True)],
    ids=["plain", "header-ignored", "honor-without-header", "honor-with-header"],
)
def test_first_event_time_depends_on_the_mode(honor, accel_header, passthrough):
    headers = [("Content-Type", "text/event-stream")]
    if accel_header:
        headers.append(("X-Accel-Buffering", "no"))

    async def main():
        async with upstream(sse_steps(), headers=headers) as up:
            async with serve_proxy(up.port, honor=honor) as proxy:
                trace = await fetch(proxy.port)
                return up, trace, await proxy_log(proxy.port)

    up, trace, log = run(main())
    assert trace.response.status == 200
    assert trace.done and len(trace.events) == 11
    assert trace.body == b"".join(data for _, data in up.steps)
    assert trace.response.header("transfer-encoding") is None  # re-framed: close-delimited
    (entry,) = log
    assert entry["outcome"] == COMPLETE and entry["error"] is None
    if passthrough:
        assert trace.response.header("x-streamlab-proxy") == "passthrough"
        assert trace.first_event < 0.3 * up.duration
        assert entry["writes"] == 11
    else:
        # The whole answer (366 bytes) is less than a block: it arrives at the end.
        assert trace.response.header("x-streamlab-proxy") == "buffering block=8192"
        assert trace.first_event >= 0.8 * up.duration
        assert entry["writes"] == 1
    assert entry["mode"] == trace.response.header("x-streamlab-proxy")
    assert entry["first_write_s"] is not None


def test_blocks_leave_when_full_and_the_remainder_at_the_end():
    async def main():
        async with upstream(sse_steps(10, gap=0.1)) as up:
            async with serve_proxy(up.port, block=64) as proxy:
                trace = await fetch(proxy.port)
                return up, trace, await proxy_log(proxy.port)

    up, trace, log = run(main())
    # Ten 32-byte events fill five 64-byte blocks, each written when its
    # second event arrives; the 14-byte end marker is the remainder.
    sizes = [size for _, size in trace.reads]
    assert sizes == [64] * 5 + [14]
    first_time = trace.reads[0][0]
    assert 0.18 <= first_time < 0.5  # with the second event, not the first
    assert trace.done and len(trace.events) == 11
    assert log[0]["writes"] == 6


def test_content_length_response_passes_with_its_length():
    async def main():
        body = b"0123456789" * 5
        headers = [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
        async with upstream([(0.0, body)], headers=headers, chunked=False) as up:
            async with serve_proxy(up.port, block=16) as proxy:
                return await fetch(proxy.port)

    trace = run(main())
    assert trace.response.content_length() == 50
    assert trace.body == b"0123456789" * 5


def test_a_cut_upstream_body_is_flushed_and_logged():
    async def main():
        # A chunked body whose last chunk never comes: the upstream just closes.
        raw = response_head(200, [("Content-Type", "text/event-stream")], chunked=True)
        async with upstream([(0.05, encode_chunk(EVENT))], raw_head=raw, chunked=False) as up:
            async with serve_proxy(up.port) as proxy:
                return await fetch(proxy.port), await proxy_log(proxy.port)

    trace, log = run(main())
    assert trace.body == EVENT  # what there was, flushed; the client cannot tell it was cut
    assert "closed after 32 body bytes" in log[0]["error"]
    assert log[0]["outcome"] == UPSTREAM_CUT


# --------------------------------------------------------------------------
# The reader leaves; the upstream goes quiet
# --------------------------------------------------------------------------


@pytest.mark.parametrize("honor", [False, True], ids=["buffering", "passthrough"])
def test_client_close_reaches_the_upstream(honor):
    headers = [("Content-Type", "text/event-stream"), ("X-Accel-Buffering", "no")]

    async def main():
        async with upstream(sse_steps(30, gap=0.1), headers=headers) as up:
            async with serve_proxy(up.port, honor=honor) as proxy:
                trace = await fetch(proxy.port, leave_after=0.35)
                for _ in range(100):  # give the upstream up to 1 s to notice
                    if up.eof_after:
                        break
                    await asyncio.sleep(0.01)
                return up, trace, await proxy_log(proxy.port)

    up, trace, log = run(main())
    assert up.eof_after, "the upstream never saw the proxy close"
    assert up.eof_after[0] < 0.35 + 1.0
    assert up.completed == 0
    assert log[0]["outcome"] == CLIENT_LEFT
    if honor:
        assert 2 <= len(trace.events) <= 4  # what arrived before the reader left
    else:
        assert trace.events == []  # still held in the buffer


def test_idle_timeout_kills_a_silent_stream():
    headers = [("Content-Type", "text/event-stream"), ("X-Accel-Buffering", "no")]

    async def main():
        async with upstream(sse_steps(4, gap=0.05, pause=1.0), headers=headers) as up:
            async with serve_proxy(up.port, honor=True, idle_timeout=0.3) as proxy:
                trace = await fetch(proxy.port)
                await asyncio.sleep(0.1)
                return up, trace, await proxy_log(proxy.port)

    up, trace, log = run(main())
    assert len(trace.events) == 1 and not trace.done  # cut after the first event
    assert log[0]["outcome"] == IDLE_TIMEOUT
    assert up.completed == 0 and up.eof_after


def test_idle_timeout_spares_a_stream_with_pings():
    headers = [("Content-Type", "text/event-stream"), ("X-Accel-Buffering", "no")]

    async def main():
        async with upstream(sse_steps(4, gap=0.05, pause=1.0, ping_every=0.1), headers=headers) as up:
            async with serve_proxy(up.port, honor=True, idle_timeout=0.3) as proxy:
                trace = await fetch(proxy.port)
                return up, trace, await proxy_log(proxy.port)

    up, trace, log = run(main())
    assert trace.done and len(trace.events) == 5
    assert log[0]["outcome"] == COMPLETE
    assert up.completed == 1


def test_idle_timeout_before_the_head_is_a_504():
    async def main():
        async with upstream([(2.0, b"")], raw_head=b"", chunked=False) as up:  # says nothing
            async with serve_proxy(up.port, idle_timeout=0.2) as proxy:
                return await fetch(proxy.port), await proxy_log(proxy.port)

    trace, log = run(main())
    assert trace.response.status == 504
    assert log[0]["outcome"] == IDLE_TIMEOUT and log[0]["mode"] == "error"  # the timeout, not an upstream error


# --------------------------------------------------------------------------
# Requests, errors, the log
# --------------------------------------------------------------------------


def test_request_is_forwarded_with_its_body_de_chunked():
    async def main():
        async with upstream([(0.0, b"ok")]) as up:
            async with serve_proxy(up.port) as proxy:
                request = (
                    b"POST /complete HTTP/1.1\r\nHost: reader.test\r\nTransfer-Encoding: chunked\r\n"
                    b"Content-Type: application/json\r\n\r\n"
                    + encode_chunk(b'{"prompt":')
                    + encode_chunk(b' "hi"}')
                    + LAST_CHUNK
                )
                trace = await fetch(proxy.port, request)
                return up, trace

    up, trace = run(main())
    assert trace.body == b"ok"
    ((request, body),) = up.requests
    assert body == b'{"prompt": "hi"}'
    assert request.header("content-length") == str(len(body))
    assert request.header("transfer-encoding") is None
    assert request.header("host") == "reader.test"
    assert request.header("x-forwarded-for") == "127.0.0.1"
    assert request.header("connection") == "close"


def test_expect_100_continue_is_answered_by_the_proxy():
    async def main():
        async with upstream([(0.0, b"ok")]) as up:
            async with serve_proxy(up.port) as proxy:
                reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
                writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
                interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                writer.write(b"{}")
                rest = await asyncio.wait_for(reader.read(), 5)
                writer.close()
                return up, interim, rest

    up, interim, rest = run(main())
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n") and rest.endswith(b"\r\n\r\nok")
    ((request, body),) = up.requests
    assert body == b"{}" and request.header("expect") is None


def test_h11_reads_the_proxied_response_as_complete():
    h11 = pytest.importorskip("h11")

    async def main():
        async with upstream(sse_steps(3, gap=0.01)) as up:
            async with serve_proxy(up.port, block=40) as proxy:
                reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
                writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
                raw = await asyncio.wait_for(reader.read(), 5)
                writer.close()
                return up, raw

    up, raw = run(main())
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/stream", headers=[("Host", "t")]))
    conn.receive_data(raw)
    conn.receive_data(b"")  # EOF ends a close-delimited body
    events = []
    while (event := conn.next_event()) is not h11.NEED_DATA and not isinstance(event, h11.ConnectionClosed):
        events.append(event)
    assert isinstance(events[0], h11.Response) and events[0].status_code == 200
    assert b"".join(e.data for e in events if isinstance(e, h11.Data)) == b"".join(d for _, d in up.steps)
    assert isinstance(events[-1], h11.EndOfMessage)


def test_upstream_down_is_a_502():
    async def main():
        async with serve_proxy(free_port()) as proxy:
            return await fetch(proxy.port), await proxy_log(proxy.port)

    trace, log = run(main())
    assert trace.response.status == 502
    assert "unreachable" in json.loads(trace.body)["error"]["message"]
    assert log[0]["mode"] == "error" and log[0]["status"] == 502 and log[0]["outcome"] == UPSTREAM_ERROR


def test_malformed_upstream_head_is_a_502():
    async def main():
        async with upstream([(0.0, b"")], raw_head=b"HTTP/1.1 two hundred OK\r\n\r\n") as up:
            async with serve_proxy(up.port) as proxy:
                return await fetch(proxy.port), await proxy_log(proxy.port)

    trace, log = run(main())
    assert trace.response.status == 502
    assert "malformed status line" in json.loads(trace.body)["error"]["message"]
    assert log[0]["outcome"] == UPSTREAM_ERROR


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /stream HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"GET /stream HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    ],
)
def test_bad_request_is_refused_without_reaching_the_upstream(request_bytes, status):
    async def main():
        async with upstream([(0.0, b"never")]) as up:
            async with serve_proxy(up.port) as proxy:
                return up, await fetch(proxy.port, request_bytes)

    up, trace = run(main())
    assert trace.response.status == status
    assert up.requests == []


def test_websocket_goes_through_as_a_tunnel():
    websockets = pytest.importorskip("websockets.asyncio.server")
    from websockets.asyncio.client import connect

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async def main():
        async with websockets.serve(echo, "127.0.0.1", 0) as server:
            port = next(iter(server.sockets)).getsockname()[1]
            async with serve_proxy(port) as proxy:
                async with connect(f"ws://127.0.0.1:{proxy.port}/ws") as ws:
                    await ws.send("héllo")
                    reply = await asyncio.wait_for(ws.recv(), 5)
                    await ws.send(b"\x00\x01")
                    binary = await asyncio.wait_for(ws.recv(), 5)
                await asyncio.sleep(0.05)
                return reply, binary, await proxy_log(proxy.port)

    reply, binary, log = run(main())
    assert (reply, binary) == ("héllo", b"\x00\x01")
    assert log[0]["mode"] == "tunnel" and log[0]["status"] == 101 and log[0]["outcome"] == COMPLETE


# --------------------------------------------------------------------------
# One outcome per exchange (the ones not met above)
# --------------------------------------------------------------------------


def test_a_malformed_body_after_the_head_is_an_upstream_error():
    async def main():
        raw = response_head(200, [("Content-Type", "text/event-stream")], chunked=True)
        async with upstream([(0.02, b"zz\r\nnot a chunk\r\n")], raw_head=raw, chunked=False) as up:
            async with serve_proxy(up.port, honor=True) as proxy:
                return await fetch(proxy.port), await proxy_log(proxy.port)

    trace, log = run(main())
    assert trace.response.status == 200 and trace.body == b""  # the head had gone: all it can do is close
    assert log[0]["outcome"] == UPSTREAM_ERROR and "chunk" in log[0]["error"]


def test_a_proxy_closed_in_the_middle_records_the_exchange_as_interrupted():
    headers = [("Content-Type", "text/event-stream"), ("X-Accel-Buffering", "no")]

    async def main():
        async with upstream(sse_steps(30, gap=0.1), headers=headers) as up:
            async with serve_proxy(up.port, honor=True) as proxy:
                reading = asyncio.create_task(fetch(proxy.port))
                await asyncio.sleep(0.3)
                assert proxy.log[0].outcome is None  # still running: no outcome yet
            trace = await reading
            return trace, list(proxy.log)

    trace, log = run(main())
    assert 1 <= len(trace.events) < 30
    assert [exchange.outcome for exchange in log] == [INTERRUPTED]
    assert INTERRUPTED in OUTCOMES and len(set(OUTCOMES)) == len(OUTCOMES)


# --------------------------------------------------------------------------
# The cutting hop (--cut-after): a clean end after N whole events
# --------------------------------------------------------------------------

SSE = [("Content-Type", "text/event-stream")]


def split_steps(n: int, gap: float = 0.03) -> list[Step]:
    """n events, each sent in two halves ``gap`` apart: no read of the proxy's ends where an event does."""
    steps: list[Step] = []
    for _ in range(n):
        steps += [(gap, EVENT[:13]), (gap, EVENT[13:])]
    return [*steps, (0.0, encode_done())]


def test_the_cut_ends_the_chunked_body_after_n_whole_events_and_closes_the_upstream():
    async def main():
        async with upstream(split_steps(10), headers=SSE) as up:
            async with serve_proxy(up.port, cut_after=3) as proxy:
                trace = await fetch(proxy.port)  # returns only at a clean end: a cut chunked body raises
                for _ in range(100):
                    if up.eof_after:
                        break
                    await asyncio.sleep(0.01)
                return up, trace, await proxy_log(proxy.port)

    up, trace, log = run(main())
    assert trace.response.header("transfer-encoding") == "chunked"
    assert trace.response.header("x-streamlab-proxy") == "cutting after=3"
    assert trace.body == EVENT * 3 and trace.events == ["x" * 24] * 3 and not trace.done
    assert up.eof_after and up.completed == 0  # the upstream was hung up on, mid-answer
    assert log[0]["outcome"] == CUT_AFTER and log[0]["mode"] == "cutting after=3"


def test_a_stream_shorter_than_the_cut_passes_whole_and_chunked():
    async def main():
        async with upstream(split_steps(2, gap=0.01), headers=SSE) as up:
            async with serve_proxy(up.port, cut_after=5) as proxy:
                return up, await fetch(proxy.port), await proxy_log(proxy.port)

    up, trace, log = run(main())
    assert trace.done and trace.body == EVENT * 2 + encode_done()
    assert trace.response.header("transfer-encoding") == "chunked"
    assert up.completed == 1 and log[0]["outcome"] == COMPLETE


def test_the_cutting_hop_leaves_other_responses_alone():
    async def main():
        body = b'{"data": [{"id": "fake"}]}'
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        async with upstream([(0.0, body)], headers=headers, chunked=False) as up:
            async with serve_proxy(up.port, block=1, cut_after=1) as proxy:
                return await fetch(proxy.port), await proxy_log(proxy.port)

    trace, log = run(main())
    assert trace.body == b'{"data": [{"id": "fake"}]}' and trace.response.content_length() == len(trace.body)
    assert log[0]["mode"] == "passthrough" and log[0]["outcome"] == COMPLETE


# --------------------------------------------------------------------------
# As a program
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "host", "port"),
    [
        (["--upstream", "8000"], "127.0.0.1", 8000),
        (["--upstream", "http://127.0.0.1:8001"], "127.0.0.1", 8001),
        (["--upstream", "localhost:8002"], "localhost", 8002),
        (["--upstream", "8003", "--upstream-host", "::1"], "::1", 8003),
    ],
)
def test_upstream_argument_takes_a_port_or_a_url(argv, host, port):
    args = parse_args(argv)
    assert (args.upstream_host, args.upstream) == (host, port)
    assert (args.block, args.honor, args.idle_timeout, args.port, args.cut_after) == (8192, False, None, 0, None)
    assert parse_args([*argv, "--cut-after", "8"]).cut_after == 8


def test_bad_arguments_are_refused():
    for argv in (["--upstream", "http://nowhere"], ["--upstream", "1", "--block", "0"], [],
                 ["--upstream", "1", "--cut-after", "0"]):
        with pytest.raises(UserError):  # one line, exit 2, from the cli wrapper
            parse_args(argv)


async def _start_program(*args: str) -> tuple[asyncio.subprocess.Process, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamlab", "proxy", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=ROOT, env=env,
    )
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    match = re.fullmatch(rb"streamlab: listening on http://127\.0\.0\.1:(\d+)\n", line)
    assert match, line
    return process, int(match.group(1))


def test_the_program_proxies_and_stops_on_sigterm():
    headers = [("Content-Type", "text/event-stream"), ("X-Accel-Buffering", "no")]

    async def main():
        async with upstream(sse_steps(5, gap=0.05), headers=headers) as up:
            process, port = await _start_program("--upstream", str(up.port), "--honor", "--block", "4096")
            try:
                trace = await fetch(port)
            finally:
                process.send_signal(signal.SIGTERM)
                code = await asyncio.wait_for(process.wait(), 10)
            stderr = await process.stderr.read()
            return trace, code, stderr

    trace, code, stderr = run(main())
    assert trace.done and trace.response.header("x-streamlab-proxy") == "passthrough"
    assert code == 0
    assert b"GET /stream -> 200 passthrough" in stderr


def test_the_program_cuts_after_n_events():
    async def main():
        async with upstream(sse_steps(6, gap=0.02), headers=SSE) as up:
            process, port = await _start_program("--upstream", str(up.port), "--cut-after", "2")
            try:
                trace = await fetch(port)
            finally:
                process.send_signal(signal.SIGTERM)
                await asyncio.wait_for(process.wait(), 10)
            return trace, await process.stderr.read()

    trace, stderr = run(main())
    assert trace.body == EVENT * 2 and trace.response.header("transfer-encoding") == "chunked"
    assert b"GET /stream -> 200 cutting after=2" in stderr and b"cut_after" in stderr


def test_the_program_exits_when_stdin_closes():
    async def main():
        process, _ = await _start_program("--upstream", str(free_port()), "--exit-on-stdin-eof")
        process.stdin.close()
        try:
            return await asyncio.wait_for(process.wait(), 10)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

    assert run(main()) == 0
