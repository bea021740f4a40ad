"""HTTP field syntax shared by message heads and chunked trailers (RFC 9110 section 5).

A header line and a trailer line follow the same rules (``Name: value``, the
name a token, no control characters in the value), and both are refused with
the same ``HTTPError``. They live here so that ``streamlab.protocol.http_head`` (heads) and
``streamlab.protocol.http_body`` (bodies, whose chunked trailers are fields too) share
one definition without importing each other.

Lines are handled as ISO-8859-1 (latin-1) text: HTTP field bytes are octets,
latin-1 maps each byte to exactly one character, so nothing is lost and no
decoding error can occur.
"""

from __future__ import annotations

import re

__all__ = [
    "TOKEN",
    "HTTPError",
    "check_line_bytes",
    "list_tokens",
    "parse_header_line",
]


class HTTPError(Exception):
    """Input we refuse, with the status a server should answer with.

    Request-side problems carry 4xx/5xx codes meant for the client (400 bad
    syntax, 413 body too large, 431 head too large, 501 unsupported
    transfer coding, 505 unsupported version). A malformed *response* from
    an upstream server is reported as 502 Bad Gateway, which is what a proxy
    would answer its own client.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message


# token = 1*tchar: the characters allowed in methods and header names.
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Control characters other than HTAB may not appear in a header value.
_FORBIDDEN_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def check_line_bytes(line: str, bad_status: int) -> None:
    """Refuse a head line holding bytes that parsers disagree about.

    A NUL or a CR that is not part of CRLF is read as a line ending by some
    programs and as data by others. A proxy and a server that disagree about
    where a header ends can be tricked into seeing two different requests,
    so both are refused outright (RFC 9112 section 2.2 allows exactly that
    for a bare CR).
    """
    if "\0" in line:
        raise HTTPError(bad_status, "NUL byte in message head")
    if "\r" in line:
        raise HTTPError(bad_status, "bare CR in message head")


def parse_header_line(line: str, bad_status: int) -> tuple[str, str]:
    """Parse one ``Name: value`` line into ``(lowercased name, stripped value)``."""
    if line[:1] in (" ", "\t"):
        # Obsolete line folding: a continuation of the previous header (or,
        # on the first header line, whitespace after the start line). RFC
        # 9112 sections 2.2 and 5.2 let a server reject both, and old
        # proxies disagree on what they mean.
        raise HTTPError(bad_status, "obsolete line folding in header")
    name, colon, value = line.partition(":")
    if not colon:
        raise HTTPError(bad_status, f"header line without colon: {line[:40]!r}")
    if not TOKEN.fullmatch(name):
        # Also catches "Name : value": whitespace before the colon has been
        # used to smuggle a header past a proxy that strips it, and RFC 9112
        # section 5.1 says a server MUST answer it with 400.
        raise HTTPError(bad_status, f"invalid header name {name[:40]!r}")
    value = value.strip(" \t")
    if _FORBIDDEN_IN_VALUE.search(value):
        raise HTTPError(bad_status, f"control character in header {name!r}")
    return name.lower(), value


def list_tokens(value: str | None) -> list[str]:
    """The comma-separated tokens of a list header (``Connection``, ``Transfer-Encoding``)."""
    if not value:
        return []
    return [token.strip().lower() for token in value.split(",") if token.strip()]
