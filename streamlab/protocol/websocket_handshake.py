"""The WebSocket opening handshake (RFC 6455 section 4): an HTTP upgrade, checked both ways.

A WebSocket starts life as an HTTP/1.1 request that asks to *upgrade* the
connection. Once the server answers ``101 Switching Protocols``, both sides
stop speaking HTTP and exchange frames (``streamlab.protocol.websocket_frames``)
over the same TCP connection. This module writes and checks the two HTTP
messages of that exchange: the client's request and the server's answer.
Refusals the server answers in HTTP are ``HandshakeError``; a server answer
the client must fail the connection on is ``ProtocolError``.

Like the other protocol modules it never touches a socket.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable, Mapping

from streamlab.protocol.websocket_frames import ProtocolError

__all__ = [
    "GUID",
    "HandshakeError",
    "accept_key",
    "check_server_response",
    "client_handshake",
    "new_key",
    "server_handshake_response",
    "validate_upgrade_request",
]

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

