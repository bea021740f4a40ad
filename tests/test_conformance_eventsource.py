"""web-platform-tests' EventSource behaviour cases (web-platform-tests/wpt, eventsource/), for our client and server.

``streamlab.client.event_source`` is our ``EventSource``: these are the wpt
cases about what it does with a response (reconnect, fail, follow, send
back), each named by its file. Two kinds of server answer it:

- a scripted one here (``Scripted``: canned responses in order, as wpt's
  ``resources/*.py`` give them, and every request head kept), for the
  answers our server never gives: a bogus MIME type, odd statuses,
  redirects;
- our own in-process server, over the fake model, for the rest: a
  generation's events read to the end, the reconnect it answers with 204,
  a 404 for a stream it does not know, JSON where an event stream was
  expected, and a redirect that lands on it.

The reconnection time is taken from the stream's ``retry:``, so each script
sets a short one; ``run.waits`` says what the client waited, without
timing anything.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from contextlib import contextmanager
from typing import Iterator

import pytest
from streamlab.client import timed as client
from streamlab.client import tracing
from streamlab.client.event_source import EventSourceRun, event_source

pytestmark = pytest.mark.timeout(60)

STREAM = "text/event-stream"
FAST = b"retry: 10\n"  # 10 ms before each reconnect


def response(body: bytes = b"", status: int = 200, content_type: str | None = STREAM,
             headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    lines = [f"HTTP/1.1 {status} TEST", "Connection: close", *(f"{k}: {v}" for k, v in headers)]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Scripted:
    """A server that answers its n-th request with ``answers[n]`` (the last one again after that), then closes."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.heads: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                self.heads.append(head)
                conn.sendall(self.answers[min(len(self.heads), len(self.answers)) - 1])

    def header(self, n: int, name: str) -> bytes | None:
        """Header ``name`` of the n-th request, as bytes on the wire (None: not sent)."""
        for line in self.heads[n].split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip()
        return None

    def close(self) -> None:
        self.sock.close()


@contextmanager
def scripted(*answers: bytes) -> Iterator[Scripted]:
    server = Scripted(list(answers))
    try:
        yield server
    finally:
        server.close()


def read(port: int, path: str = "/events", max_connections: int = 4, **kw) -> EventSourceRun:
    return asyncio.run(event_source(port, path, retry=0.01, max_connections=max_connections, timeout=10, **kw))


def data(run: EventSourceRun) -> list[str]:
    """The data of every event the page would have been given (message events; no errors, no comments)."""
    return [str(e.data) for t in run.traces for e in t.events if e.kind == "message"]


# --------------------------------------------------------------------------
# Against a scripted server
# --------------------------------------------------------------------------


def test_eventsource_reconnect_after_a_normal_end():
    # eventsource-reconnect.js with status-reconnect.py?status=200&ok_first: the stream ends, the client comes back.
    with scripted(response(FAST + b"data: ok\n\n"), response(b"data: data\n\n"), response(status=204)) as s:
        run = read(s.port)
    assert data(run) == ["ok", "data"] and run.outcome == "204" and len(s.heads) == 3
    assert run.waits == [0.01, 0.01]


def test_reconnect_fail_sequence():
    # resources/reconnect-fail.py: opened, reconnected, then 204 ends it for good.
    with scripted(response(b"retry: 2\ndata: opened\n\n"), response(b"data: reconnected\n\n"),
                  response(b"data: closed\n\n", status=204)) as s:
        run = read(s.port, max_connections=8)
    assert data(run) == ["opened", "reconnected"] and run.outcome == "204" and len(s.heads) == 3
    assert run.waits == [0.002, 0.002]


@pytest.mark.parametrize("status", [204, 205, 210, 299, 404, 410, 503])
def test_request_status_error(status):
    # request-status-error.htm: any status but 200 fails the connection; no event, no reconnect.
    with scripted(response(b"data: data\n\n", status=status)) as s:
        run = read(s.port)
    assert len(s.heads) == 1 and data(run) == []
    assert run.outcome == ("204" if status == 204 else f"failed {status}")


