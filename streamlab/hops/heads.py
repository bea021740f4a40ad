"""What crosses the proxy in the heads, and what does not: pure functions over parsed heads.

A proxy holds two connections, and the headers that describe a connection
rather than the message must not be copied from one to the other; what it
adds (``X-Forwarded-For``, ``Connection: close``, the mode it chose) is the
proxy's own account of itself. Kept apart from the forwarding loop so the
tests can check every rule on a head written out by hand.
"""

from __future__ import annotations

from collections.abc import Iterable

from streamlab.protocol.http_head import Request, Response, response_head

__all__ = ["HOP_BY_HOP", "client_response_head", "is_upgrade", "upstream_request_head"]

# Hop-by-hop headers (RFC 9110 section 7.6.1) describe one connection, not
# the message: a proxy has two connections and must not copy them from one
# to the other. A header named in ``Connection`` is hop-by-hop too.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)


def _hop_by_hop(headers: Iterable[tuple[str, str]]) -> set[str]:
    named = {
        token.strip().lower()
        for name, value in headers
        if name == "connection"
        for token in value.split(",")
    }
    return set(HOP_BY_HOP) | named


def _title(name: str) -> str:
    """``x-accel-buffering`` -> ``X-Accel-Buffering``: names are case-insensitive, this is for people."""
    return "-".join(part.capitalize() for part in name.split("-"))


def is_upgrade(request: Request) -> bool:
    """Whether the client asks to switch protocols (a WebSocket handshake)."""
    connection = {t.strip().lower() for t in (request.header("connection") or "").split(",")}
    return "upgrade" in connection and request.header("upgrade") is not None


def upstream_request_head(
    request: Request, body_length: int, *, client_ip: str, upstream: str
) -> bytes:
    """The request as the upstream sees it.

    ``Host`` is kept as the reader sent it, so the server sees the name the
    reader used (nginx by default sends its upstream's address instead),
    and checks it: a loopback name passes, whatever its port;
    ``X-Forwarded-For`` gains the reader's address, the one thing the
    server can no longer see for itself. The body, read whole and
    de-chunked, goes with a ``Content-Length``. ``Connection: close``: one
    request per upstream connection, so closing it is an unambiguous "the
    reader left" for the server. A WebSocket handshake keeps its
    ``Upgrade``, which is what that request is about.
    """
    drop = _hop_by_hop(request.headers) | {"content-length", "expect", "x-forwarded-for"}
    headers = [(_title(name), value) for name, value in request.headers if name not in drop]
    if request.header("host") is None:  # HTTP/1.0 clients may omit it
        headers.insert(0, ("Host", upstream))
    forwarded = request.header_values("x-forwarded-for") + [client_ip]
    headers.append(("X-Forwarded-For", ", ".join(forwarded)))
    if body_length or request.content_length() is not None or request.is_chunked():
        headers.append(("Content-Length", str(body_length)))
    if is_upgrade(request):
        headers += [("Connection", "Upgrade"), ("Upgrade", request.header("upgrade") or "")]
    else:
        headers.append(("Connection", "close"))
    lines = [f"{request.method} {request.target} HTTP/1.1"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def client_response_head(response: Response, label: str, extra: Iterable[tuple[str, str]] = ()) -> bytes:
    """The upstream's head as this proxy re-frames it for its client.

    The body is written de-chunked and ends when the connection closes
    (``Connection: close``, no ``Transfer-Encoding``); a ``Content-Length``
    survives only if no chunked framing overrode it. ``X-Streamlab-Proxy``
    says which mode the proxy chose. ``X-Accel-Buffering`` is passed on
    (nginx hides it) so a reader can see that the server asked. ``extra``
    are the forwarder's own (``Content-Encoding: gzip``; ``Transfer-Encoding:
    chunked`` from a forwarder that frames the body itself), which also
    drop any length: the body changes size on the way.
    """
    extra = list(extra)
    drop = _hop_by_hop(response.headers)
    if response.header("transfer-encoding") is not None or extra:
        drop.add("content-length")
    drop |= {name.lower() for name, _ in extra}
    headers = [(_title(name), value) for name, value in response.headers if name not in drop] + extra
    if response.status == 101:
        headers += [("Connection", "Upgrade"), ("Upgrade", response.header("upgrade") or "")]
    else:
        headers.append(("Connection", "close"))
    headers.append(("X-Streamlab-Proxy", label))
    return response_head(response.status, headers)
