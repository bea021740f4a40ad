"""WebSocket (RFC 6455), written out: handshake, frames, messages, close codes.

A WebSocket starts life as an HTTP/1.1 request that asks to *upgrade* the
connection. Once the server answers ``101 Switching Protocols``, both sides
stop speaking HTTP and exchange *frames* over the same TCP connection: a
2-byte header, an optional extended length, an optional 4-byte mask, then
the payload.

    byte 0: FIN | RSV1 | RSV2 | RSV3 | opcode (4 bits)
    byte 1: MASK | payload length (7 bits: 0-125, or 126 / 127)
    then:   16-bit length if 126, 64-bit length if 127
    then:   4-byte masking key if MASK is set
    then:   payload

A *message* is one or more data frames (a first TEXT or BINARY frame, then
CONTINUATION frames, the last with FIN set). Control frames (CLOSE, PING,
PONG) are short, never fragmented, and may arrive between the fragments of a
message.

Like the other protocol modules this one never touches a socket: it turns
bytes into frames and events, and events into bytes ("sans I/O", in the
manner of wsproto). The server, the client and the tests share it.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import hashlib
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "GUID",
    "BinaryMessage",
    "CloseCode",
    "CloseReceived",
    "Connection",
    "Frame",
    "FrameDecoder",
    "HandshakeError",
    "Opcode",
    "Ping",
    "Pong",
    "ProtocolError",
    "TextMessage",
    "accept_key",
    "apply_mask",
    "check_server_response",
    "client_handshake",
    "encode_close_payload",
    "encode_frame",
    "is_valid_close_code",
    "new_key",
    "parse_close_payload",
    "server_handshake_response",
    "validate_upgrade_request",
]

# --------------------------------------------------------------------------
# The opening handshake
# --------------------------------------------------------------------------

#: Fixed by RFC 6455. The server proves it understood the upgrade by hashing
#: the client's random key together with this string; a plain HTTP server
#: (or a cache replaying an old response) cannot produce the right answer.
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def accept_key(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` value that answers a ``Sec-WebSocket-Key``.

    base64(SHA-1(key + GUID)). It is not security: it only shows that the
    peer is a WebSocket server that read this very request.
    """
    digest = hashlib.sha1((key + GUID).encode("ascii")).digest()
    return base64.b64encode(digest).decode("ascii")


def new_key() -> str:
    """A fresh ``Sec-WebSocket-Key``: 16 random bytes, base64-encoded."""
    return base64.b64encode(os.urandom(16)).decode("ascii")


class ProtocolError(Exception):
    """The peer broke RFC 6455.

    ``code`` is the close code to send before dropping the connection
    (1002 protocol error, 1007 invalid data, 1009 message too big, ...), so
    the caller can answer with ``Connection.send_close(err.code, err.reason)``.
    """

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code} {reason}")
        self.code = code
        self.reason = reason


