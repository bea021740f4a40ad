"""Tests for streamlab.client.timed: the timing client against scripted fake servers, and one real one.

The Trace it fills, and the recorders that parse what it reads, are tested in test_trace.py.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

import pytest

from streamlab.client import timed as client
from streamlab.client import timed_websocket
from streamlab.client import tracing
from streamlab.protocol import sse
from streamlab.protocol import websocket as ws
from streamlab.protocol import websocket_handshake
from streamlab.client import tracing as trace_mod
from streamlab.client.tracing import Trace

pytestmark = pytest.mark.timeout(120)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


# --------------------------------------------------------------------------
# Scripted servers
# --------------------------------------------------------------------------


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[int]:
    """Run ``handler`` per connection on a free port; at the end, stop whatever it still does."""
    tasks: set[asyncio.Task] = set()

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await handler(reader, writer)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(guarded, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


def replying(*parts: bytes, delay: float = 0.0, close: bool = True) -> Handler:
    """A server that reads one request, then writes ``parts`` one by one."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for i, part in enumerate(parts):
            if i and delay:
                await asyncio.sleep(delay)
            writer.write(part)
            await writer.drain()
        if not close:
            await reader.read()  # hold the connection open until the client hangs up

    return handler


def sse_head(chunked: bool = True) -> bytes:
    framing = "Transfer-Encoding: chunked" if chunked else "Connection: close"
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Request-Id: 9\r\n{framing}\r\n\r\n".encode()
    )


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def text_event(text: str) -> bytes:
    return sse.encode_event(json.dumps({"text": text}, ensure_ascii=False))


END = sse.encode_event('{"stop_reason": "max_tokens", "tokens": 2}', event="end")
DONE = sse.encode_done()


def run(coro: Awaitable) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------


def test_stream_events_end_and_done():
    parts = [
        sse_head(),
        chunk(text_event("Hel")),
        chunk(text_event("lo")),
        chunk(END),
        chunk(DONE) + b"0\r\n\r\n",
    ]

    async def main() -> Trace:
        async with serving(replying(*parts, delay=0.05)) as port:
            return await client.stream(port, "hi", 2)

    trace = run(main())
    assert (
        trace.complete and trace.text == "Hello" and trace.stop_reason == "max_tokens" and trace.tokens == 2
    )
    assert [e.kind for e in trace.events] == ["text", "text", "end", "done"]
    assert trace.request_id == "9" and trace.way == "stream"
    assert trace.events[0].nbytes == len(text_event("Hel"))
    assert 0 < trace.first_byte <= trace.first_text < trace.end
    assert trace.total_bytes == sum(len(p) for p in parts) == sum(n for _, n in trace.chunks)
    assert len(trace.chunks) >= 4  # the delays kept the writes apart


def test_stream_without_done_is_truncated():
    async def main() -> Trace:
        async with serving(replying(sse_head(), chunk(text_event("Hel")), chunk(text_event("lo")))) as port:
            return await client.stream(port, "hi", 2)

    trace = run(main())
    assert trace.text == "Hello" and not trace.complete
    assert trace.end == trace.chunks[-1][0]


def test_close_delimited_stream_split_inside_characters():
    body = text_event("café 🦜") + END + DONE
    parts = [sse_head(chunked=False)] + [body[i : i + 3] for i in range(0, len(body), 3)]

    async def main() -> Trace:
        async with serving(replying(*parts, delay=0.001)) as port:
            return await client.stream(port, "hi", 2, http10=True)

    trace = run(main())
    assert trace.complete and trace.text == "café 🦜"


def test_pings_are_recorded():
    async def main() -> Trace:
        parts = [
            sse_head(),
            chunk(sse.encode_comment("ping")),
            chunk(text_event("a")),
            chunk(DONE) + b"0\r\n\r\n",
        ]
        async with serving(replying(*parts, delay=0.02)) as port:
            return await client.stream(port, "hi", 2)

    trace = run(main())
    assert [e.kind for e in trace.events] == ["ping", "text", "done"]
    assert trace.events[0].data == "ping"


def test_error_event_means_not_complete():
    error = sse.encode_event('{"error": {"status": 500, "message": "boom"}}', event="error")

    async def main() -> Trace:
        async with serving(replying(sse_head(), chunk(text_event("a")), chunk(error) + b"0\r\n\r\n")) as port:
            return await client.stream(port, "hi", 2)

    trace = run(main())
    assert not trace.complete and trace.stop_reason == "error" and trace.error["message"] == "boom"


