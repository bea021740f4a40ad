"""HTTP/1.1 request framing (RFC 9112): the request-smuggling shapes, as a table the parser and the server run.

Request smuggling is two programs on one connection (a proxy and a server)
reading different requests out of the same bytes: one believes the
``Content-Length``, the other the ``Transfer-Encoding``; one ends a line at
a bare CR, the other does not. RFC 9112 says, shape by shape, what a server
must answer, and where it must close the connection after answering (it
can no longer know where the next request starts). llhttp (nodejs/llhttp,
``test/request/*.md``), h11 (python-hyper/h11, ``h11/tests``) and the HTTP
Garden's findings exercise the same rules; each case here names the
section or the test file it follows.

Each case is one request, with ``HOST`` standing for the server's name, and
what must come of it: refused with a status (and the connection closed,
``closes``), or accepted, its body read whole (``body``), nothing of it
left to be read as the next request. ``run`` gives a case to the protocol
layer (``RequestHeadParser``, then ``BodyReader``) whole, split at every
byte and byte by byte; tests/test_conformance_http.py sends each to the
server, with a second request behind every accepted one, which must be
answered as the second request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from streamlab.protocol.http_body import BodyReader
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import RequestHeadParser
from streamlab.server.config import MAX_BODY

__all__ = ["BODY", "CASES", "HTTPCase", "WAYS", "parse", "run"]

BODY = b'{"prompt": "hi", "max_tokens": 1}'
WAYS = ("whole", "split at every byte", "byte by byte")


@dataclass(frozen=True)
class HTTPCase:
    id: str  # where the rule comes from: the RFC's section, or the suite and its test
    request: bytes
    status: int | None  # the refusal RFC 9112 requires; None: accepted
    closes: bool = True  # the connection must be closed after the answer (every refusal here)
    body: bytes = b""  # an accepted request's body, as read
    group: str = ""

    @property
    def accepted(self) -> bool:
        return self.status is None


POST = b"POST /complete HTTP/1.1\r\nHost: HOST\r\nContent-Type: application/json\r\n"
POST10 = b"POST /complete HTTP/1.0\r\nContent-Type: application/json\r\n"
GET = b"GET /health HTTP/1.1\r\nHost: HOST\r\n"
N = str(len(BODY)).encode()
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)


def post(headers: bytes, body: bytes = BODY, start: bytes = POST) -> bytes:
    return start + headers + b"\r\n" + body


def chunked(size_line: bytes, tail: bytes = b"\r\n0\r\n\r\n", headers: bytes = b"") -> bytes:
    """A chunked POST whose one chunk is ``BODY``, with ``size_line`` for its size line."""
    return post(b"Transfer-Encoding: chunked\r\n" + headers, size_line + b"\r\n" + BODY + tail)


def refused(id: str, request: bytes, status: int = 400) -> HTTPCase:  # noqa: A002
    return HTTPCase(id, request, status)


def accepted(id: str, request: bytes, body: bytes = BODY) -> HTTPCase:  # noqa: A002
    return HTTPCase(id, request, None, closes=False, body=body)


def _grouped(items: list) -> list[HTTPCase]:
    """The cases, each given the group named by the string before it."""
    out, group = [], ""
    for item in items:
        if isinstance(item, str):
            group = item
        else:
            out.append(dataclasses.replace(item, group=group))
    return out


HEX = b"%x" % len(BODY)
# A request hidden in a body: a server that does not read the body answers it as a request of its own.
INNER = b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
CASES: list[HTTPCase] = _grouped([
    "Content-Length, alone, twice or with Transfer-Encoding",
    refused("RFC 9112 6.1: Content-Length and Transfer-Encoding (llhttp transfer-encoding.md)",
            post(b"Content-Length: " + N + b"\r\nTransfer-Encoding: chunked\r\n", CHUNKED)),
    refused("RFC 9112 6.1: Transfer-Encoding, then Content-Length: 0 (the HTTP Garden's TE.CL)",
            post(b"Transfer-Encoding: chunked\r\nContent-Length: 0\r\n", CHUNKED)),
    accepted("RFC 9110 8.6: two Content-Length lines that agree", post(b"Content-Length: " + N + b"\r\nContent-Length: "
                                                                       + N + b"\r\n")),
    refused("RFC 9112 6.3 (5): two Content-Length lines that differ",
            post(b"Content-Length: " + N + b"\r\nContent-Length: 2\r\n")),
    accepted("RFC 9110 8.6: a Content-Length list that agrees", post(b"Content-Length: " + N + b", " + N + b"\r\n")),
    refused("RFC 9112 6.3 (5): a Content-Length list that differs", post(b"Content-Length: " + N + b", 2\r\n")),
    refused("RFC 9110 8.6: a signed Content-Length (llhttp content-length.md)", post(b"Content-Length: +" + N + b"\r\n")),
    refused("RFC 9110 8.6: a hexadecimal Content-Length", post(b"Content-Length: 0x21\r\n")),
    refused("RFC 9110 8.6: a Content-Length with a space inside (llhttp content-length.md)",
            post(b"Content-Length: 3 3\r\n")),
    refused("RFC 9110 8.6: an empty Content-Length", post(b"Content-Length: \r\n")),
    refused("RFC 9110 8.6: a Content-Length of 25 digits (llhttp content-length.md, overflow)",
            post(b"Content-Length: " + b"9" * 25 + b"\r\n")),
    refused("RFC 9110 15.5.14: a Content-Length over the server's max_body",
            post(b"Content-Length: %d\r\n" % (MAX_BODY + 1)), 413),
    "Transfer-Encoding",
    refused("RFC 9112 6.3 (4): chunked not the final coding", post(b"Transfer-Encoding: chunked, gzip\r\n", CHUNKED)),
    refused("RFC 9112 6.3 (4): a coding without chunked (llhttp transfer-encoding.md, 'pigeons')",
            post(b"Transfer-Encoding: pigeons\r\n", CHUNKED)),
    refused("RFC 9112 6.1: chunked twice, on two lines", post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: "
                                                               b"chunked\r\n", CHUNKED)),
    refused("RFC 9112 6.1: chunked twice, in one list", post(b"Transfer-Encoding: chunked, chunked\r\n", CHUNKED)),
    refused("llhttp transfer-encoding.md: 'chunkedchunked'", post(b"Transfer-Encoding: chunkedchunked\r\n", CHUNKED)),
    refused("llhttp transfer-encoding.md: chunked, then another coding on a second line",
            post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: deflate\r\n", CHUNKED)),
    refused("llhttp transfer-encoding.md: an empty Transfer-Encoding with a Content-Length",
            post(b"Transfer-Encoding:\r\nContent-Length: " + N + b"\r\n")),
    HTTPCase("RFC 9112 6.1: chunked last, after a coding we do not decode (501)",
             post(b"Transfer-Encoding: deflate, chunked\r\n", CHUNKED), 501),
    accepted("RFC 9110 7.8: the coding's name is case-insensitive", post(b"Transfer-Encoding: Chunked\r\n", CHUNKED)),
    refused("RFC 9112 6.1: an HTTP/1.0 request with Transfer-Encoding",
            post(b"Transfer-Encoding: chunked\r\n", CHUNKED, POST10)),
    refused("RFC 9112 6.1: an HTTP/1.0 request with Transfer-Encoding and Content-Length",
            post(b"Transfer-Encoding: chunked\r\nContent-Length: " + N + b"\r\n", CHUNKED, POST10)),
    accepted("RFC 9112 6.3 (6): an HTTP/1.0 request with a Content-Length", post(b"Content-Length: " + N + b"\r\n",
                                                                                  start=POST10)),
    "field syntax: colons, folds, bare CR and LF, NUL",
    refused("RFC 9112 5.1: a space before the colon", post(b"Transfer-Encoding : chunked\r\n", CHUNKED)),
    refused("RFC 9112 5.1: a tab before the colon", post(b"Content-Length\t: " + N + b"\r\n")),
    refused("RFC 9112 5.2: obs-fold (llhttp transfer-encoding.md, after chunked)",
            post(b"Transfer-Encoding: chunked\r\n  abc\r\n", CHUNKED)),
    refused("RFC 9112 2.2: whitespace before the first header line",
            post(b" Transfer-Encoding: chunked\r\nContent-Length: " + N + b"\r\n", CHUNKED)),
    refused("RFC 9112 2.2: a bare CR inside a header value", post(b"X-A: a\rb\r\nContent-Length: " + N + b"\r\n")),
    refused("RFC 9112 2.2: a bare CR ending a header line", post(b"X-A: a\rContent-Length: " + N + b"\r\n")),
    accepted("RFC 9112 2.2: bare LF line endings (a recipient MAY accept them)",
             b"POST /complete HTTP/1.1\nHost: HOST\nContent-Type: application/json\nContent-Length: " + N + b"\n\n" + BODY),
    refused("RFC 9110 5.5: a NUL in a header value", post(b"X-A: a\0b\r\nContent-Length: " + N + b"\r\n")),
    refused("RFC 9110 5.1: a header line without a colon", post(b"X-A\r\nContent-Length: " + N + b"\r\n")),
    refused("RFC 9110 5.1: an empty header name", post(b": x\r\nContent-Length: " + N + b"\r\n")),
    refused("RFC 9110 5.1: a DEL in a header name", post(b"X\x7fA: b\r\nContent-Length: " + N + b"\r\n")),
    accepted("RFC 9110 5.5: obs-text (bytes 0x80-0xFF) in a value", post(b"X-A: caf\xe9\r\nContent-Length: " + N
                                                                        + b"\r\n")),
    "the request line",
    refused("RFC 9112 3: two spaces in the request line", b"GET  /health HTTP/1.1\r\nHost: HOST\r\n\r\n"),
    refused("RFC 9112 3: a space after the version (llhttp invalid.md)", b"GET /health HTTP/1.1 \r\nHost: HOST\r\n\r\n"),
    refused("RFC 9112 2.3: the version is case-sensitive", b"GET /health http/1.1\r\nHost: HOST\r\n\r\n"),
    refused("RFC 9112 2.3: a version of two digits", b"GET /health HTTP/1.10\r\nHost: HOST\r\n\r\n"),
    HTTPCase("RFC 9110 15.6.6: HTTP/2.0 over HTTP/1.1's syntax (505)", b"GET /health HTTP/2.0\r\nHost: HOST\r\n\r\n", 505),
    refused("RFC 9112 3: an HTTP/0.9 request line", b"GET /health\r\n\r\n"),
    refused("RFC 9112 3.2: a NUL in the target", b"GET /hea\0lth HTTP/1.1\r\nHost: HOST\r\n\r\n"),
    "Host",
    refused("RFC 9112 3.2: HTTP/1.1 without Host", b"GET /health HTTP/1.1\r\n\r\n"),
    refused("RFC 9112 3.2: two Host lines", b"GET /health HTTP/1.1\r\nHost: HOST\r\nHost: HOST\r\n\r\n"),
    refused("RFC 9112 3.2: a Host with two values", b"GET /health HTTP/1.1\r\nHost: HOST, HOST\r\n\r\n"),
    accepted("RFC 9112 3.2: HTTP/1.0 without Host", b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", b""),
    "chunked bodies: sizes, extensions, trailers",
    refused("RFC 9112 7.1: a chunk size with 0x", chunked(b"0x" + HEX)),
    refused("RFC 9112 7.1: a signed chunk size", chunked(b"+" + HEX)),
    accepted("RFC 9112 7.1: a chunk size with leading zeros (llhttp: triple zero end chunk)",
             chunked(b"0000000" + HEX, b"\r\n000\r\n\r\n")),
    refused("RFC 9112 7.1: a chunk size over 64 bits (h11 test_io: oversized chunk)", chunked(b"f" * 20), 413),
    accepted("RFC 9112 7.1.1: chunk extensions (llhttp transfer-encoding.md)", chunked(HEX + b";ilovew3;a=b ; c = d")),
    accepted("RFC 9112 7.1.1: a quoted extension value holding ; and \\\" (llhttp)",
             chunked(HEX + b';a="I \\"love\\"; ext"')),
    refused("llhttp transfer-encoding.md: no semicolon before the extension", chunked(HEX + b" erfrferferf")),
    refused("llhttp transfer-encoding.md: no extension after the semicolon", chunked(HEX + b";")),
    refused("llhttp transfer-encoding.md: an unbalanced quote in an extension", chunked(HEX + b';a="def; ghi')),
    refused("llhttp transfer-encoding.md: a space after the chunk size", chunked(HEX + b" ")),
    refused("RFC 9112 2.2: a bare CR in a chunk size line (llhttp: not terminated by CRLF)", chunked(HEX + b"\r;ABCD")),
    refused("RFC 9112 7.1: chunk data longer than its size (llhttp: data not terminated by CRLF)",
            chunked(HEX, b"X\r\n0\r\n\r\n")),
    refused("RFC 9112 7.1: the last chunk missing (llhttp transfer-encoding.md)", chunked(HEX, b"\r\n\r\n")),
    accepted("RFC 9112 7.1.2: trailer fields (llhttp: trailing headers)",
             chunked(HEX, b"\r\n0\r\nVary: *\r\nX-Checksum: abc\r\n\r\n")),
    refused("RFC 9112 7.1.2: a trailer field with a space before its colon", chunked(HEX, b"\r\n0\r\nVary : *\r\n\r\n")),
    accepted("RFC 9112 2.2: bare LF in the chunked framing, accepted as in the head",
             post(b"Transfer-Encoding: chunked\r\n", HEX + b"\n" + BODY + b"\n0\n\n")),
    "a body the route does not read",
    accepted("RFC 9112 6.3: a GET with a Content-Length body: it is not the next request (HTTP Garden: CL.0)",
             GET + b"Content-Length: %d\r\n\r\n%s" % (len(INNER), INNER), INNER),
    accepted("RFC 9112 6.3: a GET with a chunked body: the body is not the next request",
             GET + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(INNER), INNER), INNER),
])


def parse(request: bytes, pieces: list[bytes]) -> tuple[int | None, bytes, bytes]:
    """``(refusal status or None, body, bytes left after the request)`` as the protocol layer reads ``pieces``."""
    parser = RequestHeadParser()
    head, body, reader = None, [], None
    try:
        for piece in pieces:
            if reader is None:
                head = parser.feed(piece)
                if head is None:
                    continue
                reader = BodyReader.for_request(head, max_body=MAX_BODY)
                piece = parser.rest
            body += reader.feed(piece)
    except HTTPError as err:
        return err.status, b"", b""
    if reader is None or not reader.done:
        return -1, b"", b""  # still waiting for more: a server would wait too
    return None, b"".join(body), reader.rest


def pieces_of(data: bytes, way: str) -> list[list[bytes]]:
    if way == "whole":
        return [[data]]
    if way == "byte by byte":
        return [[data[i:i + 1] for i in range(len(data))]]
    return [[data[:cut], data[cut:]] for cut in range(len(data) + 1)]


def run(case: HTTPCase, way: str, host: bytes = b"127.0.0.1") -> list[str]:
    """What the protocol layer got wrong reading ``case`` that way, with a second request behind it (empty: nothing)."""
    after = b"GET /health HTTP/1.1\r\nHost: HOST\r\n\r\n"
    data = (case.request + after).replace(b"HOST", host)
    for pieces in pieces_of(data, way):
        status, body, rest = parse(data, pieces)
        if status != case.status:
            return [f"{way}: {'accepted' if status is None else status}, not {case.status or 'accepted'}"]
        if case.accepted and (body, rest) != (case.body, after.replace(b"HOST", host)):
            return [f"{way}: body {body[:40]!r} and then {rest[:40]!r}"]
    return []
