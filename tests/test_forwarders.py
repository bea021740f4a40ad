"""The forwarders of streamlab.hops.forwarders, fed plain byte strings: no sockets, no clock.

Each forwarder is what one kind of hop does to a body; the proxy's tests
(test_proxy.py) check the same forwarders between real sockets.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamlab.hops.forwarders import (
    BlockBuffer,
    CuttingForwarder,
    EventSplitter,
    PassThrough,
    WholeResponse,
    choose_forwarder,
    forwarder_for,
)
from streamlab.hops.proxy import ProxyConfig
from streamlab.protocol.http_body import LAST_CHUNK, ChunkedDecoder
from streamlab.protocol.http_head import Request, RequestHeadParser, Response
from streamlab.protocol.sse import MAX_LINE, encode_comment, encode_event, parse_events


def _response(*headers: tuple[str, str]) -> Response:
    return Response(200, "OK", "HTTP/1.1", [(name.lower(), value) for name, value in headers])


def _request(method: str = "GET") -> Request:
    return RequestHeadParser().feed(f"{method} /stream HTTP/1.1\r\nHost: x\r\n\r\n".encode())


# --------------------------------------------------------------------------
# The block buffer (pure)
# --------------------------------------------------------------------------


def test_block_buffer_holds_until_a_block_is_full():
    buffer = BlockBuffer(8)
    assert buffer.feed(b"abc") == []
    assert buffer.held == 3
    assert buffer.feed(b"defgh") == [b"abcdefgh"]
    assert buffer.held == 0
    assert buffer.finish() == b""


def test_block_buffer_splits_big_input_into_exact_blocks():
    buffer = BlockBuffer(4)
    assert buffer.feed(b"0123456789") == [b"0123", b"4567"]
    assert buffer.held == 2
    assert buffer.feed(b"ab") == [b"89ab"]
    assert buffer.feed(b"xyz") == []
    assert buffer.finish() == b"xyz"  # the remainder, at the end of the body
    assert buffer.finish() == b""


def test_block_buffer_of_one_byte_forwards_everything():
    assert BlockBuffer(1).feed(b"abc") == [b"a", b"b", b"c"]


def test_block_buffer_refuses_empty_blocks():
    with pytest.raises(ValueError):
        BlockBuffer(0)


@given(
    pieces=st.lists(st.binary(max_size=50), max_size=30),
    block=st.integers(min_value=1, max_value=64),
)
def test_block_buffer_loses_nothing_and_writes_only_whole_blocks(pieces, block):
    buffer = BlockBuffer(block)
    out = []
    for piece in pieces:
        blocks = buffer.feed(piece)
        assert all(len(b) == block for b in blocks)
        assert buffer.held < block
        out += blocks
    tail = buffer.finish()
    assert len(tail) < block
    assert b"".join(out) + tail == b"".join(pieces)


def test_pass_through_forwards_at_once():
    forwarder = PassThrough()
    assert forwarder.feed(b"data: hi\n\n") == [b"data: hi\n\n"]
    assert forwarder.feed(b"") == []
    assert forwarder.finish() == b""




@pytest.mark.parametrize(
    ("honor", "header", "mode"),
    [
        (True, "no", "passthrough"),
        (True, "No ", "passthrough"),
        (True, None, "buffering block=8192"),
        (True, "yes", "buffering block=8192"),
        (False, "no", "buffering block=8192"),
    ],
)
def test_choose_forwarder(honor, header, mode):
    headers = [("X-Accel-Buffering", header)] if header is not None else []
    assert choose_forwarder(_response(*headers), block=8192, honor=honor).label == mode


def test_whole_response_holds_everything_head_included():
    forwarder = WholeResponse()
    assert forwarder.holds_head and forwarder.feed(b"data: a\n\n") == [] and forwarder.feed(b"data: b\n\n") == []
    assert forwarder.held == 18 and forwarder.finish() == b"data: a\n\ndata: b\n\n"


# --------------------------------------------------------------------------
# Where events end: the SSE parser, not a pattern
# --------------------------------------------------------------------------


def test_event_splitter_returns_each_block_with_its_events():
    splitter = EventSplitter()
    blocks = splitter.feed(b": ping\n\nevent: end\ndata: {}\n\ndata: par")
    assert [block for block, _ in blocks] == [b": ping\n", b"\n", b"event: end\ndata: {}\n\n"]  # a comment is a line
    assert [[e.event for e in events] for _, events in blocks] == [[], [], ["end"]]
    assert splitter.held == 9
    assert splitter.feed(b"t\n\n") == [(b"data: part\n\n", parse_events(b"data: part\n\n"))]
    assert splitter.feed(b"\n") == [(b"\n", [])]  # a stray blank line dispatches nothing
    assert splitter.rest() == b""


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_event_splitter_knows_every_line_ending_even_split_across_reads(eol):
    stream = b"data: one" + eol + eol + b"id: 2" + eol + b"data: two" + eol + eol
    splitter = EventSplitter()
    blocks = [block for byte in range(len(stream)) for block in splitter.feed(stream[byte : byte + 1])]
    assert b"".join(block for block, _ in blocks) == stream
    assert [e.data for _, events in blocks for e in events] == ["one", "two"]


def test_a_line_past_the_parsers_limit_is_passed_on_as_it_is():
    splitter = EventSplitter()
    long = b"data: " + b"x" * (MAX_LINE + 10)
    ((block, events),) = splitter.feed(b"data: a\n\n" + long)[1:]
    assert block == long and events == []
    assert splitter.feed(b"\n\ndata: b\n\n") == [(b"\n\ndata: b\n\n", [])]  # no event stream any more


# --------------------------------------------------------------------------
# The cutting forwarder
# --------------------------------------------------------------------------

EVENTS = [encode_event(f'{{"text": "piece {i}"}}') for i in range(6)]
STREAM = b"".join(EVENTS) + encode_event("[DONE]")


def dechunk(out: list[bytes]) -> tuple[bytes, bool]:
    """What a reader of the chunked body gets, and whether it ended with the zero-length chunk."""
    decoder = ChunkedDecoder()
    body = b"".join(decoder.feed(b"".join(out)))
    return body, decoder.done


@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_the_cut_comes_after_n_whole_events_wherever_the_reads_split_them(cuts):
    forwarder = CuttingForwarder(3)
    points = sorted({0, *cuts, len(STREAM)})
    out = [chunk for a, b in zip(points, points[1:]) for chunk in forwarder.feed(STREAM[a:b])]
    out.append(forwarder.finish())
    body, clean = dechunk(out)
    assert body == b"".join(EVENTS[:3]) and clean  # three whole events, then the clean end
    assert forwarder.ended and forwarder.counted == 3
    assert out[-2].endswith(LAST_CHUNK) and out[-1] == b"" and forwarder.feed(b"data: more\n\n") == []


def test_only_the_events_that_count_count_and_comments_pass_between_them():
    def carries_text(event):
        return "text" in event.data

    stream = encode_event("{}", event="start") + encode_comment("ping") + EVENTS[0] + encode_comment("ping") + EVENTS[1]
    forwarder = CuttingForwarder(2, carries_text)
    body, clean = dechunk(forwarder.feed(stream + EVENTS[2]))
    assert body == stream and clean and forwarder.counted == 2


def test_a_stream_that_ends_first_is_passed_whole_and_ended_with_the_last_chunk():
    forwarder = CuttingForwarder(10)
    out = forwarder.feed(EVENTS[0] + b"data: unfinish")
    assert dechunk(out) == (EVENTS[0], False) and forwarder.held == len(b"data: unfinish")
    out.append(forwarder.finish())
    assert dechunk(out) == (EVENTS[0] + b"data: unfinish", True)  # what the upstream sent, and the end
    assert not forwarder.ended and forwarder.finish() == b""  # the upstream ended it, not the cut; once


def test_the_cutting_forwarder_frames_its_own_body_and_refuses_no_events():
    assert ("Transfer-Encoding", "chunked") in CuttingForwarder(1).headers
    assert CuttingForwarder(1).feed(b"") == []
    with pytest.raises(ValueError):
        CuttingForwarder(0)


# --------------------------------------------------------------------------
# Which forwarder a response gets
# --------------------------------------------------------------------------


def test_forwarder_for_cuts_only_event_streams_that_have_a_body():
    config = ProxyConfig(1, block=1, cut_after=4)
    stream = _response(("Content-Type", "text/event-stream; charset=utf-8"))
    assert isinstance(forwarder_for(_request(), stream, config), CuttingForwarder)
    assert isinstance(forwarder_for(_request("HEAD"), stream, config), PassThrough)
    assert isinstance(forwarder_for(_request(), _response(("Content-Type", "application/json")), config), PassThrough)
    assert isinstance(forwarder_for(_request(), stream, ProxyConfig(1, block=1)), PassThrough)
    holding = ProxyConfig(1, cut_after=4, buffer_response=True)
    assert isinstance(forwarder_for(_request(), stream, holding), WholeResponse)  # a runtime holds it all first
