"""HTTP/1.1, written out: message heads and responses (RFC 9110/9112).

An HTTP/1.1 message is a *head* (a start line and header lines, each ended
by CRLF, then an empty line) followed by a *body*. The hard part is not the
syntax but the framing: knowing where the head ends, where the body ends,
and refusing input that two programs could read differently (the root of
"request smuggling"). Every check below exists for one of those reasons.

This module holds the heads: ``RequestHeadParser`` and ``parse_request_head``
on the server side, ``ResponseHeadParser`` and ``parse_response_head`` on the
client and proxy side, and the writers of responses (``response_head``,
``json_response``, ``error_response``). The body, chunked coding and
``BodyReader``, is in ``streamlab.protocol.http_body``; the field syntax both share,
and ``HTTPError``, in ``streamlab.protocol.http_fields``. Their public names are
re-exported here, so ``from streamlab.protocol.http_head import BodyReader`` keeps working.

Like the other protocol modules this one never touches a socket. The
asyncio server feeds ``RequestHeadParser`` the bytes it reads; the client
and the proxy feed ``ResponseHeadParser`` and ``BodyReader``. All of them are
tested with plain byte strings.

Heads are decoded as ISO-8859-1 (latin-1): HTTP header bytes are octets,
latin-1 maps each byte to exactly one character, so nothing is lost and no
decoding error can occur.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote

from streamlab.protocol.http_fields import TOKEN, HTTPError, check_line_bytes, list_tokens, parse_header_line

__all__ = [
    "MAX_CONTENT_LENGTH",
    "FinalResponseParser",
    "Request",
    "RequestHeadParser",
    "Response",
    "ResponseHeadParser",
    "error_response",
    "is_interim",
    "json_response",
    "parse_request_head",
    "parse_response_head",
    "reason_phrase",
    "response_head",
]


# Host = uri-host [ ":" port ] (RFC 9110 section 7.2, RFC 3986 section 3.2.2):
# an IP literal in brackets or a reg-name (possibly empty), then digits.
_HOST = re.compile(r"(?:\[[0-9A-Za-z:._~!$&'()*+,;=%-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(?::[0-9]*)?")
# An HTTP-version is case-sensitive "HTTP/" DIGIT "." DIGIT (RFC 9112 section 2.3).
_VERSION = re.compile(r"HTTP/[0-9]\.[0-9]")

#: The largest Content-Length we can represent (a 63-bit length, what every
#: server's file offsets use); a longer value is refused as malformed rather
#: than handed to ``int()``, which refuses strings over 4300 digits.
MAX_CONTENT_LENGTH = (1 << 63) - 1


# --------------------------------------------------------------------------
# Heads: shared parts of requests and responses
# --------------------------------------------------------------------------


def _split_head_lines(head: bytes, bad_status: int) -> list[str]:
    """Split a head into lines (line endings removed), checking each one's bytes."""
    lines = head.decode("latin-1").split("\n")
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    while lines and lines[-1] == "":
        lines.pop()  # the empty line(s) that terminated the head
    for line in lines:
        check_line_bytes(line, bad_status)
    if not lines:
        raise HTTPError(bad_status, "empty message head")
    return lines


def _parse_header_lines(
    lines: list[str], *, max_headers: int, bad_status: int, too_many_status: int
) -> list[tuple[str, str]]:
    """Parse ``Name: value`` lines into ``(lowercased name, stripped value)`` pairs."""
    if len(lines) > max_headers:
        raise HTTPError(too_many_status, f"more than {max_headers} header fields")
    return [parse_header_line(line, bad_status) for line in lines]


