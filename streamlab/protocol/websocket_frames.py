"""WebSocket frames and close codes (RFC 6455 sections 5 and 7), bytes in and out.

After the handshake (``streamlab.protocol.websocket_handshake``) both sides
exchange *frames*: a 2-byte header, an optional extended length, an
optional 4-byte mask, then the payload.

    byte 0: FIN | RSV1 | RSV2 | RSV3 | opcode (4 bits)
    byte 1: MASK | payload length (7 bits: 0-125, or 126 / 127)
    then:   16-bit length if 126, 64-bit length if 127
    then:   4-byte masking key if MASK is set
    then:   payload

This is the lowest of the three WebSocket modules: a frame knows nothing of
the messages it belongs to (``streamlab.protocol.websocket`` reassembles
those). ``ProtocolError`` lives here because all three raise it: the frame
decoder, the handshake's check of the server's answer, and the connection.
Like the other protocol modules it never touches a socket.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "MAX_CONTROL_PAYLOAD",
    "CloseCode",
    "Frame",
    "FrameDecoder",
    "Opcode",
    "ProtocolError",
    "apply_mask",
    "encode_close_payload",
    "encode_frame",
    "is_valid_close_code",
    "parse_close_payload",
]


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

    def _header(self) -> tuple[Opcode, bool, int, int, bytes] | None:
        """The next frame's ``(opcode, fin, payload length, payload offset, mask key)``; None until it is all here.

        Every rule the header carries is checked here, as soon as its bytes
        have arrived.
        """
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
        return opcode, fin, length, offset, key

    def _next_frame(self) -> Frame | None:
        header = self._header()
        if header is None:
            return None
        opcode, fin, length, offset, key = header
        buf = self._buffer
        if len(buf) < offset + length:
            return None  # header is fine, payload still on its way

        payload = bytes(buf[offset : offset + length])
        del buf[: offset + length]
        if key:
            payload = apply_mask(payload, key)
        return Frame(opcode, payload, fin)

    def partial(self, start: int | None = 0) -> tuple[Opcode, bool, int, bytes] | None:
        """The frame still arriving, once its header is here: ``(opcode, fin, length, payload[start:])``.

        The payload is what has arrived of it so far, unmasked, from byte
        ``start`` on (so a caller that reads it as it comes unmasks each byte
        once); ``start=None`` asks for the header alone. None when no header
        is complete. Call it once ``frames`` has yielded every complete
        frame: it is what lets a text message's UTF-8 be refused at its
        first bad byte, before its frame is complete.
        """
        header = self._header()
        if header is None:
            return None
        opcode, fin, length, offset, key = header
        if start is None:
            return opcode, fin, length, b""
        end = min(len(self._buffer), offset + length)
        piece = bytes(self._buffer[offset + start : end])
        if key and piece:
            shift = start % 4  # the mask repeats every 4 bytes of the payload
            piece = apply_mask(piece, key[shift:] + key[:shift])
        return opcode, fin, length, piece


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
