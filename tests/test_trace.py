"""Tests for streamlab.client.tracing: the Trace's arithmetic, and its recorders fed plain byte strings."""

from __future__ import annotations

import json

import pytest

from streamlab.protocol import sse
from streamlab.client.tracing import ResponseRecorder, Trace, TraceEvent, last_id, record_message


def text_event(text: str, id: str | None = None) -> bytes:  # noqa: A002
    return sse.encode_event(json.dumps({"text": text}, ensure_ascii=False), id=id)


def feed_all(recorder: ResponseRecorder, *parts: bytes) -> None:
    """Feed ``parts`` as separate reads, at times 0.1, 0.2, ..."""
    for i, part in enumerate(parts, 1):
        recorder.feed(part, i / 10)


# --------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------


def test_trace_properties():
    trace = Trace(way="stream", text="héllo", total_bytes=60)
    trace.events = [TraceEvent(0.1, "text", "hé"), TraceEvent(0.15, "ping"), TraceEvent(0.3, "text", "llo")]
    assert trace.text_bytes == 6
    assert trace.ratio == 10
    assert trace.gaps() == pytest.approx([0.2])
    assert trace.summary()["text_events"] == 2


def test_ratio_without_text_is_nan():
    trace = Trace(way="stream", total_bytes=60)
    assert trace.ratio != trace.ratio and trace.gaps() == []


def test_recording_bytes_and_finishing():
    trace = Trace(way="stream")
    trace.chunks = [(0.1, 10), (0.4, 5)]
    trace.got_event(0.2, "text", "a")
    trace.got_event(0.3, "text", "b")
    assert trace.text == "ab" and trace.first_text == 0.2
    trace.finish()
    assert trace.end == 0.4  # no end marker: the answer ended with the last bytes
    trace.got_end(0.5, {"stop_reason": "eos", "tokens": 2, "id": "7"})
    assert (trace.end, trace.stop_reason, trace.tokens, trace.request_id) == (0.5, "eos", 2, "7")


def test_last_id_is_the_stream_s_last_event_id_string():
    trace = Trace(way="events")
    assert last_id(trace) is None
    recorder = ResponseRecorder(trace, "GET")
    recorder.feed(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n", 0.0)
    recorder.feed(b'id: 1\ndata: {"text": "a"}\n\nid: 2\ndata: {"text": "b"}\n\n: ping\n\nid: 3\ndata: {"te', 0.1)
    recorder.eof()
    assert [e.id for e in trace.events if e.kind == "text"] == ["1", "2"]
    assert last_id(trace) == "2"  # the block with id 3 never ended: a browser would resume after 2


def test_a_drop_mid_read_loses_what_came_after_the_piece_it_followed():
    """A whole backlog in one read, the connection lost after its 2nd piece: the 3rd and the end never came."""
    trace = Trace(way="events")
    recorder = ResponseRecorder(trace, "GET")
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    backlog = (text_event("a", id="1") + text_event("b", id="2") + text_event("c", id="3")
               + sse.encode_event('{"stop_reason": "eos", "tokens": 3}', event="end"))
    feed_all(recorder, head, backlog)
    trace.chunks, trace.total_bytes = [(0.1, len(head)), (0.2, len(backlog))], len(head) + len(backlog)
    assert trace.stop_reason == "eos" and last_id(trace) == "3"
    trace.finish()
    trace.cut_after(2)
    assert [(e.kind, e.id) for e in trace.events] == [("text", "1"), ("text", "2")]
    assert trace.text == "ab" and last_id(trace) == "2" and trace.left and not trace.complete
    assert trace.stop_reason is None and trace.tokens is None and trace.end == 0.2
    trace.cut_after(5)  # fewer pieces than that: nothing to lose
    assert trace.text == "ab"


# --------------------------------------------------------------------------
# ResponseRecorder
# --------------------------------------------------------------------------


def test_event_stream_with_ids_pings_and_end():
    trace = Trace(way="events")
    recorder = ResponseRecorder(trace, "GET")
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Request-Id: 5\r\nConnection: close\r\n\r\n"
    body = (
        text_event("Hel", id="1")
        + sse.encode_comment("ping")
        + text_event("lo", id="2")
        + sse.encode_event('{"stop_reason": "eos", "tokens": 2}', event="end")
    )
    feed_all(recorder, head, body[:7], body[7:])
    assert trace.status == 200 and trace.request_id == "5" and trace.way == "stream"
    assert [(e.kind, e.id) for e in trace.events] == [("text", "1"), ("text", "2"), ("end", "2"), ("ping", None)]
    assert trace.text == "Hello" and trace.stop_reason == "eos" and trace.end == 0.3
    assert not recorder.done
    recorder.eof()  # a close-delimited body ends with the connection
    assert recorder.done and trace.body == body


def test_done_marker_completes_the_trace():
    trace = Trace(way="stream")
    recorder = ResponseRecorder(trace)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    feed_all(recorder, head + text_event("a") + sse.encode_done())
    assert trace.complete and [e.kind for e in trace.events] == ["text", "done"]
    assert trace.events[0].nbytes == len(text_event("a"))


def test_interim_response_then_whole_body():
    trace = Trace(way="complete")
    recorder = ResponseRecorder(trace)
    body = json.dumps({"text": "Hi", "tokens": 1, "stop_reason": "eos"}).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    feed_all(recorder, b"HTTP/1.1 100 Continue\r\n\r\n" + head, body[:4], body[4:])
    assert recorder.done and trace.complete and trace.text == "Hi" and trace.status == 200
    assert trace.events[0].nbytes == len(body) and trace.first_text == trace.end == 0.3


def test_cut_body_stays_incomplete():
    trace = Trace(way="complete")
    recorder = ResponseRecorder(trace)
    feed_all(recorder, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b'{"text": "Hel')
    recorder.eof()
    assert not recorder.done and not trace.complete and trace.text == ""


def test_error_status_becomes_an_error_event():
    trace = Trace(way="fetch")
    recorder = ResponseRecorder(trace, "POST")
    body = b'{"error": {"status": 415, "message": "POST needs Content-Type: application/json"}}'
    head = f"HTTP/1.1 415 Unsupported Media Type\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    feed_all(recorder, head + body)
    assert trace.status == 415 and trace.stop_reason == "error" and trace.error["status"] == 415
    assert bytes(recorder.raw) == body


# --------------------------------------------------------------------------
# record_message (WebSocket)
# --------------------------------------------------------------------------


def test_record_message_kinds():
    trace = Trace(way="ws")
    record_message(trace, '{"text": "Hi"}', 16, 0.1)
    record_message(trace, '{"id": "w1", "info": 1}', 25, 0.2)
    record_message(trace, "not json", 10, 0.25)
    record_message(trace, '{"done": true, "stop_reason": "eos", "tokens": 1, "id": "w1"}', 60, 0.3)
    assert [e.kind for e in trace.events] == ["text", "message", "message", "done"]
    assert trace.complete and trace.text == "Hi" and trace.end == 0.3 and trace.request_id == "w1"
    assert trace.events[0].nbytes == 16 and trace.events[2].data == "not json"


def test_record_message_error():
    trace = Trace(way="ws")
    record_message(trace, '{"error": {"status": 400, "message": "bad"}, "id": "w2"}', 50, 0.1)
    assert not trace.complete and trace.stop_reason == "error" and trace.request_id == "w2"
    assert trace.error == {"status": 400, "message": "bad"}
