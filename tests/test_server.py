"""Tests for streamlab.server: every route through a real process, checked by our client and by others'."""

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
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlab import client, sse
from streamlab import websocket as ws
from streamlab.http import HTTPError, parse_response_head
from streamlab.server import (
    MAX_PROMPT,
    ClientConnection,
    ClientGone,
    Server,
    ServerConfig,
    parse_generation_request,
)

pytestmark = pytest.mark.timeout(120)
model = pytest.mark.model

PROMPT = "Write two sentences about a lighthouse keeper."
PAUSE_FLAGS = ("--pause-after", "3", "--pause-seconds", "2.5", "--ping-interval", "0.5")
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
        self.sock.sendall(ws.client_handshake(f"127.0.0.1:{port}", "/ws", key, origin=origin))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, self.rest = data.partition(b"\r\n\r\n")
        self.response = parse_response_head(head + b"\r\n\r\n")
        self.decoder = ws.FrameDecoder(expect_masked=False)

    def send(self, opcode: int, payload: bytes, *, mask: bool = True, fin: bool = True) -> None:
        self.sock.sendall(ws.encode_frame(opcode, payload, mask=mask, fin=fin))

    def frames_until_close(self) -> list[ws.Frame]:
        frames = self.decoder.feed(self.rest)
        while not any(f.opcode == ws.Opcode.CLOSE for f in frames):
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            frames += self.decoder.feed(chunk)
        return frames

    def close_code(self) -> int:
        frames = self.frames_until_close()
        close = [f for f in frames if f.opcode == ws.Opcode.CLOSE]
        assert close, frames
        return ws.parse_close_payload(close[0].payload)[0]

    def __enter__(self) -> "RawWebSocket":
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


# --------------------------------------------------------------------------
# Pure parts: no model needed
# --------------------------------------------------------------------------


def test_request_defaults():
    req = parse_generation_request(b'{"prompt": "Hi"}')
    assert (req.max_tokens, req.seed, req.chat, req.ignore_eos, req.temperature, req.top_p) == (
        100,
        0,
        True,
        False,
        0.7,
        0.9,
    )


def test_request_ignores_unknown_keys():
    assert parse_generation_request('{"prompt": "Hi", "model": "gpt", "stream": true}').prompt == "Hi"


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "JSON object"),
        (b"{}", "prompt is required"),
        (b'{"prompt": ""}', "empty"),
        (b'{"prompt": 5}', "prompt must be a string"),
        (b'{"prompt": "\\ud800"}', "surrogate"),
        (b'{"prompt": "a", "max_tokens": "100"}', "max_tokens must be an integer"),
        (b'{"prompt": "a", "max_tokens": 100.0}', "max_tokens must be an integer"),
        (b'{"prompt": "a", "max_tokens": true}', "max_tokens must be an integer"),
        (b'{"prompt": "a", "max_tokens": 0}', "between 1 and 4096"),
        (b'{"prompt": "a", "max_tokens": 4097}', "between 1 and 4096"),
        (b'{"prompt": "a", "seed": -1}', "seed"),
        (b'{"prompt": "a", "chat": "yes"}', "chat must be true or false"),
        (b'{"prompt": "a", "ignore_eos": 1}', "ignore_eos"),
        (b'{"prompt": "a", "temperature": 2.5}', "temperature"),
        (b'{"prompt": "a", "temperature": NaN}', "NaN"),
        (b'{"prompt": "a", "top_p": 0}', "top_p"),
        (b'{"prompt": "a", "top_p": 1.5}', "top_p"),
    ],
)
def test_request_refusals_name_the_problem(body, words):
    with pytest.raises(HTTPError) as info:
        parse_generation_request(body)
    assert info.value.status == 400
    assert words in info.value.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        name: json_values
        for name in (
            "prompt",
            "max_tokens",
            "seed",
            "chat",
            "ignore_eos",
            "temperature",
            "top_p",
            "keep_open",
        )
    },
)


@given(st.one_of(json_values, request_like))
@settings(max_examples=300, deadline=None)
def test_any_json_is_accepted_or_refused_with_400(value):
    try:
        req = parse_generation_request(json.dumps(value))
    except HTTPError as err:
        assert err.status == 400 and err.message
        return
    assert req.prompt and 1 <= req.max_tokens <= 4096 and 0 <= req.temperature <= 2 and 0 < req.top_p <= 1


