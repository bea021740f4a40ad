"""One accepted TCP connection of the model server.

The I/O layer is thin on purpose: bytes are read here with a deadline and
written here with a timeout, and everything they mean is decided by the
sans-IO modules (``http``, ``sse``, ``websocket``). ``ClientGone`` and
``serve_until_signalled`` live in ``streamlab.net.serving``, which the
proxy shares; they are imported here so older imports keep working.
"""

from __future__ import annotations

import asyncio
import socket
import time
from contextlib import asynccontextmanager, suppress
from typing import Any, AsyncIterator, Awaitable, Callable

from streamlab.net.serving import ClientGone
from streamlab.protocol.http_body import BodyReader
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import Request, RequestHeadParser
from streamlab.protocol.endings import CONNECTION_LOST, EOF, WRITE_FAILED, WRITE_TIMEOUT
from streamlab.server.config import IDLE_TIMEOUT, LINGER_SECONDS, MAX_BODY, MAX_HEAD, READ_SIZE, flag

KEEPALIVE_PROBES = 3  # unanswered keep-alive probes before the kernel drops the connection


def tune_socket(sock: socket.socket, *, user_timeout: float = 0.0, keepalive: float = 0.0) -> None:
    """Ask the kernel to give up on a peer that went silent: ``TCP_USER_TIMEOUT`` and TCP keep-alive.

    A client whose network vanished (a phone asleep, out of signal) sends
    no FIN and no RST: the connection looks open until TCP's retransmissions
    run out, fifteen of them by default (``tcp_retries2``), some fifteen
    minutes. ``user_timeout`` bounds how long sent bytes may go
    unacknowledged before the kernel drops the connection; ``keepalive``
    probes a connection silent that long (every third of it, ``KEEPALIVE_PROBES``
    times), which catches a silent peer when nothing is being sent. 0 leaves
    the kernel's default. Linux names both; elsewhere what exists is set.
    """
    if user_timeout > 0 and hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(user_timeout * 1000))
    if keepalive > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle, interval = max(1, round(keepalive)), max(1, round(keepalive / 3))
        for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def named_limit(call: Callable[..., Any], *args: Any, status: int = 0, setting: str = "", **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``; a refusal with ``status`` at the size limit names the flag that raises it.

    Only a refusal counted in bytes is that limit's (431 also refuses too
    many header fields, which no flag changes).
    """
    try:
        return call(*args, **kwargs)
    except HTTPError as err:
        if err.status != status or "bytes" not in err.message:
            raise
        raise HTTPError(status, f"{err.message} ({flag(setting)} raises the limit)") from None


class ClientConnection:
    """An accepted connection: buffered reads with deadlines, writes bounded by a timeout.

    ``buffer`` holds bytes read but not yet parsed: the start of a body after
    its head, or a next request that a keep-alive client sent early.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, write_timeout: float, *,
        tcp_user_timeout: float = 0.0, tcp_keepalive: float = 0.0,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.write_timeout = write_timeout
        self.lost: str | None = None  # CONNECTION_LOST once a read failed: the kernel gave up on the peer
        self.buffer = b""
        self.bytes_sent = 0
        self.sent_before_request = 0  # bytes_sent when the current request's head was read
        self.unread_body: Request | None = None  # the current request, while its body is not read
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Send each small write at once. Nagle's algorithm would hold a
            # 20-byte event back until the previous one is acknowledged.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tune_socket(sock, user_timeout=tcp_user_timeout, keepalive=tcp_keepalive)

    async def read(self, timeout: float | None = None) -> bytes:
        """The next bytes from the client (``b""`` at EOF), buffered ones first."""
        if self.buffer:
            data, self.buffer = self.buffer, b""
            return data
        return await asyncio.wait_for(self.reader.read(READ_SIZE), timeout)

    async def _read_by(self, deadline: float, what: str) -> bytes:
        """Read before ``deadline`` (a ``time.monotonic()``), else 408: a client that trickles is cut."""
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise asyncio.TimeoutError
            return await self.read(left)
        except asyncio.TimeoutError:
            raise HTTPError(408, f"the request {what} took too long ({flag(what + '_timeout')})") from None

    async def read_head(
        self, *, idle_timeout: float = IDLE_TIMEOUT, head_timeout: float = 10.0, max_head: int = MAX_HEAD
    ) -> Request | None:
        """The next request head, or None when the client closes (or idles) between requests.

        Two clocks: waiting for a request to *begin* may last ``idle_timeout``
        (a kept-alive connection between requests); once its first byte is
        here, the whole head must arrive within ``head_timeout``, however
        slowly it trickles (a slowloris sends one byte every few seconds and
        would otherwise hold the connection for ever).
        """
        if self.unread_body is not None and not await self._skip_body(self.unread_body):
            return None
        # A new request: nothing of its answer is sent yet, so a malformed head still gets its 400.
        self.sent_before_request = self.bytes_sent
        parser = RequestHeadParser(max_head=max_head)
        try:
            data = await self.read(idle_timeout)
        except asyncio.TimeoutError:
            return None
        deadline = time.monotonic() + head_timeout
        while True:
            if not data:
                return None
            request = named_limit(parser.feed, data, status=431, setting="max_head")
            if request is not None:
                self.buffer = parser.rest
                self.sent_before_request = self.bytes_sent
                self.unread_body = request
                return request
            data = await self._read_by(deadline, "head")

    async def _skip_body(self, request: Request, *, timeout: float = 10.0) -> bool:
        """Read past a body its handler never read (a GET with a Content-Length); False: close instead.

        Its bytes are the request's, whether the route wanted them or not:
        read as the start of the next request, they would be a request the
        client never sent (request smuggling, RFC 9112 section 6.3). One too
        large, too slow or malformed closes the connection.
        """
        self.unread_body = None
        try:
            body = BodyReader.for_request(request, max_body=MAX_BODY)
            if body.done:
                return True
            deadline = time.monotonic() + timeout
            body.feed(self.buffer)
            self.buffer = b""
            while not body.done:
                data = await self._read_by(deadline, "body")
                if not data:
                    return False
                body.feed(data)
        except (HTTPError, ConnectionError):
            return False
        self.buffer = body.rest
        return True

    async def read_body(self, request: Request, *, max_body: int = MAX_BODY, timeout: float = 10.0) -> bytes:
        """The whole request body within ``timeout``; a too-large ``Content-Length`` is refused before reading."""
        self.unread_body = None
        # A Content-Length past the limit is refused right here, before a byte of the body is read.
        body = named_limit(BodyReader.for_request, request, status=413, setting="max_body", max_body=max_body)
        if body.done:
            return b""
        if (request.header("expect") or "").lower() == "100-continue":
            # curl waits for this before sending a body over 1 KiB.
            await self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        deadline = time.monotonic() + timeout
        parts = named_limit(body.feed, self.buffer, status=413, setting="max_body")
        self.buffer = b""
        while not body.done:
            data = await self._read_by(deadline, "body")
            if not data:
                raise ClientGone(EOF)
            parts += named_limit(body.feed, data, status=413, setting="max_body")
        self.buffer = body.rest
        return b"".join(parts)

    async def send(self, data: bytes) -> None:
        """Write and wait until the kernel took the bytes, at most ``write_timeout`` seconds.

        ``drain`` waits only when asyncio's buffer is full, i.e. when the
        client stopped reading long enough to fill its socket buffers. A
        client that vanished without closing never sends EOF or a reset: this
        timeout is the only way to notice it.

        So while the buffer is at or below its low-water mark (nearly always:
        most writes go to the kernel whole, at once) writing is not paused,
        ``drain`` has nothing to wait for, and no ``wait_for`` is paid: a task
        and a timer for every event, a fifth of the server's CPU per event at
        300 streams in chapter 11's benchmark. A write that fails at once
        closes the transport: that is a write failed, as ``drain`` would have
        said.
        """
        transport = self.writer.transport
        if transport.is_closing():
            raise ClientGone(self._why_closed())
        self.writer.write(data)
        if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[0]:
            if transport.is_closing():
                raise ClientGone(self._why_closed())
            self.bytes_sent += len(data)
            return
        try:
            await asyncio.wait_for(self.writer.drain(), self.write_timeout or None)
        except asyncio.TimeoutError:
            self.writer.transport.abort()
            raise ClientGone(WRITE_TIMEOUT) from None
        except ConnectionError:
            raise ClientGone(WRITE_FAILED) from None
        self.bytes_sent += len(data)

    def _why_closed(self) -> str:
        """Why a write found the transport closed: the kernel gave up on a silent peer (``ETIMEDOUT`` once
        ``tune_socket``'s bounds ran out: ``CONNECTION_LOST``, whichever of the reader and the writer met it
        first), else a write that failed."""
        failed = self.reader.exception() if isinstance(self.reader, asyncio.StreamReader) else None
        if self.lost == CONNECTION_LOST or isinstance(failed, TimeoutError):  # ETIMEDOUT, not any other OSError
            return CONNECTION_LOST
        return WRITE_FAILED

    @property
    def responding(self) -> bool:
        """Whether the response to the current request has begun: then an error can only cut it."""
        return self.bytes_sent > self.sent_before_request

    def send_nowait(self, data: bytes) -> None:
        """Queue a small write (a pong) without waiting; the next ``send`` drains it."""
        if not self.writer.transport.is_closing():
            self.writer.write(data)
            self.bytes_sent += len(data)

    async def watch_for_eof(self, on_eof: Callable[[], None]) -> None:
        """Read until EOF, then call ``on_eof``: the client closed its end, nobody is reading.

        Bytes that arrive meanwhile are kept: they are a keep-alive client's
        next request, not a goodbye. A reset means the same; so does the
        kernel's ``ETIMEDOUT`` once ``tune_socket``'s bounds ran out, said
        in ``lost`` (``CONNECTION_LOST``) for whoever records why.
        """
        while len(self.buffer) <= MAX_HEAD + MAX_BODY:
            try:
                data = await self.reader.read(READ_SIZE)
            except ConnectionError:  # a reset: the client's end is gone, as at EOF
                data = b""
            except OSError:  # ETIMEDOUT (TimeoutError): the kernel gave up on a peer that went silent
                self.lost, data = CONNECTION_LOST, b""
            if not data:
                on_eof()
                return
            self.buffer += data

    async def linger_and_close(self) -> None:
        """Close after an error response without destroying it.

        Closing a socket with unread bytes in its receive buffer makes the
        kernel send a reset, which can discard our response before the client
        reads it. So: stop writing, read and drop for a moment, then close
        (nginx calls this a lingering close).
        """
        with suppress(OSError, RuntimeError, asyncio.TimeoutError):
            if self.writer.can_write_eof():
                self.writer.write_eof()
            deadline = time.monotonic() + LINGER_SECONDS
            while (left := deadline - time.monotonic()) > 0:
                if not await asyncio.wait_for(self.reader.read(READ_SIZE), left):
                    break
        await self.close()

    async def close(self) -> None:
        self.writer.close()
        with suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)

    def abort(self) -> None:
        self.writer.transport.abort()


@asynccontextmanager
async def in_background(coroutine: Any) -> AsyncIterator[None]:
    """Run ``coroutine`` as a task for the duration of the ``with`` block, then cancel it."""
    task = asyncio.create_task(coroutine)
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


async def until_client_leaves(client: ClientConnection, work: Awaitable[None]) -> bool:
    """Run ``work`` while watching for EOF; cancel it when the client leaves. True if it finished."""
    task = asyncio.ensure_future(work)
    left = False

    def on_eof() -> None:
        nonlocal left
        left = True
        task.cancel()

    async with in_background(client.watch_for_eof(on_eof)):
        try:
            await task
        except asyncio.CancelledError:
            if not left:  # we are being cancelled ourselves (server shutdown)
                raise
    return not left
