"""The wire laid out for a reader: a chunked body chunk by chunk, a WebSocket frame field by field.

The decoders elsewhere in ``protocol/`` (``http_body.ChunkedDecoder``,
``websocket_frames.FrameDecoder``) hand back what the bytes *mean* and drop
the framing on the way, which is what a server or a client wants. A chapter
that shows the wire wants the framing itself: where each chunk's size line
ends, which bit of the first byte is FIN, where the masking key sits. These
functions keep it. Bytes in, plain records out, no sockets.

    >>> [c.size for c in split_chunks(b"3\\r\\nabc\\r\\n0\\r\\n\\r\\n")[0]]
    [3, 0]
    >>> frame_layout(b"\\x81\\x02hi").payload
    b'hi'
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from streamlab.protocol.websocket_frames import Opcode, apply_mask

__all__ = ["Chunk", "FrameLayout", "frame_layout", "split_chunks", "visible"]


@dataclass(frozen=True)
class Chunk:
    """One chunk of a ``Transfer-Encoding: chunked`` body, framing kept.

    ``size_line`` is the hex length and its CRLF (``b"2f\\r\\n"``); ``data``
    the ``size`` bytes that follow; the CRLF after them is not kept. The last
    chunk has size 0 and no data: it ends the body.
    """

    size_line: bytes
    size: int
    data: bytes

    @property
    def wire(self) -> bytes:
        """The bytes this chunk took on the wire (the last one: its line and the empty trailer line)."""
        return self.size_line + self.data + b"\r\n"


def split_chunks(body: bytes) -> tuple[list[Chunk], bytes]:
    """A chunked body (the bytes after the head) as its chunks, and what is left unparsed.

    What is left is an unfinished chunk (the body was cut, or not all of it
    has arrived) or whatever followed the last chunk. A size line may carry
    extensions (``1a;name=value``); they are kept in ``size_line`` and ignored,
    as every reader must.
    """
    chunks: list[Chunk] = []
    at = 0
    while True:
        end = body.find(b"\r\n", at)
        if end < 0:
            return chunks, body[at:]
        line = body[at : end + 2]
        digits = line[:-2].split(b";", 1)[0].strip()
        try:
            size = int(digits, 16)
        except ValueError:
            raise ValueError(f"not a chunk size line: {line!r}") from None
        start = end + 2
        if size == 0:
            # The last chunk, then trailer fields (ours sends none) and an empty line.
            close = body.find(b"\r\n", start)
            if close < 0:
                return chunks, body[at:]
            chunks.append(Chunk(line, 0, b""))
            return chunks, body[close + 2 :]
        if len(body) < start + size + 2:
            return chunks, body[at:]
        if body[start + size : start + size + 2] != b"\r\n":
            raise ValueError(f"chunk of {size} bytes not followed by CRLF")
        chunks.append(Chunk(line, size, body[start : start + size]))
        at = start + size + 2


@dataclass(frozen=True)
class FrameLayout:
    """One WebSocket frame (RFC 6455 section 5.2), each field as it sits on the wire.

    ``header`` is the first two bytes; ``extended_length`` the 2 or 8 bytes
    that follow when the 7-bit length says 126 or 127 (else empty);
    ``mask_key`` the 4 bytes after that when the MASK bit is set (else
    empty); ``wire_payload`` the payload as sent and ``payload`` as meant
    (unmasked). ``size`` is the frame's length on the wire.
    """

    fin: bool
    rsv: int
    opcode: int
    masked: bool
    length_field: int
    length: int
    header: bytes
    extended_length: bytes
    mask_key: bytes
    wire_payload: bytes
    payload: bytes

    @property
    def opcode_name(self) -> str:
        try:
            return Opcode(self.opcode).name.lower()
        except ValueError:
            return "reserved"

    @property
    def size(self) -> int:
        return len(self.header) + len(self.extended_length) + len(self.mask_key) + self.length


def frame_layout(data: bytes) -> FrameLayout:
    """Lay out the frame at the start of ``data`` (bytes after it are ignored).

    Raises ``ValueError`` when ``data`` holds less than one whole frame.
    """
    if len(data) < 2:
        raise ValueError("a frame has at least 2 bytes")
    b0, b1 = data[0], data[1]
    masked = bool(b1 & 0x80)
    length_field = b1 & 0x7F
    at = 2
    extended = b""
    length = length_field
    if length_field == 126:
        extended = data[2:4]
        if len(extended) < 2:
            raise ValueError("frame cut inside its 16-bit length")
        (length,) = struct.unpack("!H", extended)
        at = 4
    elif length_field == 127:
        extended = data[2:10]
        if len(extended) < 8:
            raise ValueError("frame cut inside its 64-bit length")
        (length,) = struct.unpack("!Q", extended)
        at = 10
    key = b""
    if masked:
        key = data[at : at + 4]
        if len(key) < 4:
            raise ValueError("frame cut inside its masking key")
        at += 4
    wire = data[at : at + length]
    if len(wire) < length:
        raise ValueError(f"frame announces {length} payload bytes, {len(wire)} present")
    return FrameLayout(
        fin=bool(b0 & 0x80), rsv=(b0 >> 4) & 0x7, opcode=b0 & 0x0F, masked=masked, length_field=length_field,
        length=length, header=bytes(data[:2]), extended_length=bytes(extended), mask_key=bytes(key),
        wire_payload=bytes(wire), payload=apply_mask(wire, key) if masked else bytes(wire),
    )


def visible(data: bytes) -> list[str]:
    """Bytes as lines a reader can read, every CR and LF written out as ``\\r`` and ``\\n``.

    Each line keeps its own line ending, so ``\\r\\n`` (HTTP's) and ``\\n``
    (the event stream's) stay told apart. Other control bytes and bytes that
    are not UTF-8 are escaped; text (accents, emoji) is shown as text.
    """
    text = data.decode("utf-8", "backslashreplace")
    lines, current = [], []
    for ch in text:
        if ch == "\n":
            current.append("\\n")
            lines.append("".join(current))
            current = []
        elif ch == "\r":
            current.append("\\r")
        elif ch < " " or ch == "\x7f":
            current.append(f"\\x{ord(ch):02x}")
        else:
            current.append(ch)
    if current:
        lines.append("".join(current))
    return lines