@given(st.binary(max_size=64))
def test_any_bytes_are_accepted_or_refused_with_400(body):
    try:
        parse_generation_request(body)
    except HTTPError as err:
        assert err.status == 400


def test_prompt_size_limit_counts_utf8_bytes():
    parse_generation_request(json.dumps({"prompt": "a" * MAX_PROMPT}))
    with pytest.raises(HTTPError, match="limit"):
        parse_generation_request(json.dumps({"prompt": "é" * (MAX_PROMPT // 2 + 1)}))


def test_origin_check():
    server = Server(lm=None, config=ServerConfig(allowed_origins=("https://app.example",)))
    assert server.origin_allowed(None, "127.0.0.1:8000")  # not a browser
    assert server.origin_allowed("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert server.origin_allowed("https://app.example", "127.0.0.1:8000")
    assert not server.origin_allowed("http://evil.example", "127.0.0.1:8000")
    assert not server.origin_allowed("http://127.0.0.1:9999", "127.0.0.1:8000")
    assert not server.origin_allowed("null", "127.0.0.1:8000")


def test_route_table_is_an_extension_point():
    server = Server(lm=None)
    assert set(server.routes) >= {"/complete", "/stream", "/ws", "/log", "/log/{id}", "/health"}
    methods, params = server._match("/log/42")
    assert params == {"id": "42"} and "GET" in methods
    with pytest.raises(HTTPError) as info:
        server._match("/nope")
    assert info.value.status == 404


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


@model
def test_health(server):
    assert client.get_json_sync(server.port, "/health") == {
        "ok": True,
        "model": "smollm2-135m-instruct",
        "naive": False,
    }


@model
def test_complete_returns_one_json_body(server):
    trace = client.complete_sync(server.port, PROMPT, 15, seed=1)
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


@model
def test_stream_arrives_piece_by_piece(server):
    trace = client.stream_sync(server.port, "The ferry left the harbor", 30, **EXACT)
    assert trace.status == 200 and trace.complete
    assert trace.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert trace.headers["cache-control"] == "no-cache, no-transform"
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
        "conversation_id": trace.headers["x-conversation-id"],
        "message_id": end["message_id"],
    }
    assert trace.body.endswith(b"event: end\ndata: " + json.dumps(end).encode() + b"\n\ndata: [DONE]\n\n")


@model
def test_websocket_streams_messages(server):
    trace = client.websocket_sync(server.port, "The ferry left the harbor", 20, **EXACT)
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


@model
def test_http10_request_gets_a_close_delimited_stream(server):
    trace = client.stream_sync(server.port, PROMPT, 10, http10=True)
    assert trace.complete and trace.stop_reason
    assert "transfer-encoding" not in trace.headers
    assert trace.headers["connection"] == "close"


@model
def test_log_records(server):
    trace = client.stream_sync(server.port, PROMPT, 10, **EXACT)
    record = client.wait_log_sync(server.port, trace.request_id)
    assert set(record) == {
        "id",
        "path",
        "prompt_tokens",
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
    }
    assert record["path"] == "/stream" and record["tokens"] == 10 and record["stop_reason"] == "max_tokens"
    assert record["pieces_sent"] == len(trace.text_events)
    assert record["prompt_tokens"] > 0 and record["ended"] >= record["started"]
    assert record["stop_signal"] is None and not record["client_left"] and not record["naive"]
    assert any(r["id"] == trace.request_id for r in server.logs())
    reply = client.fetch_sync(server.port, "GET", "/log/does-not-exist")
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


@model
def test_h11_parses_complete_twice_on_one_connection(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        conn = h11.Connection(h11.CLIENT)
        first, body1 = _h11_request(conn, sock, "/complete", {"prompt": PROMPT, "max_tokens": 5}, close=False)
        assert first.status_code == 200 and json.loads(body1)["tokens"] <= 5
        conn.start_next_cycle()  # the same connection carries a second request
        second, body2 = _h11_request(
            conn, sock, "/complete", {"prompt": PROMPT, "max_tokens": 5, "seed": 2}, close=True
        )
        assert second.status_code == 200 and json.loads(body2)["id"] != json.loads(body1)["id"]


@model
def test_h11_parses_stream(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        conn = h11.Connection(h11.CLIENT)
        response, body = _h11_request(conn, sock, "/stream", {"prompt": PROMPT, "max_tokens": 10}, close=True)
    assert response.status_code == 200
    events = sse.parse_events(body)
    assert events[-1].data == "[DONE]" and events[-2].event == "end"
    assert "".join(json.loads(e.data)["text"] for e in events[:-2])


@model
def test_websockets_library_streams_and_gets_pongs(server):
    from websockets.asyncio.client import connect

    async def main() -> tuple[str, dict, int]:
        async with connect(f"ws://127.0.0.1:{server.port}/ws") as sock:
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


@model
def test_websockets_library_sends_several_requests_on_one_socket(server):
    from websockets.asyncio.client import connect

    async def main() -> list[dict]:
        dones = []
        async with connect(f"ws://127.0.0.1:{server.port}/ws") as sock:
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


@model
@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_sees_events_one_by_one(server):
    started = time.perf_counter()
    process = subprocess.Popen(
        [
            "curl",
            "-sN",
            "-X",
            "POST",
            f"http://127.0.0.1:{server.port}/stream",
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


@model
def test_websocket_handshake_with_the_rfc_key(server):
    with RawWebSocket(server.port) as sock:
        assert sock.response.status == 101
        assert sock.response.header("sec-websocket-accept") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        sock.send(ws.Opcode.CLOSE, ws.encode_close_payload(1000))
        assert sock.close_code() == 1000


@model
def test_websocket_origin_check(server):
    with RawWebSocket(server.port, origin="http://evil.example") as sock:
        assert sock.response.status == 403
    with RawWebSocket(server.port, origin=f"http://127.0.0.1:{server.port}") as sock:
        assert sock.response.status == 101


@model
def test_websocket_bad_handshake_is_refused_with_json(server):
    data = raw_exchange(server.port, b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert_json_error(data, 400)


@model
def test_websocket_unmasked_frame_closes_1002(server):
    with RawWebSocket(server.port) as sock:
        sock.send(ws.Opcode.TEXT, b'{"prompt": "hi"}', mask=False)
        assert sock.close_code() == 1002


@model
def test_websocket_invalid_utf8_closes_1007(server):
    with RawWebSocket(server.port) as sock:
        sock.send(ws.Opcode.TEXT, b'{"prompt": "\xff"}')
        assert sock.close_code() == 1007


@model
def test_websocket_message_over_1mib_closes_1009(server):
    with RawWebSocket(server.port) as sock:
        part = b"x" * (600 * 1024)
        sock.send(ws.Opcode.TEXT, part, fin=False)
        sock.send(ws.Opcode.CONTINUATION, part)
        assert sock.close_code() == 1009


@model
def test_websocket_bad_request_sends_error_then_closes_1008(server):
    with RawWebSocket(server.port) as sock:
        sock.send(ws.Opcode.TEXT, b'{"max_tokens": 5}')
        frames = sock.frames_until_close()
    error = json.loads(frames[0].payload)["error"]
    assert error["status"] == 400 and "prompt" in error["message"]
    assert ws.parse_close_payload(frames[-1].payload)[0] == 1008


# --------------------------------------------------------------------------
# When the reader leaves
# --------------------------------------------------------------------------


@model
def test_watching_server_stops_when_sse_client_leaves(server):
    trace = client.stream_sync(server.port, "The ferry left the harbor", 40, stop_after=5, **EXACT)
    assert trace.left and not trace.complete
    record = client.wait_log_sync(server.port, trace.request_id)
    assert record["tokens"] <= 7, record
    assert record["stop_reason"] == "stopped" and record["stop_signal"] == "eof" and record["client_left"]


@model
def test_naive_server_generates_for_nobody(servers):
    naive = servers("--naive")
    trace = client.stream_sync(naive.port, "The ferry left the harbor", 40, stop_after=5, **EXACT)
    assert trace.left
    record = client.wait_log_sync(naive.port, trace.request_id)
    assert record["tokens"] == 40 and record["stop_reason"] == "max_tokens", record
    assert record["naive"] and record["client_left"] and record["stop_signal"] == "write_failed"
    assert record["pieces_sent"] < 40


@model
def test_websocket_client_says_stop(server):
    trace = client.websocket_sync(
        server.port, "The ferry left the harbor", 40, stop_after=5, say_stop=True, **EXACT
    )
    assert trace.complete and trace.stop_reason == "stopped" and trace.close_code == 1000
    record = client.wait_log_sync(server.port, trace.request_id)
    assert record["tokens"] <= 7 and record["said_stop"] and record["stop_signal"] == "stop_message"
    assert not record["client_left"]


@model
def test_websocket_client_closes(server):
    trace = client.websocket_sync(server.port, "The ferry left the harbor", 40, stop_after=5, **EXACT)
    assert trace.left and not trace.complete
    record = client.wait_log_sync(server.port, trace.request_id)
    assert record["tokens"] <= 7 and record["stop_signal"] == "close_frame" and record["client_left"]


@model
def test_abandoned_complete_is_stopped(server):
    before = {r["id"] for r in server.logs()}
    trace = client.complete_sync(server.port, "The ferry left the harbor", 100, leave_after=0.5, **EXACT)
    assert trace.left and trace.status is None
    (record,) = [r for r in server.logs() if r["id"] not in before]
    record = client.wait_log_sync(server.port, record["id"])
    assert record["tokens"] < 50 and record["stop_signal"] == "eof" and record["stop_reason"] == "stopped"


# --------------------------------------------------------------------------
# Keep-alive during silences
# --------------------------------------------------------------------------


@model
def test_sse_pings_during_a_pause_only_between_events(servers):
    paused = servers(*PAUSE_FLAGS)
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
    assert max(trace.gaps()) > 2.0  # the silence was real


@model
def test_websocket_pings_during_a_pause(servers):
    paused = servers(*PAUSE_FLAGS)
    trace = client.websocket_sync(paused.port, "The ferry left the harbor", 6, **EXACT)
    assert trace.complete
    assert sum(e.kind == "ping" for e in trace.events) >= 3


# --------------------------------------------------------------------------
# Hostile input
# --------------------------------------------------------------------------


@model
@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (post_bytes("/complete", b"{oops"), 400),
        (post_bytes("/stream", b'{"max_tokens": 5}'), 400),
        (post_bytes("/stream", b'{"prompt": "a", "max_tokens": "5"}'), 400),
        (post_bytes("/complete", b'{"prompt": "a", "max_tokens": 99999}'), 400),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"POST /complete HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", 413),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
    ],
)
def test_hostile_requests_get_json_errors(server, request_bytes, status):
    assert_json_error(raw_exchange(server.port, request_bytes), status)


@model
def test_wrong_method_gets_405_with_allow(server):
    headers = assert_json_error(raw_exchange(server.port, b"DELETE /stream HTTP/1.1\r\nHost: x\r\n\r\n"), 405)
    assert headers["allow"] == "POST"


@model
def test_a_bad_client_does_not_disturb_a_good_one(server):
    result: dict = {}

    def good() -> None:
        result["trace"] = client.stream_sync(server.port, PROMPT, 15)

    thread = threading.Thread(target=good)
    thread.start()
    bad = [
        raw_exchange(server.port, b"POST /complete HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n"),
        raw_exchange(server.port, b"\x00\x01\x02 nonsense\r\n\r\n"),
        raw_exchange(server.port, post_bytes("/stream", b"[]")),
    ]
    with socket.create_connection(("127.0.0.1", server.port)) as idle:  # says nothing at all
        idle.sendall(b"POST /stream HTTP/1.1\r\n")
        thread.join(60)
    assert [split_response(b)[0] for b in bad] == [413, 400, 400]
    assert result["trace"].complete


# --------------------------------------------------------------------------
# Failures and shutdown
# --------------------------------------------------------------------------


@model
def test_failure_mid_stream_is_an_error_event_not_done(servers):
    failing = servers("--fail-after", "3")
    trace = client.stream_sync(failing.port, "The ferry left the harbor", 20, **EXACT)
    assert not trace.complete and trace.stop_reason == "error"
    assert [e.kind for e in trace.events][-1] == "error"
    assert len(trace.text_events) >= 1 and "injected fault" in trace.error["message"]
    assert b"[DONE]" not in trace.body
    record = client.wait_log_sync(failing.port, trace.request_id)
    assert record["stop_reason"] == "error" and "injected fault" in record["error"]


@model
def test_failure_on_websocket_closes_1011(servers):
    failing = servers("--fail-after", "3")
    trace = client.websocket_sync(failing.port, "The ferry left the harbor", 20, **EXACT)
    assert not trace.complete and trace.close_code == 1011
    assert trace.events[-2].kind == "error" and trace.request_id
    assert client.wait_log_sync(failing.port, trace.request_id)["stop_reason"] == "error"


@model
def test_failure_on_complete_is_500(servers):
    failing = servers("--fail-after", "3")
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
    assert trace.stop_reason == "stopped" or not trace.complete
