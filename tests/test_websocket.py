"""Tests for streamlab.protocol.websocket: RFC 6455 frames, messages, close codes, handshake."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlab.protocol.websocket_handshake import (
    GUID,
    HandshakeError,
    accept_key,
    check_server_response,
    client_handshake,
    new_key,
    server_handshake_response,
    validate_upgrade_request,
)
from streamlab.protocol.websocket import BinaryMessage, CloseReceived, Connection, Ping, Pong, TextMessage
from streamlab.protocol.websocket_frames import (
    CloseCode,
    Frame,
    FrameDecoder,
    Opcode,
    ProtocolError,
    apply_mask,
    encode_close_payload,
    encode_frame,
    parse_close_payload,
)

RFC_KEY = "dGhlIHNhbXBsZSBub25jZQ=="
RFC_ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
RFC_MASK = bytes.fromhex("37fa213d")


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def decode_all(data: bytes, *, expect_masked: bool, **kwargs) -> list[Frame]:
    return FrameDecoder(expect_masked=expect_masked, **kwargs).feed(data)


def expect_error(code: int, data: bytes, *, expect_masked: bool, **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_all(data, expect_masked=expect_masked, **kwargs)
    assert info.value.code == code
    return info.value


# --------------------------------------------------------------------------
# Keys and handshake
# --------------------------------------------------------------------------


def test_rfc_sample_accept_key():
    assert GUID == "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
    assert accept_key(RFC_KEY) == RFC_ACCEPT


def test_new_key_is_16_random_bytes():
    key = new_key()
    assert len(base64.b64decode(key, validate=True)) == 16
    assert new_key() != key


def upgrade_headers(**overrides: str | None) -> dict[str, str]:
    headers = {
        "host": "127.0.0.1:8000",
        "upgrade": "websocket",
        "connection": "Upgrade",
        "sec-websocket-key": RFC_KEY,
        "sec-websocket-version": "13",
    }
    for name, value in overrides.items():
        name = name.replace("_", "-")
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    return headers


def test_validate_upgrade_request_ok():
    assert validate_upgrade_request("GET", upgrade_headers()) == RFC_KEY
    # Browsers send a token list; case does not matter.
    headers = upgrade_headers(connection="keep-alive, Upgrade", upgrade="WebSocket")
    assert validate_upgrade_request("GET", headers) == RFC_KEY


@pytest.mark.parametrize(
    "method, overrides, status",
    [
        ("POST", {}, 405),
        ("GET", {"host": None}, 400),
        ("GET", {"upgrade": None}, 400),
        ("GET", {"upgrade": "h2c"}, 400),
        ("GET", {"connection": "keep-alive"}, 400),
        ("GET", {"sec_websocket_version": None}, 426),
        ("GET", {"sec_websocket_version": "8"}, 426),
        ("GET", {"sec_websocket_key": None}, 400),
        ("GET", {"sec_websocket_key": "not base64!"}, 400),
        ("GET", {"sec_websocket_key": base64.b64encode(b"x" * 15).decode()}, 400),
        ("GET", {"sec_websocket_key": base64.b64encode(b"x" * 17).decode()}, 400),
    ],
)
def test_validate_upgrade_request_refusals(method, overrides, status):
    with pytest.raises(HandshakeError) as info:
        validate_upgrade_request(method, upgrade_headers(**overrides))
    assert info.value.status == status
    assert info.value.message


def test_426_names_the_supported_version():
    with pytest.raises(HandshakeError) as info:
        validate_upgrade_request("GET", upgrade_headers(sec_websocket_version="8"))
    assert ("Sec-WebSocket-Version", "13") in info.value.headers


def test_405_says_allow_get():
    with pytest.raises(HandshakeError) as info:
        validate_upgrade_request("PUT", upgrade_headers())
    assert ("Allow", "GET") in info.value.headers


def test_client_handshake_bytes():
    request = client_handshake("example.com:80", "/chat?x=1", RFC_KEY, origin="http://example.com")
    assert request.startswith(b"GET /chat?x=1 HTTP/1.1\r\n")
    assert request.endswith(b"\r\n\r\n")
    lines = request.decode().split("\r\n")
    assert "Host: example.com:80" in lines
    assert "Upgrade: websocket" in lines
    assert "Connection: Upgrade" in lines
    assert f"Sec-WebSocket-Key: {RFC_KEY}" in lines
    assert "Sec-WebSocket-Version: 13" in lines
    assert "Origin: http://example.com" in lines


def test_client_handshake_extra_headers_and_injection():
    request = client_handshake("h", "/", RFC_KEY, extra_headers=[("X-Test", "1")])
    assert b"\r\nX-Test: 1\r\n" in request
    assert b"Origin" not in request
    with pytest.raises(ValueError):
        client_handshake("h", "/", RFC_KEY, extra_headers=[("X-Test", "1\r\nEvil: 1")])
    with pytest.raises(ValueError):
        client_handshake("h\r\nEvil: 1", "/", RFC_KEY)
    with pytest.raises(ValueError):
        client_handshake("h", "/a b", RFC_KEY)


def test_client_request_passes_server_validation():
    key = new_key()
    raw = client_handshake("localhost", "/ws", key)
    head_lines = raw.decode().split("\r\n")[1:-2]
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in head_lines)}
    assert validate_upgrade_request("GET", headers) == key


def test_server_handshake_response():
    response = server_handshake_response(RFC_KEY, [("X-Server", "streamlab")])
    assert response.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert f"Sec-WebSocket-Accept: {RFC_ACCEPT}\r\n".encode() in response
    assert b"Upgrade: websocket\r\n" in response
    assert b"Connection: Upgrade\r\n" in response
    assert b"X-Server: streamlab\r\n" in response
    assert response.endswith(b"\r\n\r\n")


def good_response_headers() -> dict[str, str]:
    return {"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-accept": RFC_ACCEPT}


def test_check_server_response_ok():
    check_server_response(101, good_response_headers(), RFC_KEY)


@pytest.mark.parametrize(
    "status, change",
    [
        (200, {}),
        (101, {"upgrade": "h2c"}),
        (101, {"connection": "close"}),
        (101, {"sec-websocket-accept": accept_key(new_key())}),
        (101, {"sec-websocket-extensions": "permessage-deflate"}),
    ],
)
def test_check_server_response_failures(status, change):
    headers = {**good_response_headers(), **change}
    with pytest.raises(ProtocolError):
        check_server_response(status, headers, RFC_KEY)


# --------------------------------------------------------------------------
# Frames: the examples of RFC 6455 section 5.7
# --------------------------------------------------------------------------


def test_rfc_single_frame_unmasked_text():
    data = h("81 05 48 65 6c 6c 6f")
    assert encode_frame(Opcode.TEXT, b"Hello") == data
    assert decode_all(data, expect_masked=False) == [Frame(Opcode.TEXT, b"Hello")]


def test_rfc_single_frame_masked_text():
    data = h("81 85 37 fa 21 3d 7f 9f 4d 51 58")
    assert encode_frame(Opcode.TEXT, b"Hello", mask=RFC_MASK) == data
    assert decode_all(data, expect_masked=True) == [Frame(Opcode.TEXT, b"Hello")]


def test_rfc_fragmented_unmasked_text():
    first, second = h("01 03 48 65 6c"), h("80 02 6c 6f")
    assert encode_frame(Opcode.TEXT, b"Hel", fin=False) == first
    assert encode_frame(Opcode.CONTINUATION, b"lo") == second
    assert decode_all(first + second, expect_masked=False) == [
        Frame(Opcode.TEXT, b"Hel", fin=False),
        Frame(Opcode.CONTINUATION, b"lo", fin=True),
    ]
    conn = Connection(client=True)
    assert conn.receive(first) == []
    assert conn.receive(second) == [TextMessage("Hello")]


def test_rfc_ping_and_masked_pong():
    ping = h("89 05 48 65 6c 6c 6f")
    pong = h("8a 85 37 fa 21 3d 7f 9f 4d 51 58")
    assert encode_frame(Opcode.PING, b"Hello") == ping
    assert encode_frame(Opcode.PONG, b"Hello", mask=RFC_MASK) == pong
    assert Connection(client=True).receive(ping) == [Ping(b"Hello")]
    assert Connection(client=False).receive(pong) == [Pong(b"Hello")]


def test_rfc_256_byte_binary():
    payload = bytes(range(256))
    data = encode_frame(Opcode.BINARY, payload)
    assert data[:4] == h("82 7E 01 00")
    assert len(data) == 4 + 256
    assert decode_all(data, expect_masked=False) == [Frame(Opcode.BINARY, payload)]


def test_rfc_64k_binary():
    payload = b"\xab" * 65536
    data = encode_frame(Opcode.BINARY, payload)
    assert data[:10] == h("82 7F 00 00 00 00 00 01 00 00")
    assert decode_all(data, expect_masked=False) == [Frame(Opcode.BINARY, payload)]


@pytest.mark.parametrize(
    "length, header_size, marker",
    [(0, 2, 0), (125, 2, 125), (126, 4, 126), (65535, 4, 126), (65536, 10, 127)],
)
@pytest.mark.parametrize("masked", [False, True])
def test_length_encoding_boundaries(length, header_size, marker, masked):
    payload = bytes([length % 251]) * length
    data = encode_frame(Opcode.BINARY, payload, mask=masked)
    assert data[1] & 0x7F == marker
    assert len(data) == header_size + (4 if masked else 0) + length
    assert decode_all(data, expect_masked=masked) == [Frame(Opcode.BINARY, payload)]


def test_random_mask_differs_and_unmasks():
    a = encode_frame(Opcode.TEXT, b"same payload", mask=True)
    b = encode_frame(Opcode.TEXT, b"same payload", mask=True)
    assert a != b  # a fresh key each time (1 in 2**32 chance of a false failure)
    assert decode_all(a + b, expect_masked=True) == [Frame(Opcode.TEXT, b"same payload")] * 2


def test_apply_mask_is_its_own_inverse():
    data = bytes(range(200))
    assert apply_mask(apply_mask(data, RFC_MASK), RFC_MASK) == data
    assert apply_mask(b"Hello", RFC_MASK) == h("7f 9f 4d 51 58")
    assert apply_mask(b"", RFC_MASK) == b""


def test_encode_frame_refusals():
    with pytest.raises(ValueError):
        encode_frame(Opcode.PING, b"x" * 126)
    with pytest.raises(ValueError):
        encode_frame(Opcode.CLOSE, b"", fin=False)
    with pytest.raises(ValueError):
        encode_frame(Opcode.TEXT, b"x", mask=b"abc")
    with pytest.raises(ValueError):
        encode_frame(3, b"x")
    assert len(encode_frame(Opcode.PING, b"x" * 125)) == 127


def test_decoder_byte_by_byte():
    data = encode_frame(Opcode.TEXT, b"Hello", mask=RFC_MASK) + encode_frame(
        Opcode.BINARY, b"z" * 300, mask=RFC_MASK
    )
    decoder = FrameDecoder(expect_masked=True)
    frames = []
    for i in range(len(data)):
        frames += decoder.feed(data[i : i + 1])
    assert frames == [Frame(Opcode.TEXT, b"Hello"), Frame(Opcode.BINARY, b"z" * 300)]


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(
        st.one_of(
            st.tuples(st.sampled_from([Opcode.TEXT, Opcode.BINARY, Opcode.CONTINUATION]),
                      st.binary(max_size=300), st.booleans()),
            st.tuples(st.sampled_from([Opcode.PING, Opcode.PONG, Opcode.CLOSE]),
                      st.binary(max_size=125), st.just(True)),
            # Around the 16/64-bit length boundary; generating 64 KiB of
            # random bytes would only make the test slow.
            st.tuples(st.just(Opcode.BINARY),
                      st.integers(65530, 65540).map(lambda n: bytes([n % 256]) * n),
                      st.just(True)),
        ),
        max_size=6,
    ),
    masked=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=70000), max_size=10),
)
def test_frame_roundtrip_with_random_splits(frames, masked, cuts):
    stream = b"".join(encode_frame(op, p, fin=fin, mask=masked) for op, p, fin in frames)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder(expect_masked=masked)
    decoded = []
    for start, end in zip(points, points[1:]):
        decoded += decoder.feed(stream[start:end])
    assert decoded == [Frame(Opcode(op), p, fin) for op, p, fin in frames]


# --------------------------------------------------------------------------
# Frames: every protocol error
# --------------------------------------------------------------------------


@pytest.mark.parametrize("first_byte", [0xC1, 0xA1, 0x91, 0xF1])
def test_rsv_bits_are_1002(first_byte):
    expect_error(1002, bytes([first_byte, 0x00]), expect_masked=False)


@pytest.mark.parametrize("opcode", [3, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF])
def test_unknown_opcodes_are_1002(opcode):
    expect_error(1002, bytes([0x80 | opcode, 0x00]), expect_masked=False)


def test_control_frame_too_long_is_1002():
    # 126 bytes announced with the 16-bit form: refused after two bytes.
    expect_error(1002, h("89 7E"), expect_masked=False)
    expect_error(1002, h("88 7F"), expect_masked=False)


@pytest.mark.parametrize("opcode", [Opcode.CLOSE, Opcode.PING, Opcode.PONG])
def test_fragmented_control_frame_is_1002(opcode):
    expect_error(1002, bytes([opcode, 0x00]), expect_masked=False)


def test_server_refuses_unmasked_client_frame():
    error = expect_error(1002, encode_frame(Opcode.TEXT, b"hi"), expect_masked=True)
    assert "masked" in error.reason


def test_client_refuses_masked_server_frame():
    expect_error(1002, encode_frame(Opcode.TEXT, b"hi", mask=True), expect_masked=False)


def test_64bit_length_with_msb_set_is_1002():
    expect_error(1002, h("82 7F 80 00 00 00 00 00 00 01"), expect_masked=False)


def test_frame_over_max_is_1009_before_payload():
    # Only the header arrives: the error comes before any payload is buffered.
    expect_error(1009, h("82 7E 01 00"), expect_masked=False, max_frame=255)
    expect_error(1009, h("82 7F 00 00 00 02 00 00 00 00"), expect_masked=False)
    # Exactly max_frame is fine.
    assert decode_all(encode_frame(Opcode.BINARY, b"x" * 255), expect_masked=False,
                      max_frame=255) == [Frame(Opcode.BINARY, b"x" * 255)]


def test_errors_raised_as_soon_as_header_bytes_arrive():
    decoder = FrameDecoder(expect_masked=True)
    with pytest.raises(ProtocolError) as info:
        decoder.feed(b"\x81\x05")  # unmasked, only two bytes
    assert info.value.code == 1002


def test_protocol_error_fields():
    error = ProtocolError(1007, "bad utf-8")
    assert (error.code, error.reason) == (1007, "bad utf-8")
    assert "1007" in str(error)


# --------------------------------------------------------------------------
# Close payloads
# --------------------------------------------------------------------------


def test_close_payload_roundtrip():
    payload = encode_close_payload(1000, "bye ✓")
    assert payload[:2] == b"\x03\xe8"
    assert parse_close_payload(payload) == (1000, "bye ✓")
    assert parse_close_payload(encode_close_payload(4001)) == (4001, "")


def test_close_payload_empty_is_1005():
    assert parse_close_payload(b"") == (CloseCode.NO_STATUS, "")
    assert parse_close_payload(b"") == (1005, "")


def test_close_payload_one_byte_is_1002():
    with pytest.raises(ProtocolError) as info:
        parse_close_payload(b"\x03")
    assert info.value.code == 1002


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000, 65535])
def test_invalid_close_codes(code):
    with pytest.raises(ProtocolError) as info:
        parse_close_payload(code.to_bytes(2, "big"))
    assert info.value.code == 1002
    with pytest.raises(ValueError):
        encode_close_payload(code)


@pytest.mark.parametrize("code", [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012,
                                  1013, 1014, 3000, 3999, 4000, 4999])
def test_valid_close_codes(code):
    assert parse_close_payload(encode_close_payload(code, "r")) == (code, "r")


def test_close_reason_invalid_utf8_is_1007():
    with pytest.raises(ProtocolError) as info:
        parse_close_payload(b"\x03\xe8\xff")
    assert info.value.code == 1007


def test_close_reason_too_long():
    encode_close_payload(1000, "x" * 123)
    with pytest.raises(ValueError):
        encode_close_payload(1000, "x" * 124)


def test_close_code_enum_values():
    assert [int(c) for c in CloseCode] == [
        1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1010, 1011
    ]
    assert [int(o) for o in Opcode] == [0, 1, 2, 8, 9, 10]


# --------------------------------------------------------------------------
# Connection: messages
# --------------------------------------------------------------------------


def client_bytes(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """What a client sends: masked."""
    return encode_frame(opcode, payload, fin=fin, mask=True)


def test_server_receives_text_and_binary():
    server = Connection(client=False)
    data = client_bytes(Opcode.TEXT, "héllo".encode()) + client_bytes(Opcode.BINARY, b"\0\1")
    assert server.receive(data) == [TextMessage("héllo"), BinaryMessage(b"\0\1")]


def test_fragmented_message_with_interleaved_ping():
    server = Connection(client=False)
    data = (
        client_bytes(Opcode.TEXT, b"Hel", fin=False)
        + client_bytes(Opcode.PING, b"are you there")
        + client_bytes(Opcode.CONTINUATION, b"l", fin=False)
        + client_bytes(Opcode.PONG, b"")
        + client_bytes(Opcode.CONTINUATION, b"o")
    )
    assert server.receive(data) == [Ping(b"are you there"), Pong(b""), TextMessage("Hello")]


def test_fragmented_binary_byte_by_byte():
    server = Connection(client=False)
    data = client_bytes(Opcode.BINARY, b"ab", fin=False) + client_bytes(Opcode.CONTINUATION, b"cd")
    events = []
    for i in range(len(data)):
        events += server.receive(data[i : i + 1])
    assert events == [BinaryMessage(b"abcd")]


def test_character_split_across_fragments_is_fine():
    emoji = "🫠".encode()
    server = Connection(client=False)
    data = client_bytes(Opcode.TEXT, b"a" + emoji[:2], fin=False) + client_bytes(
        Opcode.CONTINUATION, emoji[2:]
    )
    assert server.receive(data) == [TextMessage("a🫠")]


def test_invalid_utf8_raised_early_before_message_completes():
    server = Connection(client=False)
    assert server.receive(client_bytes(Opcode.TEXT, b"ok ", fin=False)) == []
    with pytest.raises(ProtocolError) as info:
        # Invalid bytes split across two fragments; the message never ends.
        server.receive(client_bytes(Opcode.CONTINUATION, b"\xf0\x28", fin=False))
    assert info.value.code == 1007


def test_invalid_utf8_across_fragment_boundary():
    server = Connection(client=False)
    assert server.receive(client_bytes(Opcode.TEXT, b"\xe2\x82", fin=False)) == []
    with pytest.raises(ProtocolError) as info:
        server.receive(client_bytes(Opcode.CONTINUATION, b"\x41", fin=False))
    assert info.value.code == 1007


def test_truncated_character_at_message_end_is_1007():
    server = Connection(client=False)
    with pytest.raises(ProtocolError) as info:
        server.receive(client_bytes(Opcode.TEXT, "é".encode()[:1]))
    assert info.value.code == 1007


def test_binary_messages_are_not_utf8_checked():
    server = Connection(client=False)
    assert server.receive(client_bytes(Opcode.BINARY, b"\xff\xfe")) == [BinaryMessage(b"\xff\xfe")]


def test_message_too_big_is_1009():
    server = Connection(client=False, max_message=10)
    # A single frame over the limit: refused from its header.
    with pytest.raises(ProtocolError) as info:
        server.receive(client_bytes(Opcode.BINARY, b"x" * 11)[:4])
    assert info.value.code == 1009
    # Fragments that are each small but add up to too much.
    server = Connection(client=False, max_message=10)
    assert server.receive(client_bytes(Opcode.TEXT, b"x" * 6, fin=False)) == []
    with pytest.raises(ProtocolError) as info:
        server.receive(client_bytes(Opcode.CONTINUATION, b"x" * 5, fin=False))
    assert info.value.code == 1009


def test_message_exactly_max_is_fine():
    server = Connection(client=False, max_message=10)
    data = client_bytes(Opcode.TEXT, b"x" * 4, fin=False) + client_bytes(Opcode.CONTINUATION, b"y" * 6)
    assert server.receive(data) == [TextMessage("xxxxyyyyyy")]


def test_continuation_without_start_is_1002():
    with pytest.raises(ProtocolError) as info:
        Connection(client=False).receive(client_bytes(Opcode.CONTINUATION, b"x"))
    assert info.value.code == 1002


def test_new_message_during_fragmented_message_is_1002():
    server = Connection(client=False)
    server.receive(client_bytes(Opcode.TEXT, b"a", fin=False))
    with pytest.raises(ProtocolError) as info:
        server.receive(client_bytes(Opcode.BINARY, b"b"))
    assert info.value.code == 1002


def test_connection_enforces_masking_direction():
    with pytest.raises(ProtocolError):
        Connection(client=False).receive(encode_frame(Opcode.TEXT, b"x"))
    with pytest.raises(ProtocolError):
        Connection(client=True).receive(encode_frame(Opcode.TEXT, b"x", mask=True))


def test_close_received():
    server = Connection(client=False)
    events = server.receive(client_bytes(Opcode.CLOSE, encode_close_payload(1001, "tab closed")))
    assert events == [CloseReceived(1001, "tab closed")]
    assert server.close_received and not server.close_sent
    reply = server.send_close(1001)
    assert server.close_sent
    assert Connection(client=True).receive(reply) == [CloseReceived(1001, "")]


def test_close_with_bad_payload_raises():
    with pytest.raises(ProtocolError) as info:
        Connection(client=False).receive(client_bytes(Opcode.CLOSE, b"\x03\xe8\xff"))
    assert info.value.code == 1007
    with pytest.raises(ProtocolError) as info:
        Connection(client=False).receive(client_bytes(Opcode.CLOSE, b"\x03"))
    assert info.value.code == 1002


def test_first_violation_on_the_wire_is_reported_however_the_bytes_are_split():
    # Found by the fuzzer: invalid UTF-8 in a text frame, then a frame with a
    # reserved bit set. Read in one piece, the decoder used to parse every
    # frame before the connection looked at any, so the *second* error
    # (1002) won; read in two pieces, the first (1007) did.
    data = client_bytes(Opcode.TEXT, b"\xff") + bytes([0xC1, 0x80]) + b"\0\0\0\0"
    codes = []
    for cut in range(len(data) + 1):
        with pytest.raises(ProtocolError) as info:
            server = Connection(client=False)
            server.receive(data[:cut])
            server.receive(data[cut:])
        codes.append(info.value.code)
    assert set(codes) == {1007}


def test_frames_before_the_bad_one_are_handled_in_order():
    server = Connection(client=False)
    data = client_bytes(Opcode.PING, b"a") + client_bytes(Opcode.CONTINUATION, b"x")
    data += bytes([0xC1, 0x80])  # a reserved bit: also an error, but later on the wire
    with pytest.raises(ProtocolError) as info:
        server.receive(data)
    assert info.value.code == 1002 and "continuation" in info.value.reason


def test_connection_stays_failed_after_protocol_error():
    server = Connection(client=False)
    with pytest.raises(ProtocolError) as first:
        server.receive(client_bytes(Opcode.TEXT, b"\xff"))
    with pytest.raises(ProtocolError) as again:
        server.receive(client_bytes(Opcode.TEXT, b"fine"))
    assert again.value is first.value


def test_frame_decoder_frames_parses_lazily():
    decoder = FrameDecoder(expect_masked=True)
    frames = decoder.frames(client_bytes(Opcode.TEXT, b"a") + bytes([0xC1, 0x80]))
    assert next(frames) == Frame(Opcode.TEXT, b"a")  # the broken header is not parsed yet
    with pytest.raises(ProtocolError):
        next(frames)


def test_frames_after_close_are_discarded():
    # Autobahn 7.1.4: a text right behind the CLOSE, in the same read, used
    # to raise 1002 and lose the close itself (so the server closed with 1002
    # instead of echoing 1000, depending on how TCP split the bytes).
    server = Connection(client=False)
    data = client_bytes(Opcode.CLOSE, b"") + client_bytes(Opcode.TEXT, b"late")
    assert server.receive(data) == [CloseReceived(1005, "")]
    assert server.receive(client_bytes(Opcode.PING, b"later")) == []


# --------------------------------------------------------------------------
# Connection: sending
# --------------------------------------------------------------------------


def test_server_sends_unmasked_client_sends_masked():
    server, client = Connection(client=False), Connection(client=True)
    assert server.send_text("Hello") == h("81 05 48 65 6c 6c 6f")
    masked = client.send_text("Hello")
    assert masked[1] & 0x80 and len(masked) == 2 + 4 + 5
    assert server.receive(masked) == [TextMessage("Hello")]


def test_send_helpers_round_trip():
    server, client = Connection(client=False), Connection(client=True)
    wire = (
        client.send_text("hi 🫠")
        + client.send_binary(b"\x00\xff")
        + client.send_ping(b"p")
        + client.send_pong(b"q")
        + client.send_close(1000, "done")
    )
    assert server.receive(wire) == [
        TextMessage("hi 🫠"),
        BinaryMessage(b"\x00\xff"),
        Ping(b"p"),
        Pong(b"q"),
        CloseReceived(1000, "done"),
    ]
    wire = server.send_text("a" * 70000) + server.send_close(None)
    assert client.receive(wire) == [TextMessage("a" * 70000), CloseReceived(1005, "")]


def test_no_data_after_close_sent():
    conn = Connection(client=False)
    conn.send_close()
    with pytest.raises(RuntimeError):
        conn.send_text("late")
    with pytest.raises(RuntimeError):
        conn.send_binary(b"late")
    with pytest.raises(RuntimeError):
        conn.send_close()
    # Control frames other than CLOSE are still allowed by the RFC.
    assert conn.send_pong(b"x") == h("8a 01 78")


def test_ping_payload_limit():
    with pytest.raises(ValueError):
        Connection(client=False).send_ping(b"x" * 126)


@settings(max_examples=200, deadline=None)
@given(
    messages=st.lists(
        st.one_of(st.text(max_size=200).map(TextMessage), st.binary(max_size=200).map(BinaryMessage)),
        max_size=6,
    ),
    fragment=st.integers(min_value=1, max_value=50),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
)
def test_connection_roundtrip_fragmented_with_random_splits(messages, fragment, cuts):
    # The client sends every message cut into fragments of `fragment` bytes
    # (cutting text in the middle of characters), with a ping between
    # fragments; the server gets the byte stream cut at random points.
    wire = b""
    expected = []
    for message in messages:
        if isinstance(message, TextMessage):
            opcode, payload = Opcode.TEXT, message.text.encode("utf-8")
        else:
            opcode, payload = Opcode.BINARY, message.data
        pieces = [payload[i : i + fragment] for i in range(0, len(payload), fragment)] or [b""]
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            wire += encode_frame(opcode if index == 0 else Opcode.CONTINUATION, piece, fin=last,
                                 mask=True)
            if not last:
                wire += encode_frame(Opcode.PING, b"%d" % index, mask=True)
                expected.append(Ping(b"%d" % index))
        expected.append(message)
    server = Connection(client=False)
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    events = []
    for start, end in zip(points, points[1:]):
        events += server.receive(wire[start:end])
    assert events == expected
