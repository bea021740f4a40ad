"""Tests for streamlab.protocol.sse: encoding, and parsing by the WHATWG event-stream rules."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlab.protocol.sse import (
    DONE,
    MAX_LINE,
    Event,
    EventStreamParser,
    ProtocolError,
    encode_comment,
    encode_done,
    encode_event,
    parse_events,
)


def feed_bytewise(data: bytes) -> tuple[list[Event], EventStreamParser]:
    parser = EventStreamParser()
    events = []
    for i in range(len(data)):
        events += parser.feed(data[i : i + 1])
    events += parser.close()
    return events, parser


# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------


def test_encode_simple_data():
    assert encode_event("hello") == b"data: hello\n\n"


def test_encode_multiline_data_every_line_ending():
    assert encode_event("a\nb\r\nc\rd") == b"data: a\ndata: b\ndata: c\ndata: d\n\n"


def test_encode_does_not_split_on_other_unicode_line_breaks():
    # str.splitlines() would split on these; SSE does not.
    text = "a\u2028b\x0bc\x0cd\x85e"
    encoded = encode_event(text)
    assert encoded.count(b"data:") == 1
    assert parse_events(encoded) == [Event(text)]


def test_encode_empty_lines_in_data():
    assert encode_event("") == b"data:\n\n"
    assert encode_event("\n") == b"data:\ndata:\n\n"
    assert parse_events(encode_event("\n")) == [Event("\n")]
    assert parse_events(encode_event("")) == [Event("")]


def test_encode_field_order_event_id_retry_data():
    assert encode_event("x", event="delta", id="42", retry=3000) == (
        b"event: delta\nid: 42\nretry: 3000\ndata: x\n\n"
    )


def test_encode_value_with_leading_space_survives():
    assert parse_events(encode_event("  two spaces", event=" e")) == [
        Event("  two spaces", event=" e")
    ]


def test_encode_utf8():
    assert encode_event("héllo 🫠") == "data: héllo 🫠\n\n".encode()


def test_encode_without_data_only_sets_state():
    assert encode_event(id="5", retry=10) == b"id: 5\nretry: 10\n\n"
    parser = EventStreamParser()
    assert parser.feed(encode_event(id="5", retry=10)) == []
    assert parser.last_event_id == "5"
    assert parser.retry == 10


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\r\n"])
def test_encode_rejects_line_breaks_in_event_name(bad):
    with pytest.raises(ValueError):
        encode_event("x", event=bad)


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b"])
def test_encode_rejects_bad_id(bad):
    with pytest.raises(ValueError):
        encode_event("x", id=bad)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "10"])
def test_encode_rejects_bad_retry(bad):
    with pytest.raises(ValueError):
        encode_event("x", retry=bad)


def test_encode_comment():
    assert encode_comment("ping") == b": ping\n\n"
    assert encode_comment() == b":\n\n"
    assert encode_comment("a\nb") == b": a\n: b\n\n"


def test_comment_is_invisible_to_parser():
    parser = EventStreamParser()
    assert parser.feed(encode_comment("ping") + encode_event("x")) == [Event("x")]
    assert parser.comments == 1
    assert parser.last_comment == "ping"


def test_done_marker():
    assert DONE == "[DONE]"
    assert encode_done() == b"data: [DONE]\n\n"
    assert parse_events(encode_done()) == [Event("[DONE]")]


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_line_endings(eol):
    stream = b"event: e" + eol + b"data: a" + eol + b"data: b" + eol + eol
    assert parse_events(stream) == [Event("a\nb", event="e")]
    assert feed_bytewise(stream)[0] == [Event("a\nb", event="e")]


def test_mixed_line_endings():
    stream = b"data: a\rdata: b\r\ndata: c\n\r\ndata: d\r\rdata: e\n\n"
    expected = [Event("a\nb\nc"), Event("d"), Event("e")]
    assert parse_events(stream) == expected
    assert feed_bytewise(stream)[0] == expected


def test_cr_cr_is_two_lines():
    # The second CR is a blank line, which dispatches.
    assert parse_events(b"data: x\r\r") == [Event("x")]


def test_cr_at_chunk_end_dispatches_without_waiting():
    parser = EventStreamParser()
    assert parser.feed(b"data: x\r") == []
    # The blank line's CR arrives: the event is dispatched now, not when a
    # later byte shows that no LF follows.
    assert parser.feed(b"\r") == [Event("x")]
    assert parser.feed(b"\n") == []  # the LF of that CRLF, not another blank line
    assert parser.feed(b"data: y\n\n") == [Event("y")]


def test_chunk_boundary_inside_crlf():
    parser = EventStreamParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\ndata: b\r") == []
    assert parser.feed(b"\n\r") == [Event("a\nb")]
    assert parser.feed(b"\n") == []
    assert not parser.pending


def test_chunk_boundary_inside_multibyte_character():
    data = "data: 🫠é\n\n".encode()
    cut = data.index("🫠".encode()) + 2
    parser = EventStreamParser()
    assert parser.feed(data[:cut]) == []
    assert parser.feed(data[cut:]) == [Event("🫠é")]


def test_invalid_utf8_becomes_replacement_character():
    assert parse_events(b"data: a\xffb\n\n") == [Event("a\ufffdb")]


def test_bom_stripped_only_at_stream_start():
    bom = "\ufeff".encode()
    assert parse_events(bom + b"data: a\n\n") == [Event("a")]
    # A BOM split across chunks is still recognised.
    parser = EventStreamParser()
    assert parser.feed(bom[:1]) == []
    assert parser.feed(bom[1:] + b"data: a\n\n") == [Event("a")]
    # Only one BOM is stripped; a second one makes the line's field name
    # "\ufeffdata", an unknown field, so nothing is dispatched.
    assert parse_events(bom + bom + b"data: a\n\n") == []
    # Later, U+FEFF is ordinary data.
    assert parse_events(b"data: a\n\ndata: " + bom + b"b\n\n") == [
        Event("a"),
        Event("\ufeffb"),
    ]


def test_exactly_one_space_stripped_after_colon():
    assert parse_events(b"data:no space\n\n") == [Event("no space")]
    assert parse_events(b"data: one\n\n") == [Event("one")]
    assert parse_events(b"data:  two\n\n") == [Event(" two")]
    assert parse_events(b"data:\tx\n\n") == [Event("\tx")]


def test_value_may_contain_colons():
    assert parse_events(b'data: {"a": 1}\n\n') == [Event('{"a": 1}')]


def test_field_without_colon_has_empty_value():
    assert parse_events(b"data\n\n") == [Event("")]
    assert parse_events(b"data\ndata\n\n") == [Event("\n")]


def test_comments_ignored_and_counted():
    parser = EventStreamParser()
    events = parser.feed(b": hello\ndata: a\n:\n:keep-alive\n\n")
    assert events == [Event("a")]
    assert parser.comments == 3
    assert parser.last_comment == "keep-alive"


def test_comment_only_block_does_not_dispatch():
    parser = EventStreamParser()
    assert parser.feed(b": ping\n\n: ping\n\n") == []
    assert parser.comments == 2
    assert not parser.pending


def test_multiline_data_joined_with_lf():
    assert parse_events(b"data: a\ndata:\ndata: c\n\n") == [Event("a\n\nc")]


def test_event_type_defaults_and_resets():
    stream = b"event: delta\ndata: 1\n\ndata: 2\n\nevent:\ndata: 3\n\n"
    assert parse_events(stream) == [
        Event("1", event="delta"),
        Event("2"),
        Event("3"),
    ]


def test_id_is_sticky_and_nul_ignored():
    stream = b"id: 1\ndata: a\n\ndata: b\n\nid: 2\0x\ndata: c\n\nid\ndata: d\n\n"
    parser = EventStreamParser()
    assert parser.feed(stream) == [
        Event("a", id="1"),
        Event("b", id="1"),
        Event("c", id="1"),  # the id with NUL was ignored
        Event("d", id=""),  # an empty id resets it
    ]
    assert parser.last_event_id == ""


def test_retry_only_ascii_digits():
    parser = EventStreamParser()
    assert parser.feed(b"retry: 1500\ndata: a\n\n") == [Event("a", retry=1500)]
    assert parser.retry == 1500
    for bad in [b"retry: 1e3", b"retry: -5", b"retry:  5", b"retry: 5s", b"retry:", b"retry: \xd9\xa3"]:
        assert parser.feed(bad + b"\ndata: b\n\n") == [Event("b", retry=None)]
        assert parser.retry == 1500


def test_unknown_fields_ignored():
    assert parse_events(b"foo: bar\ndata: a\nDATA: b\n\n") == [Event("a")]


def test_empty_data_does_not_dispatch_and_resets_event_type():
    parser = EventStreamParser()
    assert parser.feed(b"event: lost\n\ndata: a\n\n") == [Event("a")]


def test_incomplete_event_at_eof_discarded_but_pending():
    parser = EventStreamParser()
    assert parser.feed(b"data: a\n\ndata: b\n") == [Event("a")]
    assert parser.pending
    assert parser.close() == []
    assert parser.pending


def test_unterminated_line_at_eof_is_pending():
    parser = EventStreamParser()
    assert parser.feed(b"data: a\n\ndata: partial") == [Event("a")]
    assert parser.close() == []
    assert parser.pending


def test_clean_eof_not_pending():
    parser = EventStreamParser()
    parser.feed(b"data: a\n\n: ping\n")
    assert parser.close() == []
    assert not parser.pending


def test_truncated_multibyte_character_at_eof_is_pending():
    parser = EventStreamParser()
    parser.feed(b"data: a\n\n" + "é".encode()[:1])
    parser.close()
    assert parser.pending


def test_retry_too_large_for_64_bits_is_ignored_not_a_value_error():
    # Found by the fuzzer: int() refuses over 4300 digits with a ValueError,
    # which escaped feed(). Browsers ignore a retry that overflows 64 bits.
    parser = EventStreamParser()
    assert parser.feed(b"retry: 7\n\n") == []
    for huge in (b"9" * 5000, b"18446744073709551616"):
        assert parser.feed(b"retry: " + huge + b"\ndata: a\n\n") == [Event("a", retry=None)]
        assert parser.retry == 7
    assert parser.feed(b"retry: 18446744073709551615\n\n") == []
    assert parser.retry == 2**64 - 1
    assert parser.feed(b"retry: " + b"0" * 5000 + b"42\n\n") == []
    assert parser.retry == 42


def test_feed_after_close_raises():
    parser = EventStreamParser()
    parser.close()
    with pytest.raises(RuntimeError):
        parser.feed(b"data: a\n\n")


def test_event_is_frozen():
    with pytest.raises(AttributeError):
        Event("a").data = "b"  # type: ignore[misc]


# --------------------------------------------------------------------------
# The line-length limit
# --------------------------------------------------------------------------


def test_max_line_default():
    assert MAX_LINE == 1 << 20
    assert EventStreamParser().max_line == MAX_LINE
    assert EventStreamParser(max_line=10).max_line == 10


def test_line_over_the_limit_arriving_whole_is_refused():
    with pytest.raises(ProtocolError):
        EventStreamParser(max_line=10).feed(b"data: 12345\n\n")  # 11 characters
    assert EventStreamParser(max_line=10).feed(b"data: 1234\n\n") == [Event("1234")]


def test_endless_line_is_refused_once_it_passes_the_limit():
    parser = EventStreamParser(max_line=100)
    assert parser.feed(b"data: ") == []
    for _ in range(94):
        assert parser.feed(b"x") == []  # 100 characters buffered: still fine
    with pytest.raises(ProtocolError):
        parser.feed(b"x")


def test_default_limit_stops_a_peer_that_never_sends_a_newline():
    parser = EventStreamParser()
    chunk = b"x" * 65536
    with pytest.raises(ProtocolError):
        for _ in range(MAX_LINE // len(chunk) + 1):
            assert parser.feed(chunk) == []
    assert parser._line_length <= MAX_LINE


def test_limit_applies_to_comments_and_counts_characters():
    with pytest.raises(ProtocolError):
        EventStreamParser(max_line=8).feed(b": keep-alive\n")
    # Characters after UTF-8 decoding, not bytes: 7 characters, 11 bytes.
    assert EventStreamParser(max_line=7).feed("data:🫠é\n\n".encode()) == [Event("🫠é")]
    # The line ending is not counted, whichever it is.
    for eol in (b"\n", b"\r", b"\r\n"):
        assert EventStreamParser(max_line=7).feed(b"data:ab" + eol + eol) == [Event("ab")]


def test_many_short_lines_are_never_refused():
    stream = b"".join(b"data: %d\n" % i for i in range(1000)) + b"\n"
    events = EventStreamParser(max_line=10).feed(stream)
    assert events == [Event("\n".join(str(i) for i in range(1000)))]


def test_parser_stays_failed_after_protocol_error():
    parser = EventStreamParser(max_line=4)
    with pytest.raises(ProtocolError) as first:
        parser.feed(b"data: too long")
    with pytest.raises(ProtocolError) as again:
        parser.feed(b"\n\ndata: a\n\n")
    assert again.value is first.value


# --------------------------------------------------------------------------
# Property: encode, split anywhere, parse -> the same events
# --------------------------------------------------------------------------

# Text built from pieces, so that CRLF pairs and the awkward characters show
# up often, next to anything else UTF-8 can carry (surrogates excluded).
_text = st.lists(
    st.one_of(
        st.text(max_size=4),
        st.sampled_from(["\n", "\r", "\r\n", " ", ":", "🫠", "é", "\ufeff", "\u2028"]),
    ),
    max_size=10,
).map("".join)
_single_line = _text.map(lambda s: re.sub(r"[\r\n]", "", s))
_event_spec = st.fixed_dictionaries(
    {"data": _text},
    optional={
        "event": _single_line,
        "id": _single_line.map(lambda s: s.replace("\0", "")),
        "retry": st.integers(min_value=0, max_value=10**6),
    },
)


@settings(max_examples=200, deadline=None)
@given(
    specs=st.lists(_event_spec, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
    comments=st.lists(_text, max_size=2),
)
def test_roundtrip_with_random_splits(specs, cuts, comments):
    stream = b"".join(encode_comment(c) for c in comments)
    stream += b"".join(encode_event(**spec) for spec in specs)

    expected = []
    last_id = ""
    for spec in specs:
        if "id" in spec:
            last_id = spec["id"]
        expected.append(
            Event(
                data=re.sub(r"\r\n|\r", "\n", spec["data"]),
                event=spec.get("event") or "message",
                id=last_id,
                retry=spec.get("retry"),
            )
        )

    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    parser = EventStreamParser()
    events = []
    for start, end in zip(points, points[1:]):
        events += parser.feed(stream[start:end])
    events += parser.close()
    assert events == expected
    assert not parser.pending
    assert parser.comments == sum(len(re.split(r"\r\n|\r|\n", c)) for c in comments)
