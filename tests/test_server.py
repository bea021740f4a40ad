"""Tests for streamlab.server: every route, in process over a fake model, checked by our client and by others'.

A few (marked ``model``) run the real server process with the real model, end to end.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import threading
import time

import h11
import pytest
from streamlab.client import timed as client
from streamlab.protocol import sse
from streamlab.protocol import websocket_frames
from streamlab.protocol import websocket_handshake
from streamlab.protocol.http_head import parse_response_head
from streamlab.server.transport.connection import ClientConnection
from streamlab.net.serving import ClientGone
from streamlab.server.config import ADMISSION, MAX_ACTIVE, MAX_WAITING

pytestmark = pytest.mark.timeout(120)
model = pytest.mark.model

PROMPT = "Write two sentences about a lighthouse keeper."
PAUSED = {"pauses": {3: 1.2}, "ping_interval": 0.25}  # silent for 1.2 s after token 3, a ping every 0.25 s
EXACT = {"chat": False, "ignore_eos": True}  # the token count is then exactly max_tokens


# --------------------------------------------------------------------------
# Helpers: raw sockets
# --------------------------------------------------------------------------


def raw_exchange(port: int, data: bytes, timeout: float = 15.0) -> bytes:
    """Send bytes, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def split_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    response = parse_response_head(head + b"\r\n\r\n")
    return response.status, dict(response.headers), body


def post_bytes(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    ).encode() + body


def assert_json_error(data: bytes, status: int) -> dict:
    got, headers, body = split_response(data)
    assert got == status, data[:300]
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["status"] == status and error["message"]
    return headers


class RawWebSocket:
    """A hand-made WebSocket client, for sending what a polite library never would."""

    def __init__(self, port: int, origin: str | None = None, key: str = "dGhlIHNhbXBsZSBub25jZQ==") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.sock.sendall(websocket_handshake.client_handshake(f"127.0.0.1:{port}", "/ws", key, origin=origin))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, self.rest = data.partition(b"\r\n\r\n")
        self.response = parse_response_head(head + b"\r\n\r\n")
        self.decoder = websocket_frames.FrameDecoder(expect_masked=False)

    def send(self, opcode: int, payload: bytes, *, mask: bool = True, fin: bool = True) -> None:
        self.sock.sendall(websocket_frames.encode_frame(opcode, payload, mask=mask, fin=fin))

    def frames_until_close(self) -> list[websocket_frames.Frame]:
        frames = self.decoder.feed(self.rest)
        while not any(f.opcode == websocket_frames.Opcode.CLOSE for f in frames):
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            frames += self.decoder.feed(chunk)
        return frames

    def close_code(self) -> int:
        frames = self.frames_until_close()
        close = [f for f in frames if f.opcode == websocket_frames.Opcode.CLOSE]
        assert close, frames
        return websocket_frames.parse_close_payload(close[0].payload)[0]

    def __enter__(self) -> "RawWebSocket":
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


# --------------------------------------------------------------------------
# The connection: writes bounded by a timeout
# --------------------------------------------------------------------------


class _StuckWriter:
    """A writer whose peer never reads: drain() never returns."""

    def __init__(self) -> None:
        self.aborted = False
        self.transport = self

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def write(self, data: bytes) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 1 << 20  # all of it still waits to be sent: the peer never reads

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return 16384, 65536  # asyncio's defaults

    async def drain(self) -> None:
        await asyncio.sleep(3600)

    def get_extra_info(self, name: str) -> None:
        return None


def test_write_timeout_aborts_the_connection():
    async def main() -> None:
        writer = _StuckWriter()
        conn = ClientConnection(asyncio.StreamReader(), writer, write_timeout=0.2)  # type: ignore[arg-type]
        started = time.perf_counter()
        with pytest.raises(ClientGone) as info:
            await conn.send(b"data: x\n\n")
        assert info.value.signal == "write_timeout"
        assert writer.aborted and time.perf_counter() - started < 2
        with pytest.raises(ClientGone) as info:
            await conn.send(b"more")
        assert info.value.signal == "write_failed"

    asyncio.run(main())


# --------------------------------------------------------------------------
# The three ways, through a real server
# --------------------------------------------------------------------------


def test_health(app):
    assert client.get_json_sync(app.port, "/health") == {
        "ok": True,
        "model": "fake",
        "engine": "local",
        "naive": False,
        "active": 0,
        "max_active": MAX_ACTIVE,
        "admission": ADMISSION,
        "waiting": 0,
        "max_waiting": MAX_WAITING,
        "left_queue": 0,
    }