class _HeaderAccess:
    """Header lookups shared by ``Request`` and ``Response``."""

    headers: list[tuple[str, str]]
    version: str
    _bad_status = 400  # what a malformed framing header is reported as

    def header(self, name: str, default: str | None = None) -> str | None:
        """A header's value, case-insensitively; repeated fields are comma-joined.

        Joining with ", " is what RFC 9110 section 5.3 says repeated fields
        mean (except ``Set-Cookie``, which a request never carries).
        """
        values = self.header_values(name)
        return ", ".join(values) if values else default

    def header_values(self, name: str) -> list[str]:
        """Every value of a header, in order, as received."""
        name = name.lower()
        return [value for key, value in self.headers if key == name]

    def content_length(self) -> int | None:
        """The body length declared by ``Content-Length``, or None.

        Only digits are allowed (``int()`` would also accept "+5", " 5" or
        "5_0"). Repeated or comma-listed values must all agree: two different
        lengths are the classic request-smuggling trick, because a proxy may
        believe the first and the server the last.
        """
        values = self.header_values("content-length")
        if not values:
            return None
        lengths = set()
        for value in values:
            for part in value.split(","):
                part = part.strip(" \t")
                if not (part.isascii() and part.isdigit()):
                    raise HTTPError(self._bad_status, f"invalid Content-Length {value[:40]!r}")
                # Bounded before int(): Python refuses to convert more than
                # 4300 digits (a ValueError, not our error), and no body
                # is larger than a 63-bit length anyway.
                digits = part.lstrip("0") or "0"
                if len(digits) > 19 or int(digits) > MAX_CONTENT_LENGTH:
                    raise HTTPError(self._bad_status, f"Content-Length out of range {value[:40]!r}")
                lengths.add(int(digits))
        if len(lengths) != 1:
            raise HTTPError(self._bad_status, "conflicting Content-Length values")
        return lengths.pop()

    def keep_alive(self) -> bool:
        """Whether the connection stays open after this message.

        HTTP/1.1 keeps connections open unless told ``Connection: close``;
        HTTP/1.0 closes them unless told ``Connection: keep-alive``.
        """
        tokens = list_tokens(self.header("connection"))
        if "close" in tokens:
            return False
        if self.version == "HTTP/1.1":
            return True
        return "keep-alive" in tokens


class _HeadParser:
    """Buffer bytes until the empty line that ends a head, within a size limit.

    The limit is enforced while buffering, not after: a client that sends an
    endless header line must be cut off once it passes ``max_head``, not when
    (if ever) it finishes.

    The head is read line by line: each line is handed to ``_line`` as soon
    as its line ending arrives, so a subclass can refuse a malformed line at
    once instead of waiting for the end of the head (which a broken client
    may never send). Because lines are always checked in order, the outcome
    (the message, or the first refusal) is the same however the bytes were
    split into reads.
    """

    _bad_status = 400
    _too_large_status = 431

    def __init__(self, max_head: int, max_headers: int) -> None:
        self.max_head = max_head
        self.max_headers = max_headers
        self.rest = b""  # bytes after the head: the start of the body
        self._buffer = bytearray()
        self._scanned = 0  # where the current, unfinished line starts
        self._skipped = 0  # empty lines skipped before the start line
        self._started = False
        self._finished = False

    def _feed_head(self, data: bytes) -> bytes | None:
        if self._finished:
            raise RuntimeError("head already parsed; the body starts with .rest")
        self._buffer += data
        if not self._started:
            # RFC 9112 section 2.2: ignore empty lines before the start line
            # (some clients send an extra CRLF after a POST body).
            while self._buffer[:2] == b"\r\n" or self._buffer[:1] == b"\n":
                cut = 2 if self._buffer[:1] == b"\r" else 1
                del self._buffer[:cut]
                self._skipped += cut
            self._started = bool(self._buffer) and self._buffer != b"\r"
        if not self._started:
            if self._skipped > self.max_head:
                raise HTTPError(self._too_large_status, "too many empty lines")
            return None

        # Look for line ends only in bytes not yet searched, so feeding byte
        # by byte stays linear. A line is checked (or ends the head, if it is
        # empty) once its LF is here and it fits in max_head.
        buffer = self._buffer
        while (end := buffer.find(b"\n", self._scanned)) >= 0:
            if end + 1 > self.max_head:
                raise HTTPError(self._too_large_status, f"message head over {self.max_head} bytes")
            start, self._scanned = self._scanned, end + 1
            if end > start and buffer[end - 1] == 0x0D:
                end -= 1  # CRLF; a bare LF is accepted as RFC 9112 section 2.2 allows
            if end == start:  # the empty line: the head is complete
                head = bytes(buffer[: self._scanned])
                self.rest = bytes(buffer[self._scanned :])
                buffer.clear()
                self._finished = True
                return head
            self._line(buffer[start:end].decode("latin-1"))
        if len(buffer) > self.max_head:
            raise HTTPError(self._too_large_status, f"message head over {self.max_head} bytes")
        return None

    def _line(self, line: str) -> None:
        """A complete, non-empty head line (line ending removed), in order.

        The base class only buffers; the whole head is parsed at the end.
        """


