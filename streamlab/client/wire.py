"""The timing client's side of the wire: connecting, reading against a deadline, the request bytes.

Every request names the server as ``Host: 127.0.0.1:PORT`` (or whatever
``host`` it connected to) and every POST says ``Content-Type:
application/json``; the helpers here are where those rules are kept, so
that ``streamlab.client.timed`` (HTTP) and ``streamlab.client.timed_websocket``
(the WebSocket) write and read alike without importing each other.
``TCP_NODELAY`` is set on every connection: the client's small writes must
leave at once, or the times it records would include Nagle's wait.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

__all__ = ["post_request", "request_body"]


def request_body(
    prompt: str,
    max_tokens: int = 100,
    *,
    seed: int | None = None,
    chat: bool | None = None,
    ignore_eos: bool | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The request JSON; fields left at None are left to the server's defaults."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens}
    for name, value in (("seed", seed), ("chat", chat), ("ignore_eos", ignore_eos)):
        if value is not None:
            body[name] = value
    body.update(extra or {})
    return body


# --------------------------------------------------------------------------
# Socket helpers
# --------------------------------------------------------------------------


async def _connect(host: str, port: int, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    connecting = asyncio.open_connection(host.strip("[]"), port)
    reader, writer = await asyncio.wait_for(connecting, timeout)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # our small writes go out at once
    return reader, writer


async def _recv(reader: asyncio.StreamReader, size: int, until: float) -> bytes | None:
    """One read; None when ``until`` (a ``perf_counter`` time) passes first."""
    left = until - time.perf_counter()
    if left <= 0:
        return None
    try:
        return await asyncio.wait_for(reader.read(size), left)
    except asyncio.TimeoutError:
        return None
    except ConnectionError:
        return b""


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 2.0)
    except (OSError, asyncio.TimeoutError):
        pass


def _host_header(host: str, port: int) -> str:
    """The ``Host`` value for ``host:port``; an IPv6 literal goes in brackets (``[::1]:8000``)."""
    name = host.strip("[]")
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


def _head(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# --------------------------------------------------------------------------
# The request a POST writes
# --------------------------------------------------------------------------


def post_request(
    port: int,
    path: str,
    body: dict[str, Any],
    *,
    host: str = "127.0.0.1",
    http10: bool = False,
    headers: list[tuple[str, str]] | None = None,
) -> bytes:
    """The bytes of a JSON POST as this client writes it: the head, then ``body`` as UTF-8 JSON.

    ``Host`` names the server, ``Content-Type: application/json`` (a server
    refuses a POST without it, 415), ``Content-Length``, ``Connection: close``;
    then ``headers`` (``Accept-Encoding: gzip``, as a browser sends).
    """
    payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
    head = _head([
        f"POST {path} {'HTTP/1.0' if http10 else 'HTTP/1.1'}",
        f"Host: {_host_header(host, port)}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers or ()),
    ])
    return head + payload