def test_complete_body_arrives_at_once():
    body = json.dumps({"text": "Hello", "tokens": 2, "stop_reason": "eos", "id": "4"}).encode()
    head = f"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"

    async def main() -> Trace:
        async with serving(replying(head.encode(), body[:5], body[5:], delay=0.05)) as port:
            return await client.complete(port, "hi", 2)

    trace = run(main())
    assert trace.status == 200 and trace.complete and trace.text == "Hello"
    assert trace.first_text == trace.end and trace.stop_reason == "eos" and trace.request_id == "4"
    assert trace.first_byte < trace.first_text


def test_body_cut_short_is_not_complete():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"

    async def main() -> Trace:
        async with serving(replying(head, b'{"text": "Hel')) as port:
            return await client.complete(port, "hi", 2)

    trace = run(main())
    assert not trace.complete and trace.text == ""


def test_error_status_is_recorded():
    body = b'{"error": {"status": 400, "message": "prompt is required"}}'
    head = f"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()

    async def main() -> Trace:
        async with serving(replying(head, body)) as port:
            return await client.post(port, "/stream", {})

    trace = run(main())
    assert trace.status == 400 and not trace.complete
    assert trace.error == {"status": 400, "message": "prompt is required"} and trace.stop_reason == "error"


def test_request_is_written_by_hand():
    seen: dict = {}

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["head"], seen["body"] = await read_request(reader)
        writer.close()

    async def main() -> None:
        async with serving(handler) as port:
            await client.stream(port, "héllo", 7, seed=3, extra={"top_p": 0.5})
            seen["port"] = port

    run(main())
    lines = seen["head"].decode().split("\r\n")
    assert lines[0] == "POST /stream HTTP/1.1"
    assert f"Host: 127.0.0.1:{seen['port']}" in lines and "Connection: close" in lines
    assert "Content-Type: application/json" in lines and f"Content-Length: {len(seen['body'])}" in lines
    assert json.loads(seen["body"]) == {"prompt": "héllo", "max_tokens": 7, "seed": 3, "top_p": 0.5}


def header_values(head: bytes) -> dict[str, list[str]]:
    """A request head's fields, by lowercased name (every value, to catch a header sent twice)."""
    fields: dict[str, list[str]] = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        if line:
            name, _, value = line.partition(":")
            fields.setdefault(name.strip().lower(), []).append(value.strip())
    return fields


def test_every_request_names_the_server_and_posts_json():
    """What a server that checks Host, Origin and Content-Type sees from each of this client's requests."""
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, body = await read_request(reader)
        seen.append((head, body))
        if b"Upgrade: websocket" in head:  # refuse it: only its head matters here
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\n{}")
        else:
            reply = b'{"id": "g1", "status": "done", "done": true}'
            status = "201 Created" if head.startswith(b"POST /generations ") else "200 OK"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Length: {len(reply)}\r\n\r\n".encode() + reply)
        writer.close()

    async def main() -> int:
        async with serving(handler) as port:
            await client.post(port, "/stream", {"prompt": "hi"})
            await client.complete(port, "hi", 2)
            await client.create_generation(port, {"prompt": "hi"})
            await client.cancel_generation(port, "g1")
            await client.events(port, "/generations/g1/events", last_event_id=3)
            await client.get_json(port, "/health")
            await client.wait_log(port, "g1")
            await timed_websocket.websocket(port, "hi", 2)
            return port

    port = run(main())
    assert len(seen) == 8
    for head, body in seen:
        fields = header_values(head)
        assert fields["host"] == [f"127.0.0.1:{port}"], head
        assert "origin" not in fields, head
        if head.startswith(b"POST "):
            assert fields["content-type"] == ["application/json"], head
            assert json.loads(body) is not None and fields["content-length"] == [str(len(body))]
    cancel = next(body for head, body in seen if head.startswith(b"POST /generations/g1/cancel "))
    assert cancel == b"{}"