# --------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------


@dataclass
class Request(_HeaderAccess):
    """A parsed request head.

    ``target`` is the request-target as sent (``/stream?x=1``); ``path`` is
    its percent-decoded path and ``query`` its query string (for a repeated
    key, the last value wins). Header names are lowercased; values have
    surrounding whitespace removed.
    """

    method: str
    target: str
    path: str
    query: dict[str, str]
    version: str
    headers: list[tuple[str, str]]

    def is_chunked(self) -> bool:
        """Whether the body is sent with ``Transfer-Encoding: chunked``."""
        return "chunked" in list_tokens(self.header("transfer-encoding"))


class _RequestLines:
    """Reads a request head one line at a time, refusing a bad line at once.

    The request line is judged as soon as it is complete: an HTTP/0.9-style
    ``GET /`` or any other malformed line is refused before a single header
    arrives (a client that sent one will never send the blank line we would
    otherwise wait for). Each header line is judged when it is complete too:
    control characters, obsolete line folding, whitespace before the colon,
    a second ``Host``. Only what needs the whole head (a missing ``Host``,
    the body framing) waits for its end. ``RequestHeadParser`` and
    ``parse_request_head`` both go through here, so they refuse the same
    heads with the same status.
    """

    def __init__(self, max_headers: int) -> None:
        self.max_headers = max_headers
        self.start: tuple[str, str, str] | None = None
        self.headers: list[tuple[str, str]] = []

    def add(self, line: str) -> None:
        check_line_bytes(line, 400)
        if self.start is None:
            self.start = _parse_request_line(line)
            return
        if len(self.headers) >= self.max_headers:
            raise HTTPError(431, f"more than {self.max_headers} header fields")
        name, value = parse_header_line(line, 400)
        if name == "host":
            # RFC 9112 section 3.2: a server MUST answer 400 to more than one
            # Host line, or to a Host whose value is not a valid host[:port].
            if any(key == "host" for key, _ in self.headers):
                raise HTTPError(400, "more than one Host header")
            if not _HOST.fullmatch(value):
                raise HTTPError(400, f"invalid Host header {value[:40]!r}")
        self.headers.append((name, value))

    def finish(self) -> Request:
        if self.start is None:
            raise HTTPError(400, "empty message head")
        method, target, version = self.start
        raw_path, _, raw_query = target.partition("?")
        request = Request(
            method=method,
            target=target,
            path=unquote(raw_path, errors="replace"),
            query=dict(parse_qsl(raw_query, keep_blank_values=True)),
            version=version,
            headers=self.headers,
        )
        _check_request_framing(request)
        return request


def parse_request_head(head: bytes, *, max_headers: int = 100) -> Request:
    """Parse a complete request head (start line + header lines) into a ``Request``."""
    lines = head.decode("latin-1").split("\n")
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    while lines and lines[-1] == "":
        lines.pop()  # the empty line(s) that terminated the head
    reader = _RequestLines(max_headers)
    for line in lines:
        reader.add(line)
    return reader.finish()


def _parse_request_line(line: str) -> tuple[str, str, str]:
    """``METHOD SP request-target SP HTTP-version``, single spaces, nothing else.

    RFC 9112 section 3 lets a recipient accept other whitespace as the
    separator; we do not, since two parsers that split the line differently
    see different targets. A line of two parts is an HTTP/0.9 request
    (``GET /``), which has no headers and no version: refused with 400.
    """
    parts = line.split(" ")
    if len(parts) != 3:
        raise HTTPError(400, f"malformed request line {line[:80]!r}")
    method, target, version = parts
    if not TOKEN.fullmatch(method):
        raise HTTPError(400, f"invalid method {method[:20]!r}")
    if not _VERSION.fullmatch(version):
        raise HTTPError(400, f"malformed HTTP version {version[:20]!r}")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise HTTPError(505, f"{version} not supported")
    # Origin-form only: this server is not a forward proxy (absolute-form),
    # has no CONNECT (authority-form) and no "OPTIONS *" (asterisk-form).
    if not target.startswith("/"):
        raise HTTPError(400, f"request target must start with '/': {target[:80]!r}")
    if not all("\x21" <= c <= "\x7e" for c in target):
        raise HTTPError(400, "invalid character in request target")
    return method, target, version


