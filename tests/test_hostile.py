"""A stranger at the door: every refusal of chapter 9, the deadlines, the caps, in process over a fake model.

Each row of ``streamlab.lab.experiments.refusals.CASES`` is the chapter's refusal table; here
every one is asserted, and after each a normal stream must still succeed.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import threading
import time
import tracemalloc

import httpx
import pytest
from fakes import FakeLM
from inprocess import serving

from streamlab.client import timed as client
from streamlab.lab.experiments import refusals
from streamlab.protocol import websocket_frames
from streamlab.protocol import websocket_handshake

pytestmark = pytest.mark.timeout(120)
OK = {"prompt": "Hi", "max_tokens": 4, "chat": False}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize("case", refusals.CASES, ids=[c.name for c in refusals.CASES])
def test_every_refusal_in_the_table(app, case):
    outcome = refusals.probe(app.port, case)
    assert outcome.answer == case.expect, outcome
    assert outcome.message  # a JSON error (or close reason) that says what is wrong
    assert client.post_sync(app.port, "/stream", OK).complete  # and the server serves everyone else


def test_the_table_has_at_least_twenty_rows():
    assert len(refusals.CASES) >= 20
    assert len({c.name for c in refusals.CASES}) == len(refusals.CASES)


def test_refused_requests_generate_and_store_nothing():
    with serving(FakeLM()) as server:
        cross_site = [c for c in refusals.CASES if c.expect in (403, 415) or "context" in c.name]
        for case in cross_site:
            assert refusals.probe(server.port, case).answer == case.expect
        assert client.get_json_sync(server.port, "/log") == []
        assert client.get_json_sync(server.port, "/conversations") == []
        assert server.store.conversations() == []


def test_the_servers_own_page_may_post_and_another_may_not(app):
    own = client.fetch_sync(app.port, "POST", "/stream", body=OK, headers=[("Origin", f"http://localhost:{app.port}")])
    assert own.status == 200
    other = client.fetch_sync(app.port, "POST", "/stream", body=OK, headers=[("Origin", f"http://localhost:{app.port + 1}")])
    assert other.status == 403


def test_allowed_origin_and_host_flags():
    with serving(FakeLM(), allowed_origins=("http://app.example",), allowed_hosts=("box.lan",)) as server:
        reply = client.fetch_sync(server.port, "POST", "/stream", body=OK, headers=[("Origin", "http://app.example")])
        assert reply.status == 200
        raw = f"GET /health HTTP/1.1\r\nHost: box.lan:{server.port}\r\nConnection: close\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(raw)
            assert read_all(sock).startswith(b"HTTP/1.1 200")


def test_slowloris_connections_are_cut_by_the_head_deadline():
    with serving(FakeLM(), head_timeout=0.4) as server:
        socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(20)]
        started = time.monotonic()
        cut = 0
        try:
            for step in range(30):  # a byte every 0.05 s: never a whole head
                for sock in socks:
                    try:
                        sock.sendall(b"GET /health HTTP/1.1\r\nX: "[step % 10:step % 10 + 1])
                    except OSError:
                        pass
                time.sleep(0.05)
            for sock in socks:
                data = read_all(sock)
                cut += data.startswith(b"HTTP/1.1 408")
        finally:
            for sock in socks:
                sock.close()
        assert cut == 20
        assert time.monotonic() - started < 10
        assert client.post_sync(server.port, "/stream", OK).complete


def test_a_body_that_never_ends_gets_408():
    with serving(FakeLM(), body_timeout=0.3) as server, socket.create_connection(("127.0.0.1", server.port), 5) as sock:
        sock.sendall(b"POST /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 50\r\n\r\n{\"prompt\":")
        assert read_all(sock).startswith(b"HTTP/1.1 408")


def test_a_silent_connection_is_closed_after_the_idle_timeout():
    with serving(FakeLM(), idle_timeout=0.3) as server, socket.create_connection(("127.0.0.1", server.port), 5) as sock:
        started = time.monotonic()
        assert read_all(sock) == b""  # closed, without a word: no request was begun
        assert time.monotonic() - started < 4


def test_connection_cap_answers_503_with_retry_after():
    with serving(FakeLM(), max_connections=3) as server:
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
        try:
            time.sleep(0.2)
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
                extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                data = read_all(extra)
            assert data.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in data
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)
        assert client.get_json_sync(server.port, "/health")["ok"]


def test_admission_limit_refuses_generations_beyond_it():
    # The refuse policy: 503 at once past max_active (the default queues; tests/test_queue.py has the line).
    with serving(FakeLM(decode_seconds=0.02), max_active=2, admission="refuse") as server:
        body = {"prompt": "Hi", "max_tokens": 100, "chat": False, "ignore_eos": True}
        created = [client.fetch_sync(server.port, "POST", "/generations", body=body) for _ in range(3)]
        assert [r.status for r in created] == [201, 201, 503]
        assert created[2].headers["retry-after"] == "1"
        stream = client.post_sync(server.port, "/stream", body)
        assert stream.status == 503
        socket_trace = client.websocket_sync(server.port, "Hi", 5)
        assert socket_trace.close_code == 1013
        assert len(server.store.conversations()) == 2  # the refused ones stored nothing
        for reply in created[:2]:
            client.fetch_sync(server.port, "POST", f"/generations/{reply.json()['id']}/cancel", body={})
        assert client.post_sync(server.port, "/stream", OK).complete


def test_websocket_idle_session_is_closed_1001():
    with serving(FakeLM(), ws_idle_timeout=0.4) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(websocket_handshake.client_handshake(f"127.0.0.1:{server.port}", "/ws", websocket_handshake.new_key()))
            data = read_all(sock)
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101")
        frames = websocket_frames.FrameDecoder(expect_masked=False).feed(rest)
        assert websocket_frames.parse_close_payload(frames[-1].payload)[0] == 1001


def test_websocket_without_pongs_is_closed_1011_and_a_ponging_one_is_pinged():
    with serving(FakeLM(), ws_ping_interval=0.2, ws_ping_timeout=0.2, ws_idle_timeout=30) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(websocket_handshake.client_handshake(f"127.0.0.1:{server.port}", "/ws", websocket_handshake.new_key()))
            data = read_all(sock)  # we never answer the ping
        frames = websocket_frames.FrameDecoder(expect_masked=False).feed(data.partition(b"\r\n\r\n")[2])
        assert frames[0].opcode == websocket_frames.Opcode.PING
        assert websocket_frames.parse_close_payload(frames[-1].payload) == (1011, "keepalive ping timeout")

        from websockets.sync.client import connect

        with connect(f"ws://127.0.0.1:{server.port}/ws", ping_interval=None) as conn:  # it answers pings itself
            time.sleep(1.0)  # several ping rounds: each answered, so it stays open
            conn.send(json.dumps({"prompt": "Hi", "max_tokens": 3, "chat": False}))
            messages = [json.loads(conn.recv(timeout=5)) for _ in range(4)]
        assert messages[-1]["done"] is True


def test_a_partial_frame_does_not_hold_the_session_open():
    with serving(FakeLM(), ws_idle_timeout=0.4) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(websocket_handshake.client_handshake(f"127.0.0.1:{server.port}", "/ws", websocket_handshake.new_key()))
            sock.sendall(websocket_frames.encode_frame(websocket_frames.Opcode.TEXT, b'{"prompt": "Hi"}', mask=True)[:5])
            data = read_all(sock)
        frames = websocket_frames.FrameDecoder(expect_masked=False).feed(data.partition(b"\r\n\r\n")[2])
        assert websocket_frames.parse_close_payload(frames[-1].payload)[0] == 1001


def test_httpx_pooled_client_reads_events_to_the_end_and_reuses_the_client():
    with serving(FakeLM()) as server, httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as http:
        for _ in range(20):
            created = http.post("/generations", json=OK)
            assert created.status_code == 201
            with http.stream("GET", created.json()["events"]) as events:
                assert events.headers["connection"] == "close"
                body = b"".join(events.iter_bytes())
            assert b"event: end" in body
            assert http.get("/health").json()["ok"]


def test_head_on_get_routes():
    with serving(FakeLM()) as server, httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as http:
        for path in ("/health", "/", "/log", "/conversations"):
            get, head = http.get(path), http.head(path)
            assert head.status_code == 200 and head.content == b""
            assert head.headers["content-length"] == get.headers["content-length"]
        assert http.head("/stream").status_code == 405


def test_an_unexpected_exception_is_a_json_500_without_a_traceback(capfd):
    with serving(FakeLM()) as server:

        async def broken(client_, request):  # noqa: ANN001
            raise KeyError("secret internals")

        server.routes[0].methods["GET"] = broken  # /complete answers GET with a bug
        reply = client.fetch_sync(server.port, "GET", "/complete")
        assert reply.status == 500 and reply.json() == {"error": {"status": 500, "message": "internal server error"}}
        assert b"secret" not in reply.body and b"Traceback" not in reply.body
        assert client.post_sync(server.port, "/stream", OK).complete
    assert capfd.readouterr().err.count("Traceback") == 1  # logged once, on the server's side


def test_after_every_hostile_case_descriptors_and_memory_come_back():
    with serving(FakeLM()) as server:
        for case in refusals.CASES:  # warm up: first-use allocations are not leaks
            refusals.probe(server.port, case)
        time.sleep(0.3)
        gc.collect()  # sockets other tests in this worker left to the collector close now, not mid-count
        fds = open_fds()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            for case in refusals.CASES:
                refusals.probe(server.port, case)
        assert client.post_sync(server.port, "/stream", OK).complete
        time.sleep(0.3)
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        gc.collect()
        assert open_fds() <= fds  # none of the 87 hostile requests kept a descriptor (fewer: another test's closed)
        assert grown < 8 * 1024 * 1024, grown  # the bound: 8 MiB for 87 hostile requests (no per-request leak)


def test_a_reader_leaving_during_a_long_prefill_stops_it_within_a_chunk():
    lm = FakeLM(prefill_seconds_per_token=0.0005, context_length=8192)
    with serving(lm, prefill_chunk=256) as server:
        long_prompt = {"prompt": "x" * 4000, "max_tokens": 5, "chat": False}
        trace = client.post_sync(server.port, "/stream", long_prompt, leave_after=0.3)
        assert not trace.complete
        records = server.jobs.log
        record = client.wait_log_sync(server.port, next(iter(records)))
        assert record["stop_signal"] == "eof" and record["stop_reason"] == "stopped" and record["tokens"] == 0
        assert record["prompt_tokens"] == 4000 and record["prompt_tokens_read"] < 4000


def test_a_short_request_is_answered_while_a_long_prompt_is_read():
    lm = FakeLM(prefill_seconds_per_token=0.0005, context_length=8192)
    with serving(lm, prefill_chunk=256) as server:
        done: dict = {}

        def long_one() -> None:
            long_prompt = {"prompt": "x" * 4000, "max_tokens": 2, "chat": False}
            done["long"] = client.post_sync(server.port, "/stream", long_prompt)
            done["long_at"] = time.monotonic()

        thread = threading.Thread(target=long_one)
        thread.start()
        time.sleep(0.3)
        short = client.post_sync(server.port, "/stream", {"prompt": "Hi", "max_tokens": 5, "chat": False})
        short_at = time.monotonic()
        thread.join(30)
        assert short.complete and done["long"].complete
        assert short_at < done["long_at"]  # it did not wait for the whole 4,000-token prefill