@pytest.mark.parametrize("case,content_type", [("format-mime-bogus", "x bogus"),
                                               ("format-mime-valid-bogus", "text/x-bogus"), ("no Content-Type", None)])
def test_a_wrong_mime_type_fails_the_connection(case, content_type):
    with scripted(response(b"data: data\n\n", content_type=content_type)) as s:
        run = read(s.port)
    assert run.outcome == "failed mime" and len(s.heads) == 1 and data(run) == [], case


@pytest.mark.parametrize("case,content_type", [("format-mime-trailing-semicolon", "text/event-stream;"),
                                               ("format-utf-8", "text/event-stream;charset=windows-1252"),
                                               ("case-insensitive", "Text/Event-Stream")])
def test_a_valid_mime_type_with_parameters_is_an_event_stream(case, content_type):
    with scripted(response(FAST + "data: ok…\n\n".encode(), content_type=content_type), response(status=204)) as s:
        run = read(s.port)
    assert data(run) == ["ok…"] and run.outcome == "204", case  # always UTF-8, whatever the charset says


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_request_redirect(status):
    # request-redirect.htm: followed; the reconnect goes to the first URL again.
    with scripted(response(FAST + b"data: there\n\n"), response(status=204)) as target:
        location = f"http://127.0.0.1:{target.port}/message"
        with scripted(response(status=status, content_type=None, headers=(("Location", location),))) as first:
            run = read(first.port)
    assert data(run) == ["there"] and run.outcome == "204"
    assert run.redirects == [(status, location)] * 2 and len(first.heads) == 2
    assert target.heads[0].startswith(b"GET /message HTTP/1.1")


def test_redirects_past_the_limit_fail():
    with scripted(response(status=302, content_type=None, headers=(("Location", "/again"),))) as s:
        run = read(s.port)
    assert run.outcome == "failed redirects" and len(s.heads) == 21


def test_request_accept_and_cache_control():
    # request-accept.htm, request-cache-control.any.js: what an EventSource's request says.
    with scripted(response(status=204)) as s:
        read(s.port)
    assert s.header(0, "Accept") == b"text/event-stream"
    assert s.header(0, "Cache-Control") == b"no-cache"
    assert s.header(0, "Last-Event-ID") is None


def test_format_field_id_sends_the_id_back_as_utf8():
    # format-field-id.htm with resources/last-event-id.py: id U+2026, sent back as its three UTF-8 bytes.
    with scripted(response("id: …\nretry: 10\ndata: hello\n\n".encode()), response(status=204)) as s:
        run = read(s.port)
    assert run.outcome == "204" and s.header(1, "Last-Event-ID") == "…".encode("utf-8")


def test_format_field_id_2_the_id_persists_across_reconnects():
    # format-field-id-2: the second connection's event has no id; the third request still sends the first id.
    with scripted(response(b"id: 1\nretry: 10\ndata: hello\n\n"), response(b"data: 1\n\n"), response(status=204)) as s:
        run = read(s.port)
    assert run.outcome == "204" and s.header(1, "Last-Event-ID") == s.header(2, "Last-Event-ID") == b"1"
    assert [e.id for t in run.traces for e in t.events] == ["1", "1"]


@pytest.mark.parametrize("stream", [b"id: 1\ndata: 1\n\nid:\ndata: 2\n\n", b"id: 1\ndata: 1\n\nid\ndata: 2\n\n"])
def test_format_field_id_3_a_reset_id_sends_no_header(stream):
    with scripted(response(FAST + stream), response(status=204)) as s:
        read(s.port)
    assert s.header(1, "Last-Event-ID") is None