def _check_request_framing(request: Request) -> None:
    """Refuse requests without a Host, or whose body length could be read two ways."""
    hosts = request.header_values("host")
    if request.version == "HTTP/1.1" and not hosts:
        # RFC 9112 section 3.2: a server MUST answer 400 here.
        raise HTTPError(400, "HTTP/1.1 request needs a Host header")
    if len(hosts) > 1:  # refused line by line already (_RequestLines); checked again here
        raise HTTPError(400, "more than one Host header")
    transfer_coding = request.header("transfer-encoding")
    if transfer_coding is not None:
        codings = list_tokens(transfer_coding)
        if request.version == "HTTP/1.0":
            # RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding
            # MUST be treated as having faulty framing, even with a
            # Content-Length (HTTP/1.0 had no chunked: a 1.0 proxy in front of
            # us would have read this body some other way).
            raise HTTPError(400, "Transfer-Encoding in an HTTP/1.0 request")
        if not codings or codings[-1] != "chunked" or codings.count("chunked") > 1:
            # RFC 9112 section 6.3: with chunked not the final coding the body's
            # length cannot be known, and the server MUST answer 400 and close.
            # Chunked twice (section 6.1: a sender MUST NOT) is read once by
            # some parsers and twice by others: the same doubt.
            raise HTTPError(400, f"body length unknown with Transfer-Encoding {transfer_coding[:40]!r}")
        if codings != ["chunked"]:
            # Chunked last, after a coding we do not decode (gzip, chunked):
            # the framing is clear, the content is not (section 6.1: 501).
            raise HTTPError(501, f"unsupported Transfer-Encoding {transfer_coding[:40]!r}")
        if request.header("content-length") is not None:
            # Both headers: a front end and a back end may each pick a
            # different one. RFC 9112 section 6.1 lets us refuse it.
            raise HTTPError(400, "both Transfer-Encoding and Content-Length")
    request.content_length()  # validates, raising 400 for bad or conflicting values


class RequestHeadParser(_HeadParser):
    """Incremental request-head parser.

    Feed it bytes as they arrive; it returns ``None`` until the head is
    complete, then the ``Request``. Bytes that came after the head (the start
    of a body, or of a pipelined request) are left in ``.rest``. One parser
    reads one head: for the next request on a keep-alive connection, make a
    new parser and feed it the leftovers first.
    """

    def __init__(self, *, max_head: int = 16384, max_headers: int = 100) -> None:
        super().__init__(max_head, max_headers)
        self._lines = _RequestLines(max_headers)

    def feed(self, data: bytes) -> Request | None:
        """Consume bytes; return the ``Request`` once its head is complete.

        Raises ``HTTPError`` as soon as a complete line is malformed, not
        only once the head is complete.
        """
        if self._feed_head(data) is None:
            return None
        return self._lines.finish()

    def _line(self, line: str) -> None:
        self._lines.add(line)


# --------------------------------------------------------------------------
# Responses: writing them
# --------------------------------------------------------------------------


def reason_phrase(status: int) -> str:
    """The standard reason phrase ("OK", "Not Found"); empty for unknown codes.

    Clients ignore the phrase; only the number matters.
    """
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def response_head(
    status: int,
    headers: Iterable[tuple[str, str]] | Mapping[str, str] = (),
    *,
    content_length: int | None = None,
    chunked: bool = False,
) -> bytes:
    """Bytes of a response head: status line, headers, empty line.

    A streaming response must declare how its body ends: a
    ``content_length`` when it is known, ``chunked=True`` when it is not
    (the usual case for SSE), or neither, in which case the body ends when
    the connection closes. Header values containing CR or LF are refused: if
    a value came from user input they would let it write extra headers, or
    a whole second response ("response splitting").
    """
    if not 100 <= status <= 999:
        raise ValueError(f"invalid status code {status}")
    if content_length is not None and chunked:
        raise ValueError("a response has either a Content-Length or chunked framing")
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    if content_length is not None:
        if content_length < 0:
            raise ValueError("negative Content-Length")
        items.append(("Content-Length", str(content_length)))
    if chunked:
        items.append(("Transfer-Encoding", "chunked"))

    lines = [f"HTTP/1.1 {status} {reason_phrase(status)}\r\n"]
    for name, value in items:
        value = str(value)
        if not TOKEN.fullmatch(name):
            raise ValueError(f"invalid header name {name!r}")
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"CR, LF or NUL in value of header {name!r}")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def _has_header(headers: Iterable[tuple[str, str]], name: str) -> bool:
    return any(key.lower() == name for key, _ in headers)


