"""Clients nobody here wrote, against the server's routes, in process over the fake model.

``streamlab.client.timed`` parses with the same sans-IO modules the server writes
with, so a mistake made on both sides would pass every test of ours. Here the
readers are other people's: ``websockets`` and ``wsproto`` on ``/ws``;
``httpx`` with ``httpx-sse`` on both SSE routes; the npm ``eventsource``
package under Node and headless Chromium's own ``EventSource`` on a resumable
``/generations/{id}/events`` stream (with a drop and the automatic reconnect);
``curl -N``; and ``h11`` as a strict parser of every kind of response the
server sends, from a JSON 200 to the 101 of an upgrade.

What ``tests/test_server.py`` already does with such clients (h11 on
``/complete`` and a closing ``/stream``, websockets with one ping and two
requests on one socket, ``curl -N`` on ``/stream``) and ``tests/test_hostile.py``
(a pooled httpx client on ``/generations/{id}/events``) is not repeated.

The npm package is installed on first use into streamlab's cache folder
(``node/`` beside the converted model; ``build/`` is the book's); without npm
or a registry that test is skipped, saying why.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
from httpx_sse import connect_sse

from fakes import DEFAULT_SCRIPT
from streamlab.lab.outside import headless
from streamlab.client import timed as client
from streamlab.client import tracing
from streamlab.model.loading import default_cache_dir
from streamlab.protocol import sse
from streamlab.protocol import websocket_frames
from streamlab.server.config import MAX_BODY, MAX_WS_MESSAGE, RETRY_MS

pytestmark = pytest.mark.timeout(60)

NODE_PREFIX = default_cache_dir() / "node"
EVENTSOURCE_VERSION = "3.0.7"  # engines: node >= 18 (4.x wants >= 20, 5.x >= 22.12)

PROMPT = "The ferry left the harbor"
EXACT = {"chat": False, "ignore_eos": True}  # exactly max_tokens tokens
JSON_TYPE = ("Content-Type", "application/json")
SLOW = 0.05  # seconds per token: long enough to see a stream arrive piece by piece


@pytest.fixture(scope="module")
def slow(apps):
    """A server whose fake model takes 50 ms a token."""
    return apps(decode_seconds=SLOW)


def wait_done(port: int, generation_id: str, timeout: float = 20.0) -> dict:
    """``GET /generations/{id}`` until it is done: its whole text, as the server kept it."""
    deadline = time.monotonic() + timeout
    while True:
        state = client.get_json_sync(port, f"/generations/{generation_id}")
        if state["status"] == "done":
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.05)


# --------------------------------------------------------------------------
# A TCP relay that records every request and can cut the first connection
# --------------------------------------------------------------------------

REQUEST_HEAD = re.compile(rb"([A-Z]+) (\S+) HTTP/1\.[01]\r\n(.*?)\r\n\r\n", re.S)
WHOLE_EVENT = re.compile(rb"\nid: \d+\n(?:[^\n]+\n)*\n")  # a numbered event up to its blank line


class Relay:
    """Listens on 127.0.0.1, forwards each connection to the server, keeps both directions' bytes.

    ``cut_after=N`` closes the first connection (both ways) as soon as N
    whole numbered events have gone through to the client: a network drop
    mid-stream, as the client sees it.
    """

    def __init__(self, port: int, cut_after: int | None = None) -> None:
        self.target = port
        self.cut_after = cut_after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.connections: list[dict[str, Any]] = []
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._accept, name="relay", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                down, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            up = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                record = {"request": bytearray(), "response": bytearray(), "cut": False}
                first = not self.connections
                self.connections.append(record)
                self.sockets += [down, up]
            cut = self.cut_after if first else None
            threading.Thread(target=self._pump, args=(down, up, record, "request", None), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, record, "response", cut), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: dict, side: str, cut: int | None) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            record[side] += data
            try:
                dst.sendall(data)
            except OSError:
                return
            if cut is not None and len(WHOLE_EVENT.findall(bytes(record[side]))) >= cut:
                record["cut"] = True
                for sock in (src, dst):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return

    def requests(self, path: str) -> list[dict[str, Any]]:
        """Each request for ``path`` that went through: its headers (lowercased), the status answered, cut or not."""
        found = []
        with self.lock:
            connections = list(self.connections)
        for record in connections:
            statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", bytes(record["response"]))
            heads = REQUEST_HEAD.findall(bytes(record["request"]))
            for n, (_, target, fields) in enumerate(heads):
                if target.decode() != path:
                    continue
                headers = {}
                for line in fields.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                status = int(statuses[n]) if n < len(statuses) else None
                found.append({"headers": headers, "status": status, "cut": record["cut"]})
        return found

    def close(self) -> None:
        self.closed = True
        self.thread.join(2)
        self.listener.close()
        for sock in self.sockets:
            try:
                sock.close()
            except OSError:
                pass

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------
# 1. websockets (python-websockets): keepalive pings, fragments, the size limit
# --------------------------------------------------------------------------


def test_websockets_sync_client_reads_the_whole_scripted_answer(app):
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{app.port}/ws", origin=f"http://127.0.0.1:{app.port}") as conn:
        conn.send(json.dumps({"prompt": PROMPT, "max_tokens": 200}))
        messages = [json.loads(m) for m in conn]  # until the server's close
        assert conn.close_code == 1000
    *pieces, done = messages
    assert all(set(m) == {"text"} for m in pieces) and len(pieces) > 10
    assert "".join(m["text"] for m in pieces) == DEFAULT_SCRIPT  # the emoji whole, nothing lost
    assert done["done"] is True and done["stop_reason"] == "completed"


def test_websockets_client_pinging_every_50ms_survives_a_slow_answer(slow):
    from websockets.asyncio.client import connect

    async def main() -> tuple[str, dict, float, int]:
        # ping_timeout 0.5 s: a pong that does not come within it fails the connection (1011).
        async with connect(f"ws://127.0.0.1:{slow.port}/ws", ping_interval=0.05, ping_timeout=0.5) as sock:
            await sock.send(json.dumps({"prompt": PROMPT, "max_tokens": 20, **EXACT}))
            text, done = "", {}
            async for message in sock:
                data = json.loads(message)
                text += data.get("text", "")
                done = data if data.get("done") else done
            return text, done, sock.latency, sock.close_code

    started = time.monotonic()
    text, done, latency, code = asyncio.run(main())
    assert time.monotonic() - started >= 20 * SLOW * 0.9  # ~20 ping rounds happened meanwhile
    assert code == 1000 and done["tokens"] == 20 and done["stop_reason"] == "max_tokens"
    assert text and latency > 0  # latency is measured from a keepalive pong: the server answered


def test_websockets_fragmented_request_is_answered(app):
    from websockets.asyncio.client import connect

    request = json.dumps({"prompt": PROMPT, "max_tokens": 8, **EXACT})
    fragments = [request[i : i + 5] for i in range(0, len(request), 5)]  # TEXT, then CONTINUATIONs

    async def main() -> tuple[list[dict], int]:
        async with connect(f"ws://127.0.0.1:{app.port}/ws") as sock:
            await sock.send(fragments)
            messages = [json.loads(m) async for m in sock]
            return messages, sock.close_code

    messages, code = asyncio.run(main())
    assert len(fragments) > 5
    assert code == 1000 and messages[-1]["done"] is True and messages[-1]["tokens"] == 8


def test_websockets_message_at_the_limit_is_answered_and_one_byte_more_closes_1009(app):
    from websockets.exceptions import ConnectionClosedError
    from websockets.sync.client import connect

    request = json.dumps({"prompt": "Hi", "max_tokens": 3, **EXACT})
    at_limit = request + " " * (MAX_WS_MESSAGE - len(request))  # JSON allows trailing whitespace
    assert len(at_limit.encode()) == MAX_WS_MESSAGE == 1 << 20

    with connect(f"ws://127.0.0.1:{app.port}/ws") as conn:
        conn.send(at_limit)
        messages = [json.loads(m) for m in conn]
    assert messages[-1]["done"] is True and messages[-1]["tokens"] == 3

    with connect(f"ws://127.0.0.1:{app.port}/ws") as conn:
        conn.send(at_limit + " ")  # one frame, one byte over
        with pytest.raises(ConnectionClosedError) as info:
            conn.recv(timeout=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009


# --------------------------------------------------------------------------
# 2. wsproto: sans-IO, driven over a plain socket
# --------------------------------------------------------------------------


def test_wsproto_handshake_request_and_close_handshake(app):
    from wsproto import ConnectionType, WSConnection
    from wsproto.connection import ConnectionState
    from wsproto.events import (
        AcceptConnection,
        CloseConnection,
        Ping,
        RejectConnection,
        Request,
        TextMessage,
    )
    from wsproto.extensions import PerMessageDeflate

    conn = WSConnection(ConnectionType.CLIENT)
    messages: list[dict] = []
    partial = ""
    accepted = closed = None
    with socket.create_connection(("127.0.0.1", app.port), timeout=10) as sock:
        sock.sendall(
            conn.send(
                Request(
                    host=f"127.0.0.1:{app.port}",
                    target="/ws",
                    extensions=[PerMessageDeflate()],  # offered; a server without it must decline
                    extra_headers=[(b"Origin", f"http://127.0.0.1:{app.port}".encode())],
                )
            )
        )
        while conn.state is not ConnectionState.CLOSED:
            data = sock.recv(65536)
            conn.receive_data(data or None)  # None: the server closed TCP
            for event in conn.events():
                if isinstance(event, AcceptConnection):
                    accepted = event
                    request = {"prompt": PROMPT, "max_tokens": 12, **EXACT}
                    sock.sendall(conn.send(TextMessage(data=json.dumps(request))))
                elif isinstance(event, RejectConnection):
                    pytest.fail(f"upgrade rejected: {event.status_code}")
                elif isinstance(event, TextMessage):
                    partial += event.data
                    if event.message_finished:
                        messages.append(json.loads(partial))
                        partial = ""
                elif isinstance(event, Ping):
                    sock.sendall(conn.send(event.response()))
                elif isinstance(event, CloseConnection):
                    closed = event
                    sock.sendall(conn.send(event.response()))  # our half of the closing handshake
            if not data:
                break
        tail = sock.recv(65536)  # after the handshake the server closes TCP: EOF, nothing more
    assert accepted is not None and accepted.extensions == []  # permessage-deflate declined
    assert conn.state is ConnectionState.CLOSED
    assert closed is not None and closed.code == 1000
    assert tail == b""
    *pieces, done = messages
    assert pieces and all(set(m) == {"text"} for m in pieces)
    assert done["done"] is True and done["tokens"] == 12 and done["stop_reason"] == "max_tokens"


# --------------------------------------------------------------------------
# 3. httpx + httpx-sse on every SSE route
# --------------------------------------------------------------------------


def test_httpx_sse_reads_stream(app):
    body = {"prompt": PROMPT, "max_tokens": 15, **EXACT}
    with httpx.Client(base_url=app.url, timeout=10) as http:
        with connect_sse(http, "POST", "/stream", json=body) as source:
            assert source.response.headers["content-type"].startswith("text/event-stream")
            events = list(source.iter_sse())
    assert [e.event for e in events[-2:]] == ["end", "message"] and events[-1].data == "[DONE]"
    pieces = events[:-2]
    assert all(e.event == "message" for e in pieces)
    assert "".join(json.loads(e.data)["text"] for e in pieces)
    end = events[-2].json()
    assert end["tokens"] == 15 and end["stop_reason"] == "max_tokens"


def test_httpx_sse_reads_generation_events_and_resumes(app):
    body = {"prompt": PROMPT, "max_tokens": 10, **EXACT}
    with httpx.Client(base_url=app.url, timeout=10) as http:
        created = http.post("/generations", json=body)
        assert created.status_code == 201
        path = created.json()["events"]
        with connect_sse(http, "GET", path) as source:
            events = list(source.iter_sse())
        assert [int(e.id) for e in events] == list(range(1, len(events) + 1))
        assert events[0].retry == RETRY_MS
        assert events[-1].event == "end" and events[-1].json()["tokens"] == 10
        text = "".join(e.json()["text"] for e in events if e.event == "message")
        assert text == wait_done(app.port, created.json()["id"])["text"]

        with connect_sse(http, "GET", path, headers={"Last-Event-ID": "3"}) as source:
            rest = list(source.iter_sse())
        assert [e.id for e in rest] == [e.id for e in events[3:]] and rest[0].retry == RETRY_MS

        done = http.get(path, headers={"Last-Event-ID": events[-1].id})
        assert done.status_code == 204 and done.content == b""


def test_httpx_pooled_client_reads_stream_to_the_end_20_times_on_one_connection(app):
    body = {"prompt": "Hi", "max_tokens": 4, **EXACT}
    with Relay(app.port) as relay, httpx.Client(base_url=f"http://127.0.0.1:{relay.port}", timeout=10) as http:
        for _ in range(20):
            with connect_sse(http, "POST", "/stream", json=body) as source:
                assert "connection" not in source.response.headers  # keep-alive: chunked ends the body
                events = list(source.iter_sse())
            assert events[-2].event == "end" and events[-1].data == "[DONE]"
            assert http.get("/health").json()["ok"]
        assert len(relay.requests("/stream")) == 20 and len(relay.requests("/health")) == 20
        assert len(relay.connections) == 1  # one kept-alive connection carried all 40 requests


# --------------------------------------------------------------------------
# 4. The npm eventsource package under Node: a drop, the reconnect, the 204
# --------------------------------------------------------------------------

NODE_READER = r"""
import { EventSource } from __MODULE__;
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
let opens = 0;
const source = new EventSource(process.argv[2]);
source.onopen = () => { opens += 1; out({ open: opens }); };
source.onmessage = (e) => out({ id: e.lastEventId, text: JSON.parse(e.data).text });
source.addEventListener("end", (e) => out({ end: JSON.parse(e.data), id: e.lastEventId }));
source.onerror = (e) => {
  out({ error: e.message ?? null, code: e.code ?? null, state: source.readyState });
  if (source.readyState === EventSource.CLOSED) { out({ closed: true, opens }); process.exit(0); }
};
setTimeout(() => { out({ timeout: true, opens }); process.exit(3); }, 20000);
"""


@pytest.fixture(scope="session")
def eventsource_module() -> Path:
    """The npm ``eventsource`` package's ES module, installed into the cache's ``node/`` on first use."""
    module = NODE_PREFIX / "node_modules" / "eventsource" / "dist" / "index.js"
    package = NODE_PREFIX / "node_modules" / "eventsource" / "package.json"
    if package.is_file() and json.loads(package.read_text())["version"] == EVENTSOURCE_VERSION and module.is_file():
        return module
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("needs node and npm (the npm eventsource package runs under Node)")
    NODE_PREFIX.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["npm", "install", "--prefix", str(NODE_PREFIX), "--no-audit", "--no-fund",
             f"eventsource@{EVENTSOURCE_VERSION}"],
            capture_output=True, text=True, timeout=240,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install eventsource timed out (no registry?)")
    if done.returncode != 0 or not module.is_file():
        pytest.skip(f"npm could not install eventsource@{EVENTSOURCE_VERSION}: {done.stderr.strip()[-300:]}")
    return module


@pytest.mark.timeout(300)  # the first run installs the npm package
def test_node_eventsource_resumes_after_a_drop_and_stops_at_204(apps, eventsource_module, tmp_path):
    server = apps(decode_seconds=0.02)
    script = tmp_path / "reader.mjs"
    script.write_text(NODE_READER.replace("__MODULE__", json.dumps(eventsource_module.as_uri())))
    created = client.create_generation_sync(server.port, {"prompt": PROMPT, "max_tokens": 40, **EXACT})
    path = created["events"]
    with Relay(server.port, cut_after=5) as relay:
        done = subprocess.run(
            ["node", str(script), f"http://127.0.0.1:{relay.port}{path}"],
            capture_output=True, text=True, timeout=30,
        )
        requests = relay.requests(path)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    pieces = [line for line in lines if "text" in line]
    ends = [line for line in lines if "end" in line]

    full = wait_done(server.port, created["id"])
    assert "".join(p["text"] for p in pieces) == full["text"]
    ids = [int(p["id"]) for p in pieces] + [int(e["id"]) for e in ends]
    assert ids == list(range(1, len(ids) + 1))  # no piece twice, none missing
    assert len(ends) == 1 and ends[0]["end"]["tokens"] == 40
    assert lines[-2]["code"] == 204 and lines[-1] == {"closed": True, "opens": 2}  # opened twice, then 204

    # On the wire: cut mid-stream, resumed after the last id seen, then the 204 and no more.
    assert [r["status"] for r in requests] == [200, 200, 204], requests
    assert requests[0]["cut"] and "last-event-id" not in requests[0]["headers"]
    cut_at = int(requests[1]["headers"]["last-event-id"])
    assert 5 <= cut_at < ids[-1] and int(pieces[cut_at]["id"]) == cut_at + 1
    assert requests[2]["headers"]["last-event-id"] == str(ids[-1])


# --------------------------------------------------------------------------
# 5. Chromium's EventSource: the whole answer, then one 204 and no more reconnects
# --------------------------------------------------------------------------

BROWSER_READER = """
const got = window.got = {texts: [], ids: [], opens: 0, errors: [], end: null};
const source = window.source = new EventSource(arguments[0]);
source.onopen = () => { got.opens += 1; };
source.onmessage = (e) => { got.ids.push(e.lastEventId); got.texts.push(JSON.parse(e.data).text); };
source.addEventListener('end', (e) => { got.end = JSON.parse(e.data); got.ids.push(e.lastEventId); });
source.onerror = () => { got.errors.push(source.readyState); };
"""


@pytest.mark.browser
@pytest.mark.skipif(headless.unavailable_reason() is not None, reason=f"no headless browser: {headless.unavailable_reason()}")
def test_chromium_eventsource_reads_the_answer_and_stops_at_204(apps):
    server = apps(decode_seconds=0.02)
    created = client.create_generation_sync(server.port, {"prompt": PROMPT, "max_tokens": 30, **EXACT})
    path = created["events"]
    with Relay(server.port) as relay, headless.chromium(width=800, height=600) as driver:
        driver.get(f"http://127.0.0.1:{relay.port}/health")  # same origin as the stream, no page script
        driver.execute_script(BROWSER_READER, path)
        headless.wait_for(lambda: driver.execute_script("return source.readyState === 2"), 20, "EventSource CLOSED")
        time.sleep(RETRY_MS / 1000 * 1.5)  # long enough for one more reconnect, were there any
        got = driver.execute_script("return window.got")
        state = driver.execute_script("return source.readyState")
        requests = relay.requests(path)
    full = wait_done(server.port, created["id"])
    assert state == 2 and got["opens"] == 1 and got["errors"] == [0, 2]  # drop: CONNECTING; the 204: CLOSED
    assert "".join(got["texts"]) == full["text"] and got["end"]["tokens"] == 30
    assert [int(i) for i in got["ids"]] == list(range(1, len(got["ids"]) + 1))
    assert [r["status"] for r in requests] == [200, 204], requests
    assert requests[1]["headers"]["last-event-id"] == got["ids"][-1]


# --------------------------------------------------------------------------
# 6. curl -N on the resumable route (test_server.py has it on /stream)
# --------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl (scripts/system-deps.sh installs it)")
def test_curl_reads_generation_events_as_they_come_then_gets_204(slow):
    created = client.create_generation_sync(slow.port, {"prompt": PROMPT, "max_tokens": 30, **EXACT})
    url = f"http://127.0.0.1:{slow.port}{created['events']}"
    started = time.monotonic()
    process = subprocess.Popen(["curl", "-sN", "-H", "Accept: text/event-stream", url], stdout=subprocess.PIPE)
    assert process.stdout is not None
    lines, first = [], None
    for line in process.stdout:
        if line.startswith(b"data: ") and first is None:
            first = time.monotonic() - started
        lines.append(line)
    assert process.wait(30) == 0  # 0: the chunked body ended properly (a cut one is curl's 18)
    ended = time.monotonic() - started
    assert ended > 30 * SLOW * 0.8
    assert first is not None and first < 0.3 * ended, (first, ended)
    events = sse.parse_events(b"".join(lines))
    assert events[-1].event == "end" and json.loads(events[-1].data)["tokens"] == 30
    assert "".join(json.loads(e.data)["text"] for e in events[:-1]) == wait_done(slow.port, created["id"])["text"]

    again = subprocess.run(
        ["curl", "-sN", "-w", "%{http_code}", "-H", f"Last-Event-ID: {events[-1].id}", url],
        capture_output=True, timeout=30,
    )
    assert again.returncode == 0 and again.stdout == b"204"  # no body, only the code -w printed


# --------------------------------------------------------------------------
# 7. h11 as a strict parser of every kind of response
# --------------------------------------------------------------------------


class H11:
    """One h11 client connection on a plain socket: requests, responses, and what may follow them."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.conn = h11.Connection(h11.CLIENT)

    def send(
        self, method: str, target: str, headers: list[tuple[str, str]] = (),  # type: ignore[assignment]
        body: bytes | None = None, *, send_body: bool = True,
    ) -> None:
        items = list(headers)
        if not any(name.lower() == "host" for name, _ in items):
            items.insert(0, ("Host", f"127.0.0.1:{self.port}"))
        if body is not None and not any(name.lower() == "content-length" for name, _ in items):
            items.append(("Content-Length", str(len(body))))
        self.sock.sendall(self.conn.send(h11.Request(method=method, target=target, headers=items)))
        if send_body:
            if body:
                self.sock.sendall(self.conn.send(h11.Data(data=body)))
            self.sock.sendall(self.conn.send(h11.EndOfMessage()))

    def _recv(self) -> bytes:
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return b""

    def response(self) -> tuple[h11.Response | h11.InformationalResponse, dict[str, str], bytes]:
        """The next response: its head, its headers (lowercased names), its whole body; h11 checks it all."""
        head, parts = None, []
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self._recv())
            elif isinstance(event, (h11.Response, h11.InformationalResponse)):
                head = event
            elif isinstance(event, h11.Data):
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage) or event is h11.PAUSED:
                break
            elif isinstance(event, h11.ConnectionClosed):
                pytest.fail("the server closed before the response ended")
        assert head is not None
        headers = {k.decode().lower(): v.decode() for k, v in head.headers}
        return head, headers, b"".join(parts)

    def after(self) -> str:
        """``keep-alive`` (h11 has started the next cycle) or ``closed`` (EOF read, nothing after the response)."""
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
            return "keep-alive"
        assert h11.MUST_CLOSE in (self.conn.our_state, self.conn.their_state), self.conn.states
        while True:  # any byte the server sends after a response it said was its last is an error to h11
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self._recv())
            elif isinstance(event, h11.ConnectionClosed):
                return "closed"
            else:
                pytest.fail(f"after the response: {event!r}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def ended(app) -> dict:
    """A /generations answer read to its end: its id, its events' path, its last event id."""
    created = client.create_generation_sync(app.port, {"prompt": PROMPT, "max_tokens": 6, **EXACT})
    trace = client.events_sync(app.port, created["events"])
    assert trace.complete
    return {"id": created["id"], "events": created["events"], "last": tracing.last_id(trace)}


GEN = json.dumps({"prompt": PROMPT, "max_tokens": 5, **EXACT}).encode()
UPGRADE = [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")]

# name: (server, method, target, headers, body, status, after). ``{id}``, ``{events}``, ``{last}``: of ``ended``.
H11_CASES: dict[str, tuple] = {
    "json 200 health": ("app", "GET", "/health", [], None, 200, "keep-alive"),
    "json 200 log": ("app", "GET", "/log", [], None, 200, "keep-alive"),
    "json 200 conversations": ("app", "GET", "/conversations", [], None, 200, "keep-alive"),
    "json 200 generation state": ("app", "GET", "/generations/{id}", [], None, 200, "keep-alive"),
    "json 200 cancel": ("app", "POST", "/generations/{id}/cancel", [JSON_TYPE], b"{}", 200, "keep-alive"),
    "201 with Location": ("app", "POST", "/generations", [JSON_TYPE], GEN, 201, "keep-alive"),
    "204 after the last event": ("app", "GET", "{events}", [("Last-Event-ID", "{last}")], None, 204, "keep-alive"),
    "sse chunked keep-alive": ("app", "POST", "/stream", [JSON_TYPE], GEN, 200, "keep-alive"),
    "sse chunked, client asks close": (
        "app", "POST", "/stream", [JSON_TYPE, ("Connection", "close")], GEN, 200, "closed"),
    "sse chunked, Connection: close": ("app", "GET", "{events}", [], None, 200, "closed"),
    "sse resumed": ("app", "GET", "{events}", [("Last-Event-ID", "2")], None, 200, "closed"),
    "head json": ("app", "HEAD", "/health", [], None, 200, "keep-alive"),
    "head page": ("app", "HEAD", "/", [], None, 200, "keep-alive"),
    "head static": ("app", "HEAD", "/static/app.js", [], None, 200, "keep-alive"),
    "head sse": ("app", "HEAD", "{events}", [], None, 200, "closed"),
    "static page": ("app", "GET", "/", [], None, 200, "keep-alive"),
    "static file": ("app", "GET", "/static/style.css", [], None, 200, "keep-alive"),
    "404 no route": ("app", "GET", "/nowhere", [], None, 404, "closed"),
    "404 no generation": ("app", "GET", "/generations/nope/events", [], None, 404, "closed"),
    "405 wrong method": ("app", "DELETE", "/stream", [], None, 405, "closed"),
    "413 body too large": (
        "app", "POST", "/complete", [JSON_TYPE, ("Content-Length", str(2 * MAX_BODY))], b"", 413, "closed"),
    "415 not json": ("app", "POST", "/stream", [("Content-Type", "text/plain")], GEN, 415, "closed"),
    "403 host": ("app", "GET", "/health", [("Host", "evil.example")], None, 403, "closed"),
    "403 origin": ("app", "POST", "/stream", [JSON_TYPE, ("Origin", "http://evil.example")], GEN, 403, "closed"),
    "400 bad json": ("app", "POST", "/complete", [JSON_TYPE], b"{oops", 400, "closed"),
    "400 not an upgrade": ("app", "GET", "/ws", [], None, 400, "closed"),
    "426 refused upgrade": ("app", "GET", "/ws", [*UPGRADE, ("Sec-WebSocket-Version", "8")], None, 426, "closed"),
    "431 head too large": ("app", "GET", "/health", [("X-Big", "a" * 20000)], None, 431, "closed"),
    "503 busy": ("busy", "POST", "/stream", [JSON_TYPE], GEN, 503, "closed"),
}


@pytest.mark.parametrize("case", list(H11_CASES))
def test_h11_parses_every_kind_of_response(apps, app, ended, case):
    where, method, target, headers, body, status, expect_after = H11_CASES[case]
    server = apps(max_active=0) if where == "busy" else app
    target = target.format(**ended)
    headers = [(k, v.format(**ended)) for k, v in headers]
    h = H11(server.port)
    try:
        h.send(method, target, headers, body, send_body=status != 413)  # a 413 comes before the body
        response, got, data = h.response()
        assert response.status_code == status, (response, data[:300])
        assert response.http_version == b"1.1"
        if status >= 400:
            assert got["content-type"] == "application/json" and got["connection"] == "close"
            assert json.loads(data)["error"]["status"] == status
        if method == "HEAD":
            assert data == b""
        elif status == 200 and got["content-type"].startswith("text/event-stream"):
            assert got["transfer-encoding"] == "chunked" and "content-length" not in got
            events = sse.parse_events(data)
            assert "end" in [e.event for e in events]
        elif status == 200 and "content-length" in got:
            assert int(got["content-length"]) == len(data)
        if status == 201:
            assert got["location"] == f"/generations/{json.loads(data)['id']}"
        if status == 204:
            assert data == b"" and "content-length" not in got and "transfer-encoding" not in got
        if status == 405:
            assert got["allow"] == "POST"
        if status == 426:
            assert got["sec-websocket-version"] == "13"
        if status == 503:
            assert got["retry-after"] == "1"
        assert h.after() == expect_after
        if expect_after == "keep-alive":  # the same socket carries another request
            h.send("GET", "/health")
            again, _, data = h.response()
            assert again.status_code == 200 and json.loads(data)["ok"] is True
            assert h.after() == "keep-alive"
    finally:
        h.close()


def test_h11_reports_the_switch_to_websocket(app):
    h = H11(app.port)
    try:
        h.send("GET", "/ws", [*UPGRADE, ("Sec-WebSocket-Version", "13")])
        response, got, _ = h.response()
        assert isinstance(response, h11.InformationalResponse) and response.status_code == 101
        assert h.conn.our_state is h11.SWITCHED_PROTOCOL and h.conn.their_state is h11.SWITCHED_PROTOCOL
        assert h.conn.next_event() is h11.PAUSED
        assert got["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        assert got["upgrade"].lower() == "websocket" and "upgrade" in got["connection"].lower()
        leftover, _ = h.conn.trailing_data  # bytes after the 101 belong to the WebSocket
        h.sock.sendall(websocket_frames.encode_frame(websocket_frames.Opcode.CLOSE, websocket_frames.encode_close_payload(1000), mask=True))
        decoder = websocket_frames.FrameDecoder(expect_masked=False)
        frames = decoder.feed(leftover)
        while not frames:
            chunk = h.sock.recv(65536)
            assert chunk, "closed without a CLOSE frame"
            frames += decoder.feed(chunk)
        assert frames[0].opcode == websocket_frames.Opcode.CLOSE and websocket_frames.parse_close_payload(frames[0].payload)[0] == 1000
    finally:
        h.close()


@pytest.mark.parametrize("target, status", [("/nowhere", 404), ("/stream", 405), ("/ws", 405),
                                            ("/generations/nope/events", 404)])
def test_h11_refusal_of_a_head_request_has_no_body(app, target, status):
    """RFC 9110 9.3.2: no content in a response to HEAD, refusals included (h11 reads any as a protocol error)."""
    h = H11(app.port)
    try:
        h.send("HEAD", target)
        response, _, data = h.response()
        assert response.status_code == status and data == b""
        assert h.after() == "closed"  # h11.RemoteProtocolError here: the body followed the head
    finally:
        h.close()