@pytest.mark.parametrize("value", [b"\0\0", b"x\0", b"\0x", b"x\0x", b" \0"])
def test_format_field_id_null_sends_no_header(value):
    with scripted(response(b"id: " + value + b"\nretry: 10\ndata: hello\n\n"), response(status=204)) as s:
        read(s.port)
    assert s.header(1, "Last-Event-ID") is None


def test_format_data_before_final_empty_line_sends_no_id():
    # The id of a block the stream cut off before its blank line was never delivered: not sent back.
    with scripted(response(b"retry:10\ndata:test1\n\nid:test\ndata:test2\n"), response(status=204)) as s:
        run = read(s.port)
    assert data(run) == ["test1"] and s.header(1, "Last-Event-ID") is None


def test_an_id_only_block_is_sent_back():
    # The standard's "dispatch the event", step 1: a block with an id and no data still sets the string.
    with scripted(response(FAST + b"data: a\n\nid: 42\n\n"), response(status=204)) as s:
        read(s.port)
    assert s.header(1, "Last-Event-ID") == b"42"


@pytest.mark.parametrize("case,stream,wait", [("format-field-retry (scaled)", b"retry:020\ndata:x\n\n", 0.02),
                                              ("format-field-retry-bogus (scaled)", b"retry:20\nretry:10x\ndata:x\n\n",
                                               0.02),
                                              ("format-field-retry-empty", b"retry\ndata:x\n\n", 0.01)])
def test_the_reconnection_time_is_the_streams(case, stream, wait):
    with scripted(response(stream), response(status=204)) as s:
        run = read(s.port)
    assert run.waits == [wait], case  # 0.01: the client's own default here, as nothing valid was set


def test_a_connection_that_cannot_be_made_is_retried():
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nobody listens there now
    run = read(port, max_connections=3)
    assert run.outcome == "gave up" and len(run.traces) == 3 and all(t.error for t in run.traces)


# --------------------------------------------------------------------------
# Against our server
# --------------------------------------------------------------------------

BODY = {"prompt": "Tell me about lighthouses.", "max_tokens": 4}


def test_our_server_reconnect_after_the_end_gets_204(app):
    # eventsource-reconnect against /generations/{id}/events: the answer, then one reconnect, answered 204.
    created = client.create_generation_sync(app.port, BODY)
    run = read(app.port, created["events"])
    assert run.outcome == "204" and len(run.traces) == 2 and run.ended
    last = [e.id for e in run.traces[0].events if e.id][-1]
    assert tracing.last_id(run.traces[0]) == last and run.waits == [1.0]  # the server's retry: 1000


def test_our_server_resumes_after_the_last_event_id_sent_back(app):
    created = client.create_generation_sync(app.port, BODY)
    first = client.events_sync(app.port, created["events"], stop_after=2)
    rest = client.events_sync(app.port, created["events"], last_event_id=tracing.last_id(first))
    assert first.text + rest.text == client.events_sync(app.port, created["events"]).text
    assert [int(e.id) for e in rest.events if e.id][0] == int(tracing.last_id(first)) + 1


def test_our_server_unknown_stream_is_request_status_error(app):
    run = read(app.port, "/generations/nothing-here/events")
    assert run.outcome == "failed 404" and len(run.traces) == 1


def test_our_server_json_where_a_stream_was_expected_fails(app):
    created = client.create_generation_sync(app.port, BODY)
    run = read(app.port, f"/generations/{created['id']}")  # the generation's state: JSON, not an event stream
    assert run.outcome == "failed mime" and len(run.traces) == 1


def test_a_redirect_to_our_server(app):
    created = client.create_generation_sync(app.port, BODY)
    location = f"http://127.0.0.1:{app.port}{created['events']}"
    with scripted(response(status=307, content_type=None, headers=(("Location", location),))) as first:
        run = read(first.port)
    assert run.ended and run.outcome == "204" and len(first.heads) == 2
    assert run.traces[0].text == client.events_sync(app.port, created["events"]).text