def json_response(
    status: int,
    obj: Any,
    headers: Iterable[tuple[str, str]] | Mapping[str, str] = (),
) -> bytes:
    """A complete response (head and body) carrying ``obj`` as JSON.

    The body is built first so that its exact byte length can be declared:
    with ``Content-Length`` the client knows when the answer is complete
    and the connection can be reused.
    """
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    if not _has_header(items, "content-type"):
        items.insert(0, ("Content-Type", "application/json"))
    return response_head(status, items, content_length=len(body)) + body


def error_response(
    status: int,
    message: str,
    headers: Iterable[tuple[str, str]] | Mapping[str, str] = (),
) -> bytes:
    """A JSON error, ``{"error": {"status": ..., "message": ...}}``, that closes the connection.

    After a parse error we cannot know where the next request would start
    in the byte stream, so the only safe thing is to close.
    """
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    if not _has_header(items, "connection"):
        items.insert(0, ("Connection", "close"))
    return json_response(status, {"error": {"status": status, "message": message}}, items)


# --------------------------------------------------------------------------
# Responses: reading them (client and proxy side)
# --------------------------------------------------------------------------


@dataclass
class Response(_HeaderAccess):
    """A parsed response head. Header names are lowercased."""

    status: int
    reason: str
    version: str
    headers: list[tuple[str, str]]

    _bad_status = 502  # a malformed upstream response: "Bad Gateway"


def parse_response_head(head: bytes, *, max_headers: int = 100) -> Response:
    """Parse a complete response head into a ``Response``."""
    lines = _split_head_lines(head, 502)
    match = re.fullmatch(r"(HTTP/1\.[01]) ([0-9]{3})(?: (.*))?", lines[0])
    if match is None:
        raise HTTPError(502, f"malformed status line {lines[0][:80]!r}")
    version, status, reason = match.groups()
    headers = _parse_header_lines(
        lines[1:], max_headers=max_headers, bad_status=502, too_many_status=502
    )
    return Response(int(status), reason or "", version, headers)


class ResponseHeadParser(_HeadParser):
    """Incremental response-head parser; the body's first bytes end up in ``.rest``.

    A ``100 Continue`` or other 1xx interim response is returned like any
    other; ``FinalResponseParser`` passes over them to the final response.
    """

    _bad_status = 502
    _too_large_status = 502

    def __init__(self, max_head: int = 65536, max_headers: int = 100) -> None:
        super().__init__(max_head, max_headers)

    def feed(self, data: bytes) -> Response | None:
        """Consume bytes; return the ``Response`` once its head is complete."""
        head = self._feed_head(data)
        if head is None:
            return None
        return parse_response_head(head, max_headers=self.max_headers)


def is_interim(status: int) -> bool:
    """A 1xx before the final response (``100 Continue``, ``103 Early Hints``); not 101, after which no HTTP follows."""
    return 100 <= status < 200 and status != 101


class FinalResponseParser:
    """A ``ResponseHeadParser`` that skips interim answers: ``feed`` returns the final response; its body starts ``.rest``."""

    def __init__(self, max_head: int = 65536, max_headers: int = 100) -> None:
        self._limits = (max_head, max_headers)
        self._head = ResponseHeadParser(*self._limits)

    @property
    def rest(self) -> bytes:
        return self._head.rest

    def feed(self, data: bytes) -> Response | None:
        """Consume bytes; return the final ``Response`` once its head is complete, every interim one passed over."""
        response = self._head.feed(data)
        while response is not None and is_interim(response.status):
            rest, self._head = self._head.rest, ResponseHeadParser(*self._limits)
            response = self._head.feed(rest)
        return response