class HandshakeError(Exception):
    """An upgrade request the server must refuse with a plain HTTP response.

    ``status`` is the HTTP status to answer with, ``headers`` any headers
    that answer needs (426 must say which version we speak; 405 which method
    is allowed).
    """

    def __init__(
        self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.headers = list(headers)


def _header_lines(headers: Iterable[tuple[str, str]]) -> str:
    """Render headers, refusing CR/LF that would smuggle in extra lines."""
    out = []
    for name, value in headers:
        if any(c in f"{name}{value}" for c in "\r\n\0") or ":" in name or not name:
            raise ValueError(f"invalid header {name!r}: {value!r}")
        out.append(f"{name}: {value}\r\n")
    return "".join(out)


def _tokens(value: str | None) -> set[str]:
    """The comma-separated tokens of a header such as ``Connection``, lowercased.

    Browsers send ``Connection: keep-alive, Upgrade``, so comparing the
    whole value with "upgrade" would wrongly refuse them.
    """
    if not value:
        return set()
    return {token.strip().lower() for token in value.split(",") if token.strip()}


def client_handshake(
    host: str,
    path: str,
    key: str,
    *,
    origin: str | None = None,
    extra_headers: Iterable[tuple[str, str]] = (),
) -> bytes:
    """The client's upgrade request: an ordinary HTTP/1.1 GET with four extra headers.

    ``Origin`` is what browsers send and what a server must check: browsers
    apply no CORS to WebSockets and do attach cookies, so without an Origin
    check any web page could open a socket in the user's name.
    """
    if not path.startswith("/") or any(c in path for c in " \r\n\0"):
        raise ValueError(f"invalid request path {path!r}")
    headers = [
        ("Host", host),
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", key),
        ("Sec-WebSocket-Version", "13"),
    ]
    if origin is not None:
        headers.append(("Origin", origin))
    headers.extend(extra_headers)
    return f"GET {path} HTTP/1.1\r\n{_header_lines(headers)}\r\n".encode("latin-1")


def server_handshake_response(
    key: str, extra_headers: Iterable[tuple[str, str]] = ()
) -> bytes:
    """The server's ``101 Switching Protocols``: after these bytes, frames follow."""
    headers = [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Accept", accept_key(key)),
        *extra_headers,
    ]
    return f"HTTP/1.1 101 Switching Protocols\r\n{_header_lines(headers)}\r\n".encode("latin-1")


def validate_upgrade_request(method: str, headers: Mapping[str, str]) -> str:
    """Check an upgrade request (header names lowercased); return its key.

    Raises ``HandshakeError`` with the HTTP status the server should answer
    with. The checks follow RFC 6455 section 4.2.1, in an order that gives
    the most useful status: a wrong method (405), not an upgrade at all
    (400), a version we do not speak (426, which must tell the client the
    version we do speak), then a key that is missing or not 16 bytes (400).
    """
    if method != "GET":
        raise HandshakeError(405, "WebSocket upgrade requires GET", [("Allow", "GET")])
    if not headers.get("host"):
        raise HandshakeError(400, "missing Host header")
    if "websocket" not in _tokens(headers.get("upgrade")):
        raise HandshakeError(400, "missing 'Upgrade: websocket' header")
    if "upgrade" not in _tokens(headers.get("connection")):
        raise HandshakeError(400, "missing 'Connection: Upgrade' header")
    if (headers.get("sec-websocket-version") or "").strip() != "13":
        raise HandshakeError(
            426, "unsupported WebSocket version", [("Sec-WebSocket-Version", "13")]
        )
    key = (headers.get("sec-websocket-key") or "").strip()
    if not key:
        raise HandshakeError(400, "missing Sec-WebSocket-Key header")
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raise HandshakeError(400, "Sec-WebSocket-Key is not base64") from None
    if len(raw) != 16:
        raise HandshakeError(400, "Sec-WebSocket-Key must encode 16 bytes")
    return key


def check_server_response(status: int, headers: Mapping[str, str], key: str) -> None:
    """The client's check of the server's answer (header names lowercased).

    Anything but a 101 with the right ``Sec-WebSocket-Accept`` means we are
    not talking to a WebSocket server that read our request, and the client
    must fail the connection (RFC 6455 section 4.1). Raises ``ProtocolError``
    with code 1002.
    """
    if status != 101:
        raise ProtocolError(1002, f"expected status 101, got {status}")
    if "websocket" not in _tokens(headers.get("upgrade")):
        raise ProtocolError(1002, "response lacks 'Upgrade: websocket'")
    if "upgrade" not in _tokens(headers.get("connection")):
        raise ProtocolError(1002, "response lacks 'Connection: Upgrade'")
    if (headers.get("sec-websocket-accept") or "").strip() != accept_key(key):
        raise ProtocolError(1002, "wrong Sec-WebSocket-Accept")
    if headers.get("sec-websocket-extensions"):
        # We never offer an extension (e.g. permessage-deflate), so a server
        # that picks one would send frames we cannot read.
        raise ProtocolError(1002, "server selected an extension we did not offer")


# --------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------


class Opcode(IntEnum):
    """The 4-bit frame type. 3-7 and 0xB-0xF are reserved."""

    CONTINUATION = 0x0
    TEXT = 0x1
    BINARY = 0x2
    CLOSE = 0x8
    PING = 0x9
    PONG = 0xA

    @property
    def is_control(self) -> bool:
        """Control opcodes have the high bit set (8 and above)."""
        return self >= 0x8


class CloseCode(IntEnum):
    """Status codes of a CLOSE frame (RFC 6455 section 7.4.1)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    UNSUPPORTED_DATA = 1003
    NO_STATUS = 1005  # never sent: what a receiver reports for an empty CLOSE
    ABNORMAL = 1006  # never sent: the TCP connection dropped without a CLOSE
    INVALID_DATA = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    MANDATORY_EXTENSION = 1010
    INTERNAL_ERROR = 1011


@dataclass
class Frame:
    """One frame, payload already unmasked."""

    opcode: Opcode
    payload: bytes
    fin: bool = True
    rsv: int = 0


#: Control frames must fit in the 7-bit length, so they can be sent in the
#: middle of a huge fragmented message without waiting for it.
MAX_CONTROL_PAYLOAD = 125


def apply_mask(data: bytes, key: bytes) -> bytes:
    """XOR ``data`` with the 4-byte ``key`` repeated; masking and unmasking are the same.

    Clients must mask every frame with a fresh random key. It is not
    encryption (the key travels in the frame); it stops a malicious page
    from choosing the exact bytes on the wire, which could otherwise poison
    a transparent proxy's cache. Doing the XOR on two big integers keeps it
    fast in pure Python.
    """
    n = len(data)
    if n == 0:
        return b""
    repeated = (key * (n // 4 + 1))[:n]
    masked = int.from_bytes(data, "big") ^ int.from_bytes(repeated, "big")
    return masked.to_bytes(n, "big")


def encode_frame(
    opcode: int, payload: bytes, *, fin: bool = True, mask: bytes | bool = False
) -> bytes:
    """Encode one frame.

    The payload length uses the smallest form that fits: 7 bits for up to
    125 bytes, 126 + 16 bits up to 65535, 127 + 64 bits beyond. ``mask`` is
    ``True`` for a random key (what a client must do), or 4 explicit bytes
    (for reproducing the RFC's examples in tests).
    """
    opcode = Opcode(opcode)
    payload = bytes(payload)
    length = len(payload)
    if opcode.is_control and (length > MAX_CONTROL_PAYLOAD or not fin):
        raise ValueError("control frames must be unfragmented with at most 125 bytes")

    head = bytearray([(0x80 if fin else 0) | opcode])
    mask_bit = 0x80 if mask is not False else 0
    if length <= 125:
        head.append(mask_bit | length)
    elif length <= 0xFFFF:
        head.append(mask_bit | 126)
        head += struct.pack("!H", length)
    else:
        head.append(mask_bit | 127)
        head += struct.pack("!Q", length)

    if mask is False:
        return bytes(head) + payload
    key = os.urandom(4) if mask is True else bytes(mask)
    if len(key) != 4:
        raise ValueError("a masking key is exactly 4 bytes")
    return bytes(head) + key + apply_mask(payload, key)


class FrameDecoder:
    """Incremental frame parser: bytes in, whole ``Frame`` objects out.

    ``expect_masked`` is True on the server (clients must mask) and False on
    the client (servers must not). Every rule is checked as soon as the bytes
    that carry it have arrived. In particular the length is checked against
    ``max_frame`` before any payload is buffered, so a peer announcing a
    10 GB frame is refused after 10 bytes, not after filling our memory.
    """

    def __init__(self, *, expect_masked: bool, max_frame: int = 1 << 20) -> None:
        self.expect_masked = expect_masked
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """Consume bytes; return the frames they complete (maybe none)."""
        return list(self.frames(data))

    def frames(self, data: bytes) -> Iterator[Frame]:
        """Consume bytes; yield the frames they complete, each parsed only when asked for.

        The bytes are taken at once; the frames are parsed lazily, so a
        caller that acts on each frame before the next one is parsed (as
        ``Connection.receive`` does) meets errors in the order they are on
        the wire. With ``feed``, a broken frame header later in the same
        read would be reported before an invalid message earlier in it, and
        the close code would depend on how TCP happened to split the bytes.
        """
        self._buffer += data
        return iter(self._next_frame, None)

    def _next_frame(self) -> Frame | None:
        buf = self._buffer
        if len(buf) < 2:
            return None
        b0, b1 = buf[0], buf[1]
        fin = bool(b0 & 0x80)
        rsv = (b0 >> 4) & 0x7
        masked = bool(b1 & 0x80)
        length = b1 & 0x7F

        # Everything in the first two bytes can be judged right away.
        if rsv:
            # RSV bits belong to extensions (permessage-deflate uses RSV1);
            # none was negotiated, so a set bit means we cannot read the frame.
            raise ProtocolError(1002, "reserved bits set without a negotiated extension")
        try:
            opcode = Opcode(b0 & 0x0F)
        except ValueError:
            raise ProtocolError(1002, f"unknown opcode {b0 & 0x0F:#x}") from None
        if opcode.is_control:
            if not fin:
                raise ProtocolError(1002, "fragmented control frame")
            if length > MAX_CONTROL_PAYLOAD:
                raise ProtocolError(1002, "control frame payload over 125 bytes")
        if masked != self.expect_masked:
            if self.expect_masked:
                raise ProtocolError(1002, "client frames must be masked")
            raise ProtocolError(1002, "server frames must not be masked")

        offset = 2
        if length == 126:
            if len(buf) < 4:
                return None
            (length,) = struct.unpack_from("!H", buf, 2)
            offset = 4
        elif length == 127:
            if len(buf) < 10:
                return None
            (length,) = struct.unpack_from("!Q", buf, 2)
            if length >> 63:
                raise ProtocolError(1002, "64-bit length with the most significant bit set")
            offset = 10
        if length > self.max_frame:
            raise ProtocolError(1009, f"frame of {length} bytes exceeds {self.max_frame}")

        key = b""
        if masked:
            if len(buf) < offset + 4:
                return None
            key = bytes(buf[offset : offset + 4])
            offset += 4
        if len(buf) < offset + length:
            return None  # header is fine, payload still on its way

        payload = bytes(buf[offset : offset + length])
        del buf[: offset + length]
        if masked:
            payload = apply_mask(payload, key)
        return Frame(opcode, payload, fin)


# --------------------------------------------------------------------------
# Closing
# --------------------------------------------------------------------------


def is_valid_close_code(code: int) -> bool:
    """Whether a code may appear in a CLOSE frame on the wire.

    1004 is reserved; 1005, 1006 and 1015 only describe what happened
    locally and must never be sent; 1012-1014 were registered after the RFC;
    3000-3999 are registered by libraries and 4000-4999 are free for
    applications. Everything else is invalid.
    """
    return 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999


def encode_close_payload(code: int, reason: str = "") -> bytes:
    """A CLOSE payload: 2-byte big-endian code, then a UTF-8 reason.

    The whole payload is a control frame's, so the reason gets at most 123
    bytes.
    """
    if not is_valid_close_code(code):
        raise ValueError(f"close code {code} may not be sent")
    payload = struct.pack("!H", code) + reason.encode("utf-8")
    if len(payload) > MAX_CONTROL_PAYLOAD:
        raise ValueError("close reason longer than 123 bytes")
    return payload


def parse_close_payload(payload: bytes) -> tuple[int, str]:
    """Read a received CLOSE payload into ``(code, reason)``.

    An empty payload is legal and is reported as 1005 ("no status"), a code
    that can never be on the wire, so the application can tell the cases
    apart.
    """
    if len(payload) == 0:
        return int(CloseCode.NO_STATUS), ""
    if len(payload) == 1:
        raise ProtocolError(1002, "close payload of one byte")
    (code,) = struct.unpack_from("!H", payload)
    if not is_valid_close_code(code):
        raise ProtocolError(1002, f"invalid close code {code}")
    try:
        reason = payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(1007, "close reason is not valid UTF-8") from None
    return code, reason


# --------------------------------------------------------------------------
# Messages: a sans-I/O connection
# --------------------------------------------------------------------------


@dataclass
class TextMessage:
    """A complete text message, reassembled and UTF-8 validated."""

    text: str


@dataclass
class BinaryMessage:
    """A complete binary message, reassembled."""

    data: bytes


@dataclass
class Ping:
    """The peer asks for a pong with the same payload (it is checking we are alive)."""

    payload: bytes


@dataclass
class Pong:
    """The answer to one of our pings (or an unsolicited heartbeat)."""

    payload: bytes


@dataclass
class CloseReceived:
    """The peer started (or answered) the closing handshake."""

    code: int
    reason: str


WebSocketEvent = TextMessage | BinaryMessage | Ping | Pong | CloseReceived


class Connection:
    """One side of a WebSocket after the handshake, as bytes-in / events-out.

    ``receive`` turns bytes from the socket into messages and control
    events; the ``send_*`` methods return bytes for the caller to write.
    Nothing is sent automatically: when a ``Ping`` arrives, the I/O layer
    decides to answer with ``send_pong``; when a ``CloseReceived`` arrives,
    it answers with ``send_close``; when ``receive`` raises
    ``ProtocolError``, it sends ``send_close(err.code, err.reason)`` and
    closes the socket. Keeping the decisions in the caller makes each of
    them visible in the server's code.
    """

    def __init__(self, *, client: bool, max_message: int = 1 << 20) -> None:
        self.client = client
        self.max_message = max_message
        # A single frame can never be larger than a whole message.
        self._decoder = FrameDecoder(expect_masked=not client, max_frame=max_message)
        self._message_opcode: Opcode | None = None  # set while a fragmented message is open
        self._parts: list = []
        self._size = 0
        self._text_decoder: codecs.IncrementalDecoder | None = None
        self._error: ProtocolError | None = None  # set once the peer broke the protocol
        self.close_sent = False
        self.close_received = False

    # -- receiving -----------------------------------------------------------

    def receive(self, data: bytes) -> list[WebSocketEvent]:
        """Consume bytes from the peer; return the events they complete.

        Frames are handled one by one in wire order, so the first violation
        in the stream is the one reported, however the bytes were split into
        reads. Once ``ProtocolError`` has been raised the connection has
        failed: every later call raises the same error (events completed
        earlier in the failing call are not returned; the connection is
        being torn down anyway).
        """
        if self._error is not None:
            raise self._error
        events: list[WebSocketEvent] = []
        try:
            for frame in self._decoder.frames(data):
                event = self._handle_frame(frame)
                if event is not None:
                    events.append(event)
        except ProtocolError as err:
            self._error = err
            raise
        return events

    def _handle_frame(self, frame: Frame) -> WebSocketEvent | None:
        if self.close_received:
            raise ProtocolError(1002, "frame received after CLOSE")
        op = frame.opcode
        if op == Opcode.PING:
            return Ping(frame.payload)
        if op == Opcode.PONG:
            return Pong(frame.payload)
        if op == Opcode.CLOSE:
            code, reason = parse_close_payload(frame.payload)
            self.close_received = True
            return CloseReceived(code, reason)

        # Data frames: TEXT or BINARY open a message, CONTINUATION extends it.
        if op == Opcode.CONTINUATION:
            if self._message_opcode is None:
                raise ProtocolError(1002, "continuation frame without a message to continue")
        else:
            if self._message_opcode is not None:
                raise ProtocolError(1002, "new message started before the previous one ended")
            self._message_opcode = op
            self._parts, self._size = [], 0
            if op == Opcode.TEXT:
                self._text_decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")

        self._size += len(frame.payload)
        if self._size > self.max_message:
            raise ProtocolError(1009, f"message exceeds {self.max_message} bytes")

        if self._message_opcode == Opcode.TEXT:
            # Validate each fragment as it arrives: invalid UTF-8 is refused
            # at once, while a character split between two fragments is
            # simply held by the decoder until its last byte comes.
            assert self._text_decoder is not None
            try:
                self._parts.append(self._text_decoder.decode(frame.payload, final=frame.fin))
            except UnicodeDecodeError:
                raise ProtocolError(1007, "text message is not valid UTF-8") from None
        else:
            self._parts.append(frame.payload)

        if not frame.fin:
            return None
        opcode, parts = self._message_opcode, self._parts
        self._message_opcode, self._parts, self._text_decoder = None, [], None
        if opcode == Opcode.TEXT:
            return TextMessage("".join(parts))
        return BinaryMessage(b"".join(parts))

    # -- sending ---------------------------------------------------------------

    def _frame(self, opcode: Opcode, payload: bytes) -> bytes:
        # Clients mask every frame; servers never do.
        return encode_frame(opcode, payload, mask=self.client)

    def _check_can_send_data(self) -> None:
        if self.close_sent:
            raise RuntimeError("cannot send data after sending CLOSE")

    def send_text(self, text: str) -> bytes:
        """Bytes for a text message (one frame)."""
        self._check_can_send_data()
        return self._frame(Opcode.TEXT, text.encode("utf-8"))

    def send_binary(self, data: bytes) -> bytes:
        """Bytes for a binary message (one frame)."""
        self._check_can_send_data()
        return self._frame(Opcode.BINARY, data)

    def send_ping(self, payload: bytes = b"") -> bytes:
        """Bytes for a ping; the peer must answer with a pong carrying ``payload``."""
        return self._frame(Opcode.PING, payload)

    def send_pong(self, payload: bytes = b"") -> bytes:
        """Bytes for a pong, normally echoing the payload of a received ping."""
        return self._frame(Opcode.PONG, payload)

    def send_close(self, code: int | None = 1000, reason: str = "") -> bytes:
        """Bytes for a CLOSE frame; no data may be sent after it.

        The closing handshake: one side sends CLOSE, the other answers with
        CLOSE, then the server closes TCP. ``code=None`` sends an empty
        CLOSE, which the peer reads as 1005 (no status).
        """
        if self.close_sent:
            raise RuntimeError("CLOSE already sent")
        payload = b"" if code is None else encode_close_payload(code, reason)
        self.close_sent = True
        return self._frame(Opcode.CLOSE, payload)