def test_complete_returns_one_json_body(app):
    trace = client.complete_sync(app.port, PROMPT, 15, seed=1)
    assert trace.status == 200 and trace.complete
    assert trace.headers["content-type"] == "application/json"
    body = json.loads(trace.body)
    assert int(trace.headers["content-length"]) == len(trace.body)
    assert set(body) == {"text", "tokens", "stop_reason", "id", "conversation_id", "message_id"}
    assert body["conversation_id"] == trace.headers["x-conversation-id"]
    assert body["id"] == trace.headers["x-request-id"]
    assert body["stop_reason"] in ("eos", "max_tokens") and 0 < body["tokens"] <= 15
    assert trace.text == body["text"] != ""
    assert trace.first_text == trace.end  # nothing to read until everything is there


def test_stream_arrives_piece_by_piece(app):
    trace = client.stream_sync(app.port, "The ferry left the harbor", 30, **EXACT)
    assert trace.status == 200 and trace.complete
    assert trace.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert trace.headers["cache-control"] == "no-cache, no-store, no-transform"
    assert trace.headers["x-accel-buffering"] == "no"
    assert trace.headers["transfer-encoding"] == "chunked"
    assert trace.request_id
    kinds = [e.kind for e in trace.events]
    assert kinds[-2:] == ["end", "done"] and set(kinds[:-2]) == {"text"}
    assert len(trace.text_events) >= 20
    assert trace.first_text < 0.5 * trace.end, (trace.first_text, trace.end)
    assert len({round(t, 3) for t, _ in trace.chunks}) >= 10  # many separate arrivals
    assert trace.stop_reason == "max_tokens" and trace.tokens == 30
    assert trace.total_bytes == sum(n for _, n in trace.chunks)
    end = trace.events[-2].data
    assert end == {
        "stop_reason": "max_tokens",
        "tokens": 30,
        "incomplete": True,
        "conversation_id": trace.headers["x-conversation-id"],
        "message_id": end["message_id"],
    }
    assert trace.body.endswith(b"event: end\ndata: " + json.dumps(end).encode() + b"\n\ndata: [DONE]\n\n")


def test_websocket_streams_messages(app):
    trace = client.websocket_sync(app.port, "The ferry left the harbor", 20, **EXACT)
    assert trace.status == 101 and trace.complete
    assert trace.close_code == 1000
    assert [e.kind for e in trace.events][-2:] == ["done", "close"]
    assert trace.stop_reason == "max_tokens" and trace.tokens == 20
    assert trace.headers["x-request-id"] == trace.request_id
    piece = trace.text_events[0]
    assert piece.nbytes == 2 + len(json.dumps({"text": piece.text}, ensure_ascii=False).encode())


@model
def test_same_text_all_three_ways(server):
    texts = [
        client.complete_sync(server.port, PROMPT, 12, seed=7).text,
        client.stream_sync(server.port, PROMPT, 12, seed=7).text,
        client.websocket_sync(server.port, PROMPT, 12, seed=7).text,
    ]
    assert texts[0] and texts[0] == texts[1] == texts[2]


def test_http10_request_gets_a_close_delimited_stream(app):
    trace = client.stream_sync(app.port, PROMPT, 10, http10=True)
    assert trace.complete and trace.stop_reason
    assert "transfer-encoding" not in trace.headers
    assert trace.headers["connection"] == "close"


def test_log_records(app):
    trace = client.stream_sync(app.port, PROMPT, 10, **EXACT)
    record = client.wait_log_sync(app.port, trace.request_id)
    assert set(record) == {
        "id",
        "path",
        "prompt_tokens",
        "prompt_tokens_read",
        "tokens",
        "pieces_sent",
        "stop_reason",
        "stop_signal",
        "client_left",
        "said_stop",
        "done",
        "started",
        "ended",
        "naive",
        "error",
        "tokens_at_stop",
        "stored_reason",
        "conversation_id",
        "message_id",
        "generation_id",
        "queue_position",
        "queued_s",
        "left_queue",
    }
    assert record["queue_position"] is None and record["queued_s"] == 0 and not record["left_queue"]  # no line
    assert record["path"] == "/stream" and record["tokens"] == 10 and record["stop_reason"] == "max_tokens"
    assert record["pieces_sent"] == len(trace.text_events)
    assert record["prompt_tokens"] > 0 and record["ended"] >= record["started"]
    assert record["stop_signal"] is None and not record["client_left"] and not record["naive"]
    assert any(r["id"] == trace.request_id for r in app.logs())
    reply = client.fetch_sync(app.port, "GET", "/log/does-not-exist")
    assert reply.status == 404 and reply.json()["error"]["status"] == 404


