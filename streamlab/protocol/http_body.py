"""HTTP/1.1 message bodies: chunked transfer coding and body framing (RFC 9112 sections 6-7).

A head says how its body ends (``Content-Length``, ``Transfer-Encoding:
chunked``, or the close of the connection); this module reads bodies to that
end. ``encode_chunk`` and ``LAST_CHUNK`` write the chunked coding,
``ChunkedDecoder`` reads it, and ``BodyReader`` picks the framing a parsed
head (``streamlab.protocol.http_head.Request`` or ``Response``) announces and reports a body
cut short as ``IncompleteBody``.

Like the other protocol modules this one never touches a socket: the server,
the client and the proxy feed it the bytes they read, and the tests feed it
plain byte strings. Every name here is also importable from ``streamlab.protocol.http_head``.
"""

from __future__ import annotations

import re
from typing import Protocol

from streamlab.protocol.http_fields import HTTPError, check_line_bytes, list_tokens, parse_header_line

__all__ = [
    "LAST_CHUNK",
    "BodyReader",
    "ChunkedDecoder",
    "IncompleteBody",
    "encode_chunk",
]


class IncompleteBody(Exception):
    """The connection closed before the body its head announced was complete.

    Without this check a truncated response is indistinguishable from a
    short one.
    """


# Control characters (except HTAB) in a chunk-size line: a bare CR in a
# chunk extension is read as a line end by some parsers (a smuggling vector).
_FORBIDDEN_IN_CHUNK_LINE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


# --------------------------------------------------------------------------
# Chunked transfer coding
# --------------------------------------------------------------------------

#: The zero-length chunk and the empty trailer section: "the body ends here".
LAST_CHUNK = b"0\r\n\r\n"


def encode_chunk(data: bytes) -> bytes:
    """One chunk: size in hex, CRLF, the data, CRLF.

    An empty ``data`` gives ``b""`` rather than ``b"0\\r\\n\\r\\n"``: a zero-size
    chunk means end of body, and a streaming loop that happens to produce an
    empty piece must not end the response by accident.
    """
    if not data:
        return b""
    return f"{len(data):x}\r\n".encode("ascii") + bytes(data) + b"\r\n"


_HEX = re.compile(rb"[0-9A-Fa-f]+")
# chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] ), the name a token and the value a
# token or a quoted-string (RFC 9112 section 7.1.1). Whitespace may stand only before a ";" or around a "=".
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
_CHUNK_EXT = re.compile(rb"(?:[ \t]*;[ \t]*%s(?:[ \t]*=[ \t]*(?:%s|%s))?)*" % (_TOKEN, _TOKEN, _QUOTED))


class ChunkedDecoder:
    """Incremental decoder of a chunked body.

    ``feed`` returns body bytes as soon as they arrive, even in the middle of
    a chunk: chunk boundaries carry no meaning (any proxy may re-chunk), and
    waiting for a whole chunk would only add delay to a stream. After the
    last chunk and trailer section, ``done`` is True, the trailer fields are
    in ``trailers`` and any bytes that followed are in ``rest``.
    """

    def __init__(self, max_chunk: int = 1 << 24, max_line: int = 4096) -> None:
        self.max_chunk = max_chunk
        self.max_line = max_line
        self.done = False
        self.rest = b""
        self.trailers: list[tuple[str, str]] = []
        self._buffer = bytearray()
        self._state = "size"  # size -> data -> data-end -> size ... -> trailer -> done
        self._remaining = 0

    def feed(self, data: bytes) -> list[bytes]:
        """Consume bytes; return the body bytes they contained."""
        if self.done:
            self.rest += data
            return []
        self._buffer += data
        out: list[bytes] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[bytes]) -> bool:
        """Advance by one piece of syntax; False when more bytes are needed."""
        buf = self._buffer
        if self._state == "size":
            line = self._take_line()
            if line is None:
                return False
            self._remaining = self._parse_size(line)
            self._state = "data" if self._remaining else "trailer"
        elif self._state == "data":
            if not buf:
                return False
            piece = bytes(buf[: self._remaining])
            del buf[: len(piece)]
            self._remaining -= len(piece)
            out.append(piece)
            if self._remaining == 0:
                self._state = "data-end"
        elif self._state == "data-end":
            # The chunk's data must be followed by CRLF right away; anything
            # else means the size lied, and we must not guess.
            if buf[:2] == b"\r\n" or buf[:1] == b"\n":
                del buf[: 2 if buf[:1] == b"\r" else 1]
                self._state = "size"
            elif buf in (b"", b"\r"):
                return False
            else:
                raise HTTPError(400, "chunk data longer than its declared size")
        elif self._state == "trailer":
            line = self._take_line()
            if line is None:
                return False
            if line == b"":
                self.done = True
                self.rest = bytes(buf)
                buf.clear()
                return False
            if len(self.trailers) >= 100:
                raise HTTPError(400, "too many trailer fields")
            # Trailer fields follow the rules of header fields.
            text = line.decode("latin-1")
            check_line_bytes(text, 400)
            try:
                self.trailers.append(parse_header_line(text, 400))
            except HTTPError as err:
                raise HTTPError(400, f"malformed trailer field: {err.message}") from None
        return True

    def _take_line(self) -> bytes | None:
        """Remove and return one line (without its line ending), or None if incomplete.

        A line longer than ``max_line`` (everything before its LF) is
        refused whether it is still arriving or arrived whole, so the
        outcome does not depend on how the bytes were split.
        """
        end = self._buffer.find(b"\n")
        if end > self.max_line or (end < 0 and len(self._buffer) > self.max_line):
            raise HTTPError(400, "chunk size or trailer line too long")
        if end < 0:
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line[:-1] if line.endswith(b"\r") else line

    def _parse_size(self, line: bytes) -> int:
        if _FORBIDDEN_IN_CHUNK_LINE.search(line):
            raise HTTPError(400, "control character in chunk size line")
        # Hex digits only: int(x, 16) would also accept "0x1f", "+1f", " 1f"
        # or "1_f", and two parsers that disagree on the size disagree on
        # where the next request starts.
        digits = _HEX.match(line)
        if digits is None:
            raise HTTPError(400, f"invalid chunk size {line[:20]!r}")
        # Chunk extensions (";name=value") are allowed and ignored by everyone,
        # but only in their grammar: "5 junk", "5;" or an unclosed quote are
        # read differently by different parsers (llhttp's test/request/
        # transfer-encoding.md refuses each of them too).
        if not _CHUNK_EXT.fullmatch(line, digits.end()):
            raise HTTPError(400, f"invalid chunk size line {line[:40]!r}")
        size_text = digits.group(0)
        size = int(size_text, 16)
        if size > self.max_chunk:
            raise HTTPError(413, f"chunk of {size} bytes exceeds {self.max_chunk}")
        return size


