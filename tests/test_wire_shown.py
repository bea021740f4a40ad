"""The wire laid out (protocol.anatomy) and chapter 2's raw exchanges (lab.wire_shown), over the fake model."""

from __future__ import annotations

import json

import pytest

from streamlab.protocol import websocket_handshake
from streamlab.protocol.anatomy import frame_layout, split_chunks, visible
from streamlab.protocol.http_body import encode_chunk
from streamlab.protocol.websocket_frames import encode_frame


def test_split_chunks_keeps_the_framing_and_stops_at_the_last_chunk():
    body = encode_chunk(b"data: a\n\n") + b"1a;ext=1\r\n" + b"x" * 26 + b"\r\n" + b"0\r\n\r\nextra"
    chunks, rest = split_chunks(body)
    assert [c.size for c in chunks] == [9, 26, 0]
    assert chunks[0].size_line == b"9\r\n" and chunks[0].data == b"data: a\n\n"
    assert chunks[1].size_line == b"1a;ext=1\r\n"  # an extension is kept and ignored
    assert rest == b"extra"
    assert b"".join(c.wire for c in chunks) == body[: -len(b"extra")]


def test_split_chunks_leaves_an_unfinished_chunk_unparsed():
    body = encode_chunk(b"abc") + b"10\r\nonly part"
    chunks, rest = split_chunks(body)
    assert [c.data for c in chunks] == [b"abc"] and rest == b"10\r\nonly part"
    with pytest.raises(ValueError):
        split_chunks(b"zz\r\n")
    with pytest.raises(ValueError):
        split_chunks(b"3\r\nabcXY")


@pytest.mark.parametrize("size, field, extended", [(5, 5, 0), (300, 126, 2), (70000, 127, 8)])
def test_frame_layout_reads_each_field_of_a_masked_frame(size, field, extended):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frame = encode_frame(1, payload, mask=b"\x01\x02\x03\x04")
    layout = frame_layout(frame + b"next frame")
    assert layout.fin and layout.rsv == 0 and layout.opcode == 1 and layout.opcode_name == "text"
    assert layout.masked and layout.mask_key == b"\x01\x02\x03\x04"
    assert layout.length_field == field and len(layout.extended_length) == extended and layout.length == size
    assert layout.payload == payload and (size == 0 or layout.wire_payload != payload)
    assert layout.size == len(frame)


def test_frame_layout_of_a_server_frame_and_of_a_cut_one():
    layout = frame_layout(encode_frame(9, b"hb", fin=True))
    assert not layout.masked and layout.mask_key == b"" and layout.opcode_name == "ping" and layout.payload == b"hb"
    with pytest.raises(ValueError):
        frame_layout(encode_frame(1, b"hello")[:-1])


def test_visible_writes_line_endings_out():
    assert visible(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n") == ["HTTP/1.1 200 OK\\r\\n", "A: b\\r\\n", "\\r\\n"]
    assert visible("data: é\n\n\x01".encode()) == ["data: é\\n", "\\n", "\\x01"]


def test_the_raw_event_stream_shows_every_kind_of_line(apps):
    from streamlab.lab.experiments.wire_shown import HEAD_WHY, sse_wire_sync

    app = apps(pauses={2: 0.3}, ping_interval=0.08)
    seen = []
    wire = sse_wire_sync(app.port, {"prompt": "hi", "max_tokens": 5, "chat": False}, on_read=seen.append)
    assert seen == wire.reads and wire.status_line == "HTTP/1.1 200 OK"
    fields = {row["field"].lower(): row for row in wire.field_rows()}
    for name in ("content-type", "cache-control", "x-accel-buffering", "transfer-encoding"):
        assert fields[name]["why it is there"] == HEAD_WHY[name]
    assert fields["content-type"]["value"].startswith("text/event-stream")
    assert fields["transfer-encoding"]["value"] == "chunked"
    assert {"data", "id", "event", "retry", "comment"} <= wire.line_kinds()
    assert wire.ended and wire.leftover == b""
    rows = wire.chunk_rows()
    for row in rows:  # each size line says the size of its chunk, in hex
        assert int(row["size line"].split("\\")[0], 16) == row["size (bytes)"]
    assert rows[0]["lines"].startswith("id, retry") and rows[-1]["lines"] == "end of body"
    times = [row["arrived (s)"] for row in rows]
    assert times == sorted(times)
    events = wire.events
    assert [e.id for e in events] == [str(i) for i in range(1, len(events) + 1)] and events[-1].event == "end"
    assert events[0].retry is not None and all(e.retry is None for e in events[1:])


def test_the_websocket_upgrade_and_frames_laid_out(app):
    from streamlab.lab.experiments.wire_shown import frame_rows, websocket_wire_sync

    body = {"prompt": "hi", "max_tokens": 3, "chat": False}
    wire = websocket_wire_sync(app.port, body)
    assert wire.status == 101 and wire.accept_sent == websocket_handshake.accept_key(wire.key) and wire.accept_matches
    assert wire.response_head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    mine = wire.client_layout
    assert mine.masked and len(mine.mask_key) == 4 and json.loads(mine.payload) == body
    assert mine.wire_payload != mine.payload
    theirs = wire.server_layout
    assert not theirs.masked and json.loads(theirs.payload) == json.loads(wire.messages[0])
    assert json.loads(wire.messages[-1])["done"] is True and wire.close_code == 1000
    fields = [row["field"] for row in frame_rows(mine)]
    assert fields == ["FIN", "RSV1-3", "opcode", "MASK", "payload length", "masking key", "payload"]
    assert "masking key" not in [row["field"] for row in frame_rows(theirs)]


def test_code_listing_leaves_docstrings_out():
    from streamlab.lab.experiments.wire_shown import code_listing
    from streamlab.protocol.http_body import encode_chunk as chunk

    listing = code_listing(chunk)
    assert listing.startswith("# streamlab/protocol/http_body.py\ndef encode_chunk")
    assert "One chunk" not in listing and 'f"{len(data):x}' in listing