# --------------------------------------------------------------------------
# Other people's clients
# --------------------------------------------------------------------------


def _h11_request(
    conn: h11.Connection, sock: socket.socket, path: str, body: dict, close: bool
) -> tuple[h11.Response, bytes]:
    data = json.dumps(body).encode()
    headers = [
        ("Host", "127.0.0.1"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(data))),
    ]
    if close:
        headers.append(("Connection", "close"))
    sock.sendall(conn.send(h11.Request(method="POST", target=path, headers=headers)))
    sock.sendall(conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
    response, parts = None, []
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            parts.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return response, b"".join(parts)


def test_h11_parses_complete_twice_on_one_connection(app):
    with socket.create_connection(("127.0.0.1", app.port), timeout=30) as sock:
        conn = h11.Connection(h11.CLIENT)
        first, body1 = _h11_request(conn, sock, "/complete", {"prompt": PROMPT, "max_tokens": 5}, close=False)
        assert first.status_code == 200 and json.loads(body1)["tokens"] <= 5
        conn.start_next_cycle()  # the same connection carries a second request
        second, body2 = _h11_request(
            conn, sock, "/complete", {"prompt": PROMPT, "max_tokens": 5, "seed": 2}, close=True
        )
        assert second.status_code == 200 and json.loads(body2)["id"] != json.loads(body1)["id"]


def test_h11_parses_stream(app):
    with socket.create_connection(("127.0.0.1", app.port), timeout=30) as sock:
        conn = h11.Connection(h11.CLIENT)
        response, body = _h11_request(conn, sock, "/stream", {"prompt": PROMPT, "max_tokens": 10}, close=True)
    assert response.status_code == 200
    events = sse.parse_events(body)
    assert events[-1].data == "[DONE]" and events[-2].event == "end"
    assert "".join(json.loads(e.data)["text"] for e in events[:-2])


def test_websockets_library_streams_and_gets_pongs(app):
    from websockets.asyncio.client import connect

    async def main() -> tuple[str, dict, int]:
        async with connect(f"ws://127.0.0.1:{app.port}/ws") as sock:
            await sock.send(json.dumps({"prompt": PROMPT, "max_tokens": 20, **EXACT}))
            pong = None
            text, done = "", None
            async for message in sock:
                data = json.loads(message)
                if "text" in data:
                    text += data["text"]
                    if pong is None:
                        pong = await sock.ping()  # answered while the model is generating
                        await asyncio.wait_for(pong, 5)
                elif data.get("done"):
                    done = data
            return text, done, sock.close_code

    text, done, code = asyncio.run(main())
    assert text and done["tokens"] == 20 and done["stop_reason"] == "max_tokens"
    assert code == 1000


def test_websockets_library_sends_several_requests_on_one_socket(app):
    from websockets.asyncio.client import connect

    async def main() -> list[dict]:
        dones = []
        async with connect(f"ws://127.0.0.1:{app.port}/ws") as sock:
            for seed in (1, 2):
                await sock.send(
                    json.dumps({"prompt": PROMPT, "max_tokens": 5, "seed": seed, "keep_open": True})
                )
                while "done" not in (data := json.loads(await sock.recv())):
                    pass
                dones.append(data)
        return dones

    first, second = asyncio.run(main())
    assert first["id"] != second["id"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_sees_events_one_by_one(app):
    started = time.perf_counter()
    process = subprocess.Popen(
        [
            "curl",
            "-sN",
            "-X",
            "POST",
            f"http://127.0.0.1:{app.port}/stream",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps({"prompt": "The ferry left the harbor", "max_tokens": 30, **EXACT}),
        ],
        stdout=subprocess.PIPE,
    )
    times = []
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(b"data: {"):
            times.append(time.perf_counter() - started)
    assert process.wait(30) == 0
    assert len(times) >= 20
    assert times[0] < 0.5 * times[-1], (times[0], times[-1])


# --------------------------------------------------------------------------
# WebSocket handshake and protocol errors
# --------------------------------------------------------------------------


def test_websocket_handshake_with_the_rfc_key(app):
    with RawWebSocket(app.port) as sock:
        assert sock.response.status == 101
        assert sock.response.header("sec-websocket-accept") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        sock.send(websocket_frames.Opcode.CLOSE, websocket_frames.encode_close_payload(1000))
        assert sock.close_code() == 1000


def test_websocket_origin_check(app):
    with RawWebSocket(app.port, origin="http://evil.example") as sock:
        assert sock.response.status == 403
    with RawWebSocket(app.port, origin=f"http://127.0.0.1:{app.port}") as sock:
        assert sock.response.status == 101


def test_websocket_bad_handshake_is_refused_with_json(app):
    data = raw_exchange(app.port, b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert_json_error(data, 400)


def test_websocket_unmasked_frame_closes_1002(app):
    with RawWebSocket(app.port) as sock:
        sock.send(websocket_frames.Opcode.TEXT, b'{"prompt": "hi"}', mask=False)
        assert sock.close_code() == 1002


def test_websocket_invalid_utf8_closes_1007(app):
    with RawWebSocket(app.port) as sock:
        sock.send(websocket_frames.Opcode.TEXT, b'{"prompt": "\xff"}')
        assert sock.close_code() == 1007


def test_websocket_message_over_1mib_closes_1009(app):
    with RawWebSocket(app.port) as sock:
        part = b"x" * (600 * 1024)
        sock.send(websocket_frames.Opcode.TEXT, part, fin=False)
        sock.send(websocket_frames.Opcode.CONTINUATION, part)
        assert sock.close_code() == 1009


def test_websocket_bad_request_sends_error_then_closes_1008(app):
    with RawWebSocket(app.port) as sock:
        sock.send(websocket_frames.Opcode.TEXT, b'{"max_tokens": 5}')
        frames = sock.frames_until_close()
    error = json.loads(frames[0].payload)["error"]
    assert error["status"] == 400 and "prompt" in error["message"]
    assert websocket_frames.parse_close_payload(frames[-1].payload)[0] == 1008


# --------------------------------------------------------------------------
# When the reader leaves
# --------------------------------------------------------------------------


def test_watching_server_stops_when_sse_client_leaves(app):
    trace = client.stream_sync(app.port, "The ferry left the harbor", 40, stop_after=5, **EXACT)
    assert trace.left and not trace.complete
    record = client.wait_log_sync(app.port, trace.request_id)
    assert record["tokens"] <= 7, record
    assert record["stop_reason"] == "stopped" and record["stop_signal"] == "eof" and record["client_left"]


def test_naive_server_generates_for_nobody(apps):
    naive = apps(naive=True)
    trace = client.stream_sync(naive.port, "The ferry left the harbor", 40, stop_after=5, **EXACT)
    assert trace.left
    record = client.wait_log_sync(naive.port, trace.request_id)
    assert record["tokens"] == 40 and record["stop_reason"] == "max_tokens", record
    assert record["naive"] and record["client_left"] and record["stop_signal"] == "write_failed"
    assert record["pieces_sent"] < 40


def test_websocket_client_says_stop(app):
    trace = client.websocket_sync(
        app.port, "The ferry left the harbor", 40, stop_after=5, say_stop=True, **EXACT
    )
    assert trace.complete and trace.stop_reason == "stopped" and trace.close_code == 1000
    record = client.wait_log_sync(app.port, trace.request_id)
    assert record["tokens"] <= 7 and record["said_stop"] and record["stop_signal"] == "stop_message"
    assert not record["client_left"]


def test_websocket_client_closes(app):
    trace = client.websocket_sync(app.port, "The ferry left the harbor", 40, stop_after=5, **EXACT)
    assert trace.left and not trace.complete
    record = client.wait_log_sync(app.port, trace.request_id)
    assert record["tokens"] <= 7 and record["stop_signal"] == "close_frame" and record["client_left"]


def test_abandoned_complete_is_stopped(app):
    before = {r["id"] for r in app.logs()}
    trace = client.complete_sync(app.port, "The ferry left the harbor", 400, leave_after=0.2, **EXACT)
    assert trace.left and trace.status is None
    (record,) = [r for r in app.logs() if r["id"] not in before]
    record = client.wait_log_sync(app.port, record["id"])
    assert record["tokens"] < 200 and record["stop_signal"] == "eof" and record["stop_reason"] == "stopped"


# --------------------------------------------------------------------------
# Keep-alive during silences
# --------------------------------------------------------------------------


def test_sse_pings_during_a_pause_only_between_events(apps):
    paused = apps(**PAUSED)
    trace = client.stream_sync(paused.port, "The ferry left the harbor", 6, **EXACT)
    assert trace.complete
    pings = [e.t for e in trace.events if e.kind == "ping"]
    assert len(pings) >= 3, [(round(e.t, 2), e.kind) for e in trace.events]
    for block in trace.body.decode().split("\n\n")[:-1]:  # every block is a whole event or a comment
        if block == ": ping":
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(fields) <= {"event", "data"}
        if fields["data"] != "[DONE]":
            json.loads(fields["data"])
    assert max(trace.gaps()) > 1.0  # the silence was real


def test_websocket_pings_during_a_pause(apps):
    paused = apps(**PAUSED)
    trace = client.websocket_sync(paused.port, "The ferry left the harbor", 6, **EXACT)
    assert trace.complete
    assert sum(e.kind == "ping" for e in trace.events) >= 3


# --------------------------------------------------------------------------
# Hostile input
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (post_bytes("/complete", b"{oops"), 400),
        (post_bytes("/stream", b'{"max_tokens": 5}'), 400),
        (post_bytes("/stream", b'{"prompt": "a", "max_tokens": "5"}'), 400),
        (post_bytes("/complete", b'{"prompt": "a", "max_tokens": 99999}'), 400),
        (b"GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404),
        (b"POST /complete HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2000000\r\n\r\n", 413),
        (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
    ],
)
def test_hostile_requests_get_json_errors(app, request_bytes, status):
    assert_json_error(raw_exchange(app.port, request_bytes), status)


def test_wrong_method_gets_405_with_allow(app):
    headers = assert_json_error(raw_exchange(app.port, b"DELETE /stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 405)
    assert headers["allow"] == "POST"


def test_a_bad_client_does_not_disturb_a_good_one(app):
    result: dict = {}

    def good() -> None:
        result["trace"] = client.stream_sync(app.port, PROMPT, 15)

    thread = threading.Thread(target=good)
    thread.start()
    bad = [
        raw_exchange(app.port, b"POST /complete HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\nContent-Length: 5000000\r\n\r\n"),
        raw_exchange(app.port, b"\x00\x01\x02 nonsense\r\n\r\n"),
        raw_exchange(app.port, post_bytes("/stream", b"[]")),
    ]
    with socket.create_connection(("127.0.0.1", app.port)) as idle:  # says nothing at all
        idle.sendall(b"POST /stream HTTP/1.1\r\n")
        thread.join(60)
    assert [split_response(b)[0] for b in bad] == [413, 400, 400]
    assert result["trace"].complete


# --------------------------------------------------------------------------
# Failures and shutdown
# --------------------------------------------------------------------------


def test_failure_mid_stream_is_an_error_event_not_done(apps):
    failing = apps(fail_after=3)
    trace = client.stream_sync(failing.port, "The ferry left the harbor", 20, **EXACT)
    assert not trace.complete and trace.stop_reason == "error"
    assert [e.kind for e in trace.events][-1] == "error"
    assert len(trace.text_events) >= 1 and "injected fault" in trace.error["message"]
    assert b"[DONE]" not in trace.body
    record = client.wait_log_sync(failing.port, trace.request_id)
    assert record["stop_reason"] == "error" and "injected fault" in record["error"]


def test_failure_on_websocket_closes_1011(apps):
    failing = apps(fail_after=3)
    trace = client.websocket_sync(failing.port, "The ferry left the harbor", 20, **EXACT)
    assert not trace.complete and trace.close_code == 1011
    assert trace.events[-2].kind == "error" and trace.request_id
    assert client.wait_log_sync(failing.port, trace.request_id)["stop_reason"] == "error"


def test_failure_on_complete_is_500(apps):
    failing = apps(fail_after=3)
    trace = client.complete_sync(failing.port, "The ferry left the harbor", 20, **EXACT)
    assert trace.status == 500 and "injected fault" in trace.error["message"]


@model
def test_sigterm_mid_stream_exits_zero_promptly(fresh_server):
    running = fresh_server()
    result: dict = {}

    def read() -> None:
        result["trace"] = client.stream_sync(running.port, "The ferry left the harbor", 400, **EXACT)

    thread = threading.Thread(target=read)
    thread.start()
    deadline = time.monotonic() + 30
    while not any(r["tokens"] > 3 for r in running.logs()) and time.monotonic() < deadline:
        time.sleep(0.1)
    started = time.monotonic()
    running.process.send_signal(signal.SIGTERM)
    assert running.process.wait(10) == 0
    assert time.monotonic() - started < 5
    thread.join(10)
    trace = result["trace"]
    assert trace.stop_reason == "interrupted" or not trace.complete