def test_fetch_headers_replace_ours():
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await read_request(reader))[0])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        writer.close()

    async def main() -> None:
        async with serving(handler) as port:
            foreign = [("Host", "evil.example"), ("Origin", "http://evil.example")]
            await client.fetch(port, "GET", "/health", headers=foreign)
            form = [("content-type", "text/plain")]
            await client.fetch(port, "POST", "/stream", body=b"prompt=hi", headers=form)

    run(main())
    first, second = (header_values(head) for head in seen)
    assert first["host"] == ["evil.example"] and first["origin"] == ["http://evil.example"]
    assert second["content-type"] == ["text/plain"] and second["content-length"] == ["9"]


def test_host_header_of_an_ipv6_server():
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await read_request(reader))[0])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        writer.close()

    async def main() -> int:
        try:
            server = await asyncio.start_server(handler, "::1", 0)
        except OSError:
            pytest.skip("no IPv6 loopback here")
        async with server:
            port = server.sockets[0].getsockname()[1]
            assert await client.get_json(port, "/health", host="::1") == {}
            assert await client.get_json(port, "/health", host="[::1]") == {}
            return port

    port = run(main())
    assert [header_values(head)["host"] for head in seen] == [[f"[::1]:{port}"]] * 2


def test_stop_after_closes_the_socket():
    seen: dict = {}

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_head())
        for i in range(50):
            writer.write(chunk(text_event(str(i))))
            await writer.drain()
            await asyncio.sleep(0.02)
            if reader.at_eof() or await _eof_within(reader, 0.001):
                seen["eof_after"] = i
                break
        writer.close()

    async def main() -> Trace:
        async with serving(handler) as port:
            trace = await client.stream(port, "hi", 50, stop_after=3)
            await asyncio.sleep(0.3)
            return trace

    trace = run(main())
    assert trace.left and not trace.complete and len(trace.text_events) >= 3
    assert seen["eof_after"] < 10  # the server saw the reader go


async def _eof_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), seconds) == b""
    except asyncio.TimeoutError:
        return False


def test_leave_after_and_timeout():
    async def main() -> tuple[Trace, float]:
        async with serving(replying(close=False)) as port:  # reads the request, never answers
            left = await client.complete(port, "hi", 2, leave_after=0.2)
            with pytest.raises(TimeoutError):
                await client.complete(port, "hi", 2, timeout=0.3)
            return left, left.now()

    trace, elapsed = run(main())
    assert trace.left and trace.status is None and elapsed < 5


