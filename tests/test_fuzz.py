"""Bounded fuzzing of the sans-IO parsers: HTTP request heads, chunked bodies,
SSE streams, WebSocket frames.

Each parser is fed random bytes and *mutated valid inputs* (a valid request
head, event stream or sequence of client frames with bytes flipped, inserted,
deleted, duplicated, truncated or replaced by the characters parsers trip
on), whole and split at random points. Two properties:

- nothing but the module's own protocol error escapes (``HTTPError``,
  ``sse.ProtocolError``, ``websocket.ProtocolError``): no IndexError,
  ValueError, UnicodeDecodeError, RecursionError, ...;
- the outcome does not depend on how the bytes were split: the same request,
  events or frames, or the same refusal (status / close code), whether the
  input came in one piece, in random pieces or one byte at a time.

Every test is bounded by ``FUZZ`` (150 examples each, no deadline) so the
whole file runs in a few seconds; raise ``max_examples`` there for a longer
hunt. Regressions the fuzzing found have plain tests of their own in
test_http.py, test_sse.py and test_websocket.py.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlab.protocol import sse
from streamlab.protocol.http_body import LAST_CHUNK, ChunkedDecoder, encode_chunk
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import RequestHeadParser, ResponseHeadParser
from streamlab.protocol.websocket import Connection
from streamlab.protocol.websocket_frames import FrameDecoder, Opcode, ProtocolError, encode_frame

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------
# Shared: mutations and splits
# --------------------------------------------------------------------------

# Bytes that parsers of text protocols get wrong: line endings, NUL, the
# separators, DEL, stray UTF-8 lead/continuation bytes, a BOM.
_SPECIAL = [
    b"\r", b"\n", b"\r\n", b"\n\n", b"\r\n\r\n", b"\0", b" ", b"\t", b":", b";", b"\x7f",
    b"\xff", b"\xc3", b"\x80", b"\xef\xbb\xbf", b"\xed\xa0\x80", b"\x0b", b"\x0c",
]
_OPS = ["flip", "insert", "special", "delete", "truncate", "duplicate", "long_number", "long_number",
        "long_run"]


@st.composite
def mutated(draw, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid input damaged by one to four random edits."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(_OPS))
        pos = draw(st.integers(0, len(data)))
        digits = [i for i, byte in enumerate(data) if 0x30 <= byte <= 0x39]
        if op == "long_number" and digits:
            # Lengths, sizes, retry delays, versions, status codes: made
            # huge (past the 4300 digits int() refuses to convert).
            pos = draw(st.sampled_from(digits))
            data[pos:pos] = draw(st.sampled_from([b"9" * 5000, b"9" * 20, b"0" * 30]))
        elif op == "long_run":
            # One line grown past the limits the parsers keep.
            data[pos:pos] = bytes([draw(st.sampled_from(b"a: 9\x80"))]) * draw(st.integers(20, 600))
        elif op == "flip" and data:
            pos = min(pos, len(data) - 1)
            data[pos] ^= draw(st.integers(1, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "special":
            data[pos:pos] = draw(st.sampled_from(_SPECIAL))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[pos:]
        elif op == "duplicate":
            size = draw(st.integers(1, 16))
            data[pos:pos] = data[pos : pos + size]
    return bytes(data)


_cuts = st.lists(st.integers(min_value=0, max_value=4096), max_size=8)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given points (empty pieces included: they must be harmless)."""
    points = sorted(min(c, len(data)) for c in cuts)
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def one_byte_at_a_time(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# --------------------------------------------------------------------------
# HTTP request heads
# --------------------------------------------------------------------------

_TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_VCHAR = "".join(chr(c) for c in range(0x21, 0x7F))
_OBS_TEXT = "".join(chr(c) for c in range(0x80, 0x100))
_FRAMING = {"host", "content-length", "transfer-encoding"}

_token = st.text(alphabet=_TCHAR, min_size=1, max_size=12)
_field_value = st.text(alphabet=_VCHAR + _OBS_TEXT + " \t", max_size=24).map(
    lambda s: s.strip(" \t")
)
_header = st.tuples(_token.filter(lambda n: n.lower() not in _FRAMING), _field_value)
_host = st.one_of(
    st.sampled_from(["127.0.0.1:8000", "localhost", "[::1]:80", "example.test", ""]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.-", max_size=20),
)


@st.composite
def valid_request_head(draw) -> bytes:
    """A request head this server accepts, with every line ending it allows, then a body."""
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0"]))
    method = draw(st.one_of(st.sampled_from(["GET", "POST", "PUT", "DELETE"]), _token))
    target = "/" + draw(st.text(alphabet=_VCHAR, max_size=30))
    headers = draw(st.lists(_header, max_size=6))
    if version == "HTTP/1.1" or draw(st.booleans()):
        headers.insert(draw(st.integers(0, len(headers))), ("Host", draw(_host)))
    # HTTP/1.0 has no chunked coding: a Transfer-Encoding there is refused (RFC 9112 section 6.1).
    framing = draw(st.sampled_from(["none", "length", "chunked"] if version == "HTTP/1.1" else ["none", "length"]))
    if framing == "length":
        headers.append(("Content-Length", str(draw(st.integers(0, 10**6)))))
    elif framing == "chunked":
        headers.append(("Transfer-Encoding", draw(st.sampled_from(["chunked", "Chunked"]))))
    eol = st.sampled_from(["\r\n", "\n"])
    lines = [f"{method} {target} {version}"] + [
        f"{name}:{draw(st.sampled_from(['', ' ', '  ', chr(9)]))}{value}" for name, value in headers
    ]
    head = "".join(draw(st.lists(eol, max_size=2)))  # empty lines before the request line
    head += "".join(line + draw(eol) for line in lines) + draw(eol)
    return head.encode("latin-1") + draw(st.binary(max_size=20))


# A few hand-written seeds the mutations start from, so the interesting
# corners (a 0.9 request line, an empty line first, obs-fold) are always near.
_SEEDS = [
    b"GET /\r\n\r\n",
    b"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
]


def request_outcome(chunks: list[bytes], **limits) -> tuple:
    """What a RequestHeadParser makes of the pieces: the request and the rest, or the refusal."""
    parser = RequestHeadParser(**limits)
    try:
        for index, chunk in enumerate(chunks):
            request = parser.feed(chunk)
            if request is not None:
                return ("request", request, parser.rest + b"".join(chunks[index + 1 :]))
    except HTTPError as err:
        return ("refused", err.status, err.message)
    return ("incomplete",)


_limits = st.fixed_dictionaries(
    {},
    optional={"max_head": st.integers(16, 400), "max_headers": st.integers(0, 8)},
)


@FUZZ
@given(data=valid_request_head(), cuts=_cuts)
def test_request_head_valid_any_split(data, cuts):
    whole = request_outcome([data])
    assert whole[0] == "request", whole
    assert request_outcome(pieces(data, cuts)) == whole
    assert request_outcome(one_byte_at_a_time(data)) == whole


@FUZZ
@given(data=st.one_of(mutated(valid_request_head()), st.binary(max_size=300)), cuts=_cuts,
       limits=_limits)
def test_request_head_mutated_only_http_error(data, cuts, limits):
    whole = request_outcome([data], **limits)
    assert request_outcome(pieces(data, cuts), **limits) == whole
    assert request_outcome(one_byte_at_a_time(data), **limits) == whole
    if whole[0] == "refused":
        assert 400 <= whole[1] <= 599


# The only refusals that may wait for the empty line ending the head: they
# are about what is *missing* (a Host) or about the head as a whole (framing).
_NEEDS_WHOLE_HEAD = ("needs a Host header", "Transfer-Encoding", "Content-Length")


@FUZZ
@given(data=st.one_of(mutated(valid_request_head()), mutated(st.sampled_from(_SEEDS))))
def test_request_head_refused_as_soon_as_the_line_is_complete(data):
    """Fed byte by byte, a bad line is refused on the byte that completes it
    (or passes max_head), never later at the end of the head."""
    parser = RequestHeadParser(max_head=1024)
    for end in range(1, len(data) + 1):
        try:
            if parser.feed(data[end - 1 : end]) is not None:
                return  # accepted
        except HTTPError as err:
            error = err
            break
    else:
        return  # still incomplete
    fed = data[:end]
    if error.status == 431:
        assert end > 1024 or fed.endswith(b"\n")  # past the limit, or one header too many
        return
    assert fed.endswith(b"\n"), (fed, error)
    if fed.endswith((b"\n\n", b"\n\r\n")):  # the empty line that ends the head
        assert any(text in error.message for text in _NEEDS_WHOLE_HEAD), (fed, error)


@FUZZ
@given(data=mutated(st.sampled_from(_SEEDS)), cuts=_cuts)
def test_request_head_mutated_seeds(data, cuts):
    whole = request_outcome([data])
    assert request_outcome(pieces(data, cuts)) == whole


# --------------------------------------------------------------------------
# HTTP response heads and chunked bodies (the client's and proxy's side)
# --------------------------------------------------------------------------


@st.composite
def valid_response_head(draw) -> bytes:
    status = draw(st.integers(100, 999))
    reason = draw(st.text(alphabet=_VCHAR + " ", max_size=12))
    headers = draw(st.lists(_header, max_size=5))
    lines = [f"HTTP/1.{draw(st.integers(0, 1))} {status} {reason}".rstrip()]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + draw(st.binary(max_size=10))


def response_outcome(chunks: list[bytes]) -> tuple:
    parser = ResponseHeadParser()
    try:
        for index, chunk in enumerate(chunks):
            response = parser.feed(chunk)
            if response is not None:
                return ("response", response, parser.rest + b"".join(chunks[index + 1 :]))
    except HTTPError as err:
        return ("refused", err.status)
    return ("incomplete",)


@FUZZ
@given(data=st.one_of(valid_response_head(), mutated(valid_response_head())), cuts=_cuts)
def test_response_head_only_http_error(data, cuts):
    assert response_outcome(pieces(data, cuts)) == response_outcome([data])


@st.composite
def valid_chunked_body(draw) -> bytes:
    body = b""
    for chunk in draw(st.lists(st.binary(min_size=1, max_size=40), max_size=5)):
        ext = draw(st.sampled_from([b"", b";a=b", b" ;x", b';name="v"']))
        size = draw(st.sampled_from(["%x", "%X", "%04x"])) % len(chunk)
        body += size.encode() + ext + b"\r\n" + chunk + b"\r\n"
    trailers = draw(st.lists(_header, max_size=2))
    body += b"0\r\n" + b"".join(f"{n}: {v}\r\n".encode("latin-1") for n, v in trailers) + b"\r\n"
    return body + draw(st.binary(max_size=10))


def chunked_outcome(chunks: list[bytes], **limits) -> tuple:
    decoder = ChunkedDecoder(**limits)
    body = b""
    try:
        for chunk in chunks:
            body += b"".join(decoder.feed(chunk))
    except HTTPError as err:
        return ("refused", err.status)
    return ("ok", body, decoder.done, decoder.rest, decoder.trailers)


@FUZZ
@given(data=st.one_of(valid_chunked_body(), mutated(valid_chunked_body()), st.binary(max_size=200)),
       cuts=_cuts, max_line=st.sampled_from([4096, 8, 16]))
def test_chunked_body_only_http_error_and_split_independent(data, cuts, max_line):
    whole = chunked_outcome([data], max_line=max_line)
    assert chunked_outcome(pieces(data, cuts), max_line=max_line) == whole
    assert chunked_outcome(one_byte_at_a_time(data), max_line=max_line) == whole


@FUZZ
@given(chunks=st.lists(st.binary(min_size=1, max_size=60), max_size=6), cuts=_cuts)
def test_chunked_body_roundtrip(chunks, cuts):
    data = b"".join(encode_chunk(c) for c in chunks) + LAST_CHUNK + b"next"
    outcome = chunked_outcome(pieces(data, cuts))
    assert outcome == ("ok", b"".join(chunks), True, b"next", [])


# --------------------------------------------------------------------------
# Server-Sent Events
# --------------------------------------------------------------------------

_sse_text = st.lists(
    st.one_of(st.text(max_size=6), st.sampled_from([" ", ":", "🫠", "é", "\ufeff", "\u2028", "\0"])),
    max_size=6,
).map(lambda parts: "".join(parts).replace("\r", "").replace("\n", ""))
_sse_line = st.one_of(
    st.tuples(st.sampled_from(["data", "event", "id", "retry", "other", ""]),
              st.sampled_from([":", ": ", ""]), _sse_text).map("".join),
    st.integers(0, 10**12).map(lambda n: f"retry: {n}"),
    _sse_text.map(lambda s: ":" + s),  # comment
    st.just(""),  # blank line: dispatch
)


@st.composite
def valid_event_stream(draw) -> bytes:
    """An event stream of any shape, with all three line endings mixed."""
    out = "\ufeff" if draw(st.booleans()) else ""
    previous_eol = ""
    for line in draw(st.lists(_sse_line, max_size=12)):
        eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
        if line == "" and previous_eol == "\r" and eol == "\n":
            eol = "\r"  # CR then an empty LF-ended line would *be* one CRLF
        out += line + eol
        previous_eol = eol
    return out.encode("utf-8")


def sse_outcome(chunks: list[bytes], **options) -> tuple:
    parser = sse.EventStreamParser(**options)
    events = []
    try:
        for chunk in chunks:
            events += parser.feed(chunk)
        events += parser.close()
    except sse.ProtocolError:
        return ("refused",)
    return ("ok", events, parser.pending, parser.last_event_id, parser.retry,
            parser.comments, parser.last_comment)


@FUZZ
@given(data=valid_event_stream(), cuts=_cuts)
def test_event_stream_valid_any_split(data, cuts):
    whole = sse_outcome([data])
    assert whole[0] == "ok"
    assert sse_outcome(pieces(data, cuts)) == whole
    assert sse_outcome(one_byte_at_a_time(data)) == whole


@FUZZ
@given(data=st.one_of(mutated(valid_event_stream()), st.binary(max_size=300)), cuts=_cuts,
       max_line=st.sampled_from([sse.MAX_LINE, 4, 16, 64]))
def test_event_stream_mutated_only_protocol_error(data, cuts, max_line):
    whole = sse_outcome([data], max_line=max_line)
    assert sse_outcome(pieces(data, cuts), max_line=max_line) == whole
    assert sse_outcome(one_byte_at_a_time(data), max_line=max_line) == whole


# --------------------------------------------------------------------------
# WebSocket frames and connections
# --------------------------------------------------------------------------


@st.composite
def valid_frames(draw, masked: bool = True) -> bytes:
    """What a client may send: fragmented text/binary messages (text cut
    mid-character), pings and pongs between fragments, maybe a CLOSE at the end."""
    # Masking keys drawn here rather than from os.urandom (mask=True), so
    # that hypothesis can replay and shrink an example byte for byte.
    key = st.binary(min_size=4, max_size=4) if masked else st.just(False)
    wire = b""
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            opcode, payload = Opcode.TEXT, draw(st.text(max_size=40)).encode("utf-8")
        else:
            opcode, payload = Opcode.BINARY, draw(st.binary(max_size=40))
        size = draw(st.integers(1, 16))
        fragments = [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
        for index, fragment in enumerate(fragments):
            last = index == len(fragments) - 1
            wire += encode_frame(opcode if index == 0 else Opcode.CONTINUATION, fragment,
                                 fin=last, mask=draw(key))
            if draw(st.booleans()):
                control = draw(st.sampled_from([Opcode.PING, Opcode.PONG]))
                wire += encode_frame(control, draw(st.binary(max_size=10)), mask=draw(key))
    if draw(st.booleans()):
        close = draw(st.sampled_from([b"", b"\x03\xe8", b"\x03\xe9bye", b"\x0f\xa0app"]))
        wire += encode_frame(Opcode.CLOSE, close, mask=draw(key))
    return wire


def ws_outcome(chunks: list[bytes], *, client: bool = False, max_message: int = 1 << 20) -> tuple:
    connection = Connection(client=client, max_message=max_message)
    events = []
    try:
        for chunk in chunks:
            events += connection.receive(chunk)
    except ProtocolError as err:
        return ("refused", err.code, err.reason)
    return ("ok", events, connection.close_received)


@FUZZ
@given(data=valid_frames(), cuts=_cuts)
def test_websocket_valid_any_split(data, cuts):
    whole = ws_outcome([data])
    assert whole[0] == "ok"
    assert ws_outcome(pieces(data, cuts)) == whole
    assert ws_outcome(one_byte_at_a_time(data)) == whole


@FUZZ
@given(data=st.one_of(mutated(valid_frames()), st.binary(max_size=200)), cuts=_cuts,
       max_message=st.sampled_from([1 << 20, 8, 64]))
def test_websocket_server_mutated_only_protocol_error(data, cuts, max_message):
    whole = ws_outcome([data], max_message=max_message)
    assert ws_outcome(pieces(data, cuts), max_message=max_message) == whole
    assert ws_outcome(one_byte_at_a_time(data), max_message=max_message) == whole
    if whole[0] == "refused":
        assert whole[1] in (1002, 1007, 1009)


@FUZZ
@given(data=st.one_of(mutated(valid_frames(masked=False)), st.binary(max_size=200)), cuts=_cuts)
def test_websocket_client_mutated_only_protocol_error(data, cuts):
    whole = ws_outcome([data], client=True)
    assert ws_outcome(pieces(data, cuts), client=True) == whole


@FUZZ
@given(data=st.one_of(mutated(valid_frames()), st.binary(max_size=200)), cuts=_cuts)
def test_frame_decoder_only_protocol_error(data, cuts):
    def frames(chunks):
        decoder = FrameDecoder(expect_masked=True, max_frame=128)
        out = []
        try:
            for chunk in chunks:
                out += decoder.feed(chunk)
        except ProtocolError as err:
            return ("refused", err.code, err.reason)
        return ("ok", out)

    assert frames(pieces(data, cuts)) == frames([data])