# --------------------------------------------------------------------------
# Body framing
# --------------------------------------------------------------------------


class _Head(Protocol):
    """What body framing needs from a parsed head (``streamlab.protocol.http_head.Request`` or ``Response``)."""

    def header(self, name: str, default: str | None = None) -> str | None: ...

    def content_length(self) -> int | None: ...


class _RequestHead(_Head, Protocol):
    def is_chunked(self) -> bool: ...


class _ResponseHead(_Head, Protocol):
    status: int


class BodyReader:
    """Read a message body, knowing where it ends (RFC 9112 section 6.3).

    ``mode`` is how the end is found:

    - ``"none"``: there is no body (a HEAD request, 1xx, 204, 304).
    - ``"length"``: exactly ``Content-Length`` bytes.
    - ``"chunked"``: until the zero-size chunk.
    - ``"close"``: until the server closes the connection. This is the only
      mode in which a truncated body looks complete, which is why streaming
      servers prefer chunked.

    ``feed`` returns body bytes as they arrive; bytes past the end of the
    body are kept in ``rest``. Call ``eof()`` when the connection closes: it
    raises ``IncompleteBody`` if the body was cut short.
    """

    def __init__(
        self, response: _ResponseHead, request_method: str = "GET", *, max_body: int | None = None
    ) -> None:
        mode, length = self._framing(response, request_method.upper())
        self._setup(mode, length, max_body)

    @classmethod
    def for_request(cls, request: _RequestHead, *, max_body: int | None = None) -> BodyReader:
        """A reader for a request body: chunked, Content-Length, or none at all.

        Unlike a response, a request without either header has no body; it
        can never be "read until close", since the client still waits for
        the answer on that connection.
        """
        if request.is_chunked():
            mode, length = "chunked", None
        else:
            mode, length = "length", request.content_length() or 0
        reader = cls.__new__(cls)
        reader._setup(mode, length, max_body)
        return reader

    @staticmethod
    def _framing(response: _ResponseHead, method: str) -> tuple[str, int | None]:
        status = response.status
        if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
            return "none", 0
        if method == "CONNECT" and 200 <= status < 300:
            return "none", 0  # the connection becomes a tunnel
        transfer_coding = list_tokens(response.header("transfer-encoding"))
        if transfer_coding:
            # Transfer-Encoding overrides Content-Length. If chunked is not
            # the final coding, only the close of the connection ends the body.
            return ("chunked", None) if transfer_coding[-1] == "chunked" else ("close", None)
        length = response.content_length()
        if length is not None:
            return "length", length
        return "close", None

    def _setup(self, mode: str, length: int | None, max_body: int | None) -> None:
        self.mode = mode
        self.length = length  # declared length, for mode "length"
        self.max_body = max_body
        self.received = 0
        self._remaining = length or 0
        self._chunked = ChunkedDecoder() if mode == "chunked" else None
        self._rest = b""
        self._eof = False
        if max_body is not None and length is not None and length > max_body:
            # Refuse before reading a single byte of it.
            raise HTTPError(413, f"body of {length} bytes exceeds {max_body}")

    @property
    def done(self) -> bool:
        """Whether the whole body has been received."""
        if self.mode == "chunked":
            assert self._chunked is not None
            return self._chunked.done
        if self.mode == "close":
            return self._eof
        return self._remaining == 0

    @property
    def rest(self) -> bytes:
        """Bytes received after the end of the body (e.g. the next response)."""
        if self._chunked is not None:
            return self._chunked.rest
        return self._rest

    def feed(self, data: bytes) -> list[bytes]:
        """Consume bytes from the connection; return the body bytes among them."""
        if self.mode == "chunked":
            assert self._chunked is not None
            pieces = self._chunked.feed(data)
        elif self.mode == "close":
            pieces = [bytes(data)] if data and not self._eof else []
        else:  # "length" and "none"
            piece = bytes(data[: self._remaining])
            self._rest += data[len(piece) :]
            self._remaining -= len(piece)
            pieces = [piece] if piece else []
        self.received += sum(len(p) for p in pieces)
        if self.max_body is not None and self.received > self.max_body:
            raise HTTPError(413, f"body exceeds {self.max_body} bytes")
        return pieces

    def eof(self) -> None:
        """The connection closed: complete the body, or raise ``IncompleteBody``."""
        self._eof = True
        if not self.done:
            expected = f"{self.length} bytes" if self.mode == "length" else "the last chunk"
            raise IncompleteBody(
                f"connection closed after {self.received} body bytes, before {expected}"
            )