def test_fetch_get_json_and_client_error():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        found = head.startswith(b"GET /ok ")
        body = b'{"ok": true}' if found else b'{"error": {"status": 404, "message": "no"}}'
        status = "200 OK" if found else "404 Not Found"
        writer.write(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        writer.close()

    async def main() -> None:
        async with serving(handler) as port:
            assert await client.get_json(port, "/ok") == {"ok": True}
            reply = await client.fetch(port, "GET", "/missing")
            assert reply.status == 404 and reply.json()["error"]["status"] == 404
            with pytest.raises(client.ClientError) as info:
                await client.get_json(port, "/missing")
            assert info.value.status == 404

    run(main())


def test_wait_log_polls_until_done():
    polls = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        polls.append(1)
        body = json.dumps({"id": "3", "done": len(polls) >= 3}).encode()
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        writer.close()

    async def main() -> dict:
        async with serving(handler) as port:
            return await client.wait_log(port, "3", interval=0.01)

    assert run(main())["done"] and len(polls) == 3


def test_sync_twins_work_inside_a_running_loop():
    """Jupyter runs a loop already: the *_sync functions must still work there."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")
        writer.close()

    async def main() -> object:
        async with serving(handler) as port:
            return await asyncio.to_thread(client.get_json_sync, port, "/log")

    assert run(main()) == []
    assert client.post_sync.__doc__.startswith("Synchronous ``post``")


def test_trace_names_are_still_importable_from_client():
    assert tracing.Trace is trace_mod.Trace and tracing.TraceEvent is trace_mod.TraceEvent
    assert tracing.last_id is trace_mod.last_id
    assert all(hasattr(client, name) for name in client.__all__)


# --------------------------------------------------------------------------
# WebSocket
# --------------------------------------------------------------------------


def fake_ws_server(script: Callable[[ws.Connection, dict], list[bytes]], seen: dict) -> Handler:
    """A WebSocket server from our sans-IO pieces: handshake, then ``script`` frames, then read until CLOSE."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        headers = dict(
            (k.strip().lower(), v.strip())
            for k, _, v in (line.partition(":") for line in head.decode().split("\r\n")[1:] if line)
        )
        if headers.get("origin") == "http://evil.example":
            body = b'{"error": {"status": 403, "message": "origin"}}'
            writer.write(f"HTTP/1.1 403 Forbidden\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            writer.close()
            return
        writer.write(websocket_handshake.server_handshake_response(headers["sec-websocket-key"], [("X-Request-Id", "ws1")]))
        conn = ws.Connection(client=False)  # raises on an unmasked client frame
        seen["messages"], seen["pongs"] = [], []
        while not seen["messages"]:
            for event in conn.receive(await reader.read(65536)):
                if isinstance(event, ws.TextMessage):
                    seen["messages"].append(json.loads(event.text))
        for frame in script(conn, seen):
            writer.write(frame)
            await writer.drain()
            await asyncio.sleep(0.01)
        while not conn.close_received:
            data = await reader.read(65536)
            if not data:
                break
            for event in conn.receive(data):
                if isinstance(event, ws.TextMessage):
                    seen["messages"].append(json.loads(event.text))
                elif isinstance(event, ws.Pong):
                    seen["pongs"].append(event.payload)
        writer.close()

    return handler


def test_websocket_trace():
    def script(conn: ws.Connection, seen: dict) -> list[bytes]:
        return [
            conn.send_text('{"text": "Hel"}'),
            conn.send_ping(b"hb"),
            conn.send_text('{"text": "lo"}'),
            conn.send_text('{"done": true, "stop_reason": "eos", "tokens": 2, "id": "ws1"}'),
            conn.send_close(1000),
        ]

    seen: dict = {}

    async def main() -> Trace:
        async with serving(fake_ws_server(script, seen)) as port:
            trace = await timed_websocket.websocket(port, "hi", 2, seed=5)
            await asyncio.sleep(0.1)
            return trace

    trace = run(main())
    assert trace.status == 101 and trace.complete and trace.text == "Hello" and trace.close_code == 1000
    assert [e.kind for e in trace.events] == ["text", "ping", "text", "done", "close"]
    assert trace.events[0].nbytes == 2 + len('{"text": "Hel"}')
    assert trace.request_id == "ws1" and trace.stop_reason == "eos"
    assert seen["messages"] == [{"prompt": "hi", "max_tokens": 2, "seed": 5}]
    assert seen["pongs"] == [b"hb"]


def test_websocket_say_stop():
    def script(conn: ws.Connection, seen: dict) -> list[bytes]:
        return [conn.send_text(json.dumps({"text": str(i)})) for i in range(3)]

    seen: dict = {}

    async def main() -> Trace:
        async with serving(fake_ws_server(script, seen)) as port:
            return await timed_websocket.websocket(port, "hi", 9, stop_after=2, say_stop=True, timeout=1)

    with pytest.raises(TimeoutError):  # our fake never answers the stop; the client waits for "done"
        run(main())
    assert {"stop": True} in seen["messages"]


def test_websocket_leave_sends_close():
    def script(conn: ws.Connection, seen: dict) -> list[bytes]:
        return [conn.send_text(json.dumps({"text": str(i)})) for i in range(5)]

    seen: dict = {}

    async def main() -> Trace:
        async with serving(fake_ws_server(script, seen)) as port:
            return await timed_websocket.websocket(port, "hi", 9, stop_after=2)

    trace = run(main())
    assert trace.left and not trace.complete and len(trace.text_events) >= 2


def test_websocket_refused():
    async def main() -> Trace:
        async with serving(fake_ws_server(lambda conn, seen: [], {})) as port:
            return await timed_websocket.websocket(port, "hi", 2, origin="http://evil.example")

    trace = run(main())
    assert trace.status == 403 and trace.error["status"] == 403 and not trace.complete


# --------------------------------------------------------------------------
# Against the real server
# --------------------------------------------------------------------------


@pytest.mark.model
def test_stream_bytes_add_up_against_the_real_server(server):
    trace = client.stream_sync(server.port, "The ferry left the harbor", 12, chat=False, ignore_eos=True)
    assert trace.complete and trace.ratio > 1
    # Every text event's nbytes is exactly its bytes in the body.
    body = trace.body.decode("utf-8")
    assert sum(e.nbytes for e in trace.events if e.kind != "ping") == len(body.encode("utf-8"))
    assert len(trace.gaps()) == len(trace.text_events) - 1
