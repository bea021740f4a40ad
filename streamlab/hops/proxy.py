"""A buffering reverse proxy: the hop between the server and the reader.

Between a streaming server and its reader there is often a reverse proxy
(nginx, a load balancer, a CDN), and many of them *buffer*: they collect the
response and pass it on in large pieces. That is efficient for a web page and
ruinous for a stream: the reader sees nothing until a block fills or the
answer ends. This proxy is the worst such hop, on purpose: it forwards a
body only in whole blocks of ``--block`` bytes. With ``--honor`` it obeys
the header nginx obeys, ``X-Accel-Buffering: no``, and passes every byte on
as soon as it arrives.

It also does what a well-behaved proxy must do for streams:

- it passes the reader's departure on: when the client closes its
  connection, the upstream connection is closed at once, so the server can
  stop generating;
- with ``--idle-timeout`` it cuts a connection that brought no upstream
  bytes for that long, as cloud load balancers do: a stream that sends
  ``: ping`` comments survives, a silent one dies;
- it logs every request (``GET /_proxy/log``), so an experiment can check
  what the proxy did instead of guessing.

The other hops of chapter 12 are options of this one forwarding loop, not
copies of it: ``--gzip`` compresses like a middleware (``compress.py``),
and ``python -m streamlab platform`` (``platform.py``) runs it as a
function platform: an execution limit on the whole exchange, a runtime
that may buffer the whole response, a bill per request.

The decisions (which headers pass, which mode, where blocks end) are pure
functions and classes; the asyncio part only moves bytes between them. One
request per connection: both sides get ``Connection: close``, which keeps
the bookkeeping obvious and makes a closed connection mean one thing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from streamlab.protocol import sse
from streamlab.hops.compress import GZIP_MODES, Gzip, accepts_gzip, no_transform

from streamlab.protocol.http_head import (
    BodyReader,
    HTTPError,
    IncompleteBody,
    Request,
    RequestHeadParser,
    Response,
    ResponseHeadParser,
    error_response,
    json_response,
    response_head,
)
from streamlab.server.connection import ClientGone, serve_until_signalled
from streamlab.protocol.endings import WRITE_FAILED

__all__ = [
    "DEFAULT_BLOCK",
    "EXECUTION_LIMIT",
    "LOG_PATH",
    "BlockBuffer",
    "Exchange",
    "PassThrough",
    "Proxy",
    "ProxyConfig",
    "WholeResponse",
    "choose_forwarder",
    "client_response_head",
    "cut_event",
    "forwarder_for",
    "is_upgrade",
    "main",
    "serve_proxy",
    "upstream_request_head",
]

log = logging.getLogger("streamlab.hops.proxy")

DEFAULT_BLOCK = 8192  # the original write-up's block; nginx's buffers are a page (4 or 8 KiB)
LOG_PATH = "/_proxy/log"  # answered by the proxy itself, never forwarded
MAX_BODY = 1 << 20  # the largest request body we forward
HEAD_TIMEOUT = 30.0  # seconds a client may take to send its request
CONNECT_TIMEOUT = 10.0
READ_SIZE = 65536

# Hop-by-hop headers (RFC 9110 section 7.6.1) describe one connection, not
# the message: a proxy has two connections and must not copy them from one
# to the other. A header named in ``Connection`` is hop-by-hop too.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)


# --------------------------------------------------------------------------
# The two ways to forward a body (pure: bytes in, bytes to write out)
# --------------------------------------------------------------------------


class _Holding:
    """A forwarder that holds bytes back: what it holds, and the rest handed over when the body ends."""

    def __init__(self) -> None:
        self._held = bytearray()

    @property
    def held(self) -> int:
        """Bytes received but not yet forwarded."""
        return len(self._held)

    def finish(self) -> bytes:
        """The body ended: return what is still held (maybe nothing)."""
        rest = bytes(self._held)
        self._held.clear()
        return rest


class BlockBuffer(_Holding):
    """Forward a body only in whole blocks: the worst buffering hop.

    Bytes are held until ``block`` of them are there; what is left when the
    body ends goes out with ``finish()``. An answer shorter than one block
    therefore reaches the reader in one piece, at the very end, however
    early the server sent its first word.
    """

    def __init__(self, block: int = DEFAULT_BLOCK) -> None:
        if block < 1:
            raise ValueError("block must be at least 1 byte")
        super().__init__()
        self.block = block
        self.label = f"buffering block={block}"

    def feed(self, data: bytes) -> list[bytes]:
        """Take body bytes; return the full blocks to write now (often none)."""
        self._held += data
        full = len(self._held) // self.block * self.block
        blocks = [bytes(self._held[i : i + self.block]) for i in range(0, full, self.block)]
        del self._held[:full]
        return blocks


class PassThrough:
    """Forward every byte as soon as it arrives: what ``X-Accel-Buffering: no`` asks for."""

    label = "passthrough"
    held = 0

    def feed(self, data: bytes) -> list[bytes]:
        return [bytes(data)] if data else []

    def finish(self) -> bytes:
        return b""


class WholeResponse(_Holding):
    """Hold the whole response, head included, and send it when it ends: a runtime that buffers.

    Some function runtimes collect what the handler returns and hand it to
    the platform's front door only when the handler is done: the reader's
    first event is the answer's end, whatever the handler streamed.
    """

    label = "whole response"
    holds_head = True

    def feed(self, data: bytes) -> list[bytes]:
        self._held += data
        return []


class Forwarder(Protocol):
    """What ``_relay_body`` asks of a forwarder: bytes in, bytes to write out, the rest at the end."""

    label: str

    def feed(self, data: bytes) -> list[bytes]: ...

    def finish(self) -> bytes: ...


def choose_forwarder(response: Response, *, block: int, honor: bool) -> BlockBuffer | PassThrough:
    """Pick the mode for one response, as nginx does: per response, from its head.

    Only the upstream knows that a response is a stream, so it is the one
    that asks, with ``X-Accel-Buffering: no``. Whether the proxy listens is
    its own configuration: nginx does by default, this proxy with ``--honor``.
    """
    if honor and (response.header("x-accel-buffering") or "").strip().lower() == "no":
        return PassThrough()
    return BlockBuffer(block)


def forwarder_for(request: Request, response: Response, config: ProxyConfig) -> Forwarder:
    """The forwarder for one response, every option of the proxy in one place.

    A buffering runtime holds everything; a compressing hop compresses for a
    reader that accepts gzip, a body not already encoded, unless it honours
    the server's ``Cache-Control: no-transform``; else blocks or passthrough.
    """
    if config.buffer_response:
        return WholeResponse()
    if (
        config.gzip != "off"
        and accepts_gzip(request)
        and response.header("content-encoding") is None
        and not (config.honor and no_transform(response))
    ):
        return Gzip(flush=config.gzip == "flush")
    if config.block == 1:
        return PassThrough()  # a block of one byte is no buffering: pass whole reads on, not byte by byte
    return choose_forwarder(response, block=config.block, honor=config.honor)


EXECUTION_LIMIT = "execution_limit"


def cut_event(limit: float) -> bytes:
    """The SSE event a platform that says why it cut writes last: ``event: error`` naming the limit.

    Without it, the reader sees the body simply stop, like any truncation;
    with it, a client (ours, the official SDKs) reports an error it can name.
    """
    error = {"type": EXECUTION_LIMIT, "message": f"the function ran for its limit of {limit:g} s", "limit_s": limit}
    return sse.encode_event(json.dumps({"error": error}), event="error")


# --------------------------------------------------------------------------
# Heads: what crosses the proxy, and what does not (pure)
# --------------------------------------------------------------------------


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
    are the forwarder's own (``Content-Encoding: gzip``), which also drop
    any length: the body changes size on the way.
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


# --------------------------------------------------------------------------
# The log
# --------------------------------------------------------------------------


@dataclass
class Exchange:
    """What the proxy did with one request: a row of ``GET /_proxy/log``."""

    method: str
    target: str
    status: int | None = None
    mode: str = ""  # "buffering block=N", "passthrough", "tunnel" or "error"
    upstream_bytes: int = 0  # read from the upstream, head and framing included
    client_bytes: int = 0  # written to the client, head included
    writes: int = 0  # body writes to the client: the blocks, when buffering
    first_write_s: float | None = None  # from the request to the first body write
    seconds: float = 0.0
    client_left: bool = False  # the client closed before the upstream finished
    idle_timeout: bool = False  # we cut the upstream after --idle-timeout of silence
    cut: bool = False  # the platform's execution limit ended it (--max-duration)
    error: str | None = None
    bill: dict[str, Any] | None = None  # what a platform charges for it (--memory-mb, --price-per-gb-s)

    def __post_init__(self) -> None:
        self._started = time.monotonic()  # not a field: the log shows durations, not clocks

    def wrote(self, size: int, *, body: bool) -> None:
        """Count a write to the client; remember when the first body bytes left."""
        self.client_bytes += size
        if body:
            self.writes += 1
            if self.first_write_s is None:
                self.first_write_s = round(time.monotonic() - self._started, 4)

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def finish(self) -> None:
        self.seconds = round(self.elapsed(), 4)

    def summary(self) -> str:
        notes = [f"{self.upstream_bytes} bytes in, {self.client_bytes} out, {self.writes} writes"]
        if self.client_left:
            notes.append("client left: closed upstream")
        if self.idle_timeout:
            notes.append("idle timeout: closed both")
        if self.cut:
            notes.append("execution limit: cut")
        if self.bill:
            notes.append("billed " + ", ".join(f"{k}={v}" for k, v in self.bill.items()))
        if self.error:
            notes.append(self.error)
        return f"{self.method} {self.target} -> {self.status} {self.mode} in {self.seconds:.2f} s: " + "; ".join(notes)


class _IdleTimeout(Exception):
    pass


# --------------------------------------------------------------------------
# The I/O: thin glue between sockets and the pieces above
# --------------------------------------------------------------------------


@dataclass
class ProxyConfig:
    """Where to forward, and how badly to buffer (the command-line flags)."""

    upstream_port: int
    upstream_host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port
    block: int = DEFAULT_BLOCK
    honor: bool = False
    idle_timeout: float | None = None
    gzip: str = "off"  # "buffered" or "flush": compress for readers that accept gzip (compress.py)
    max_duration: float | None = None  # the platform's execution limit on a whole exchange
    error_event: bool = False  # at the limit, write an SSE error event naming it before closing
    buffer_response: bool = False  # hold the whole response, head included, until it ends
    billing: Billing | None = None  # the platform's price list (platform.py)


class Billing(Protocol):
    """A platform's price list: what one exchange of ``seconds`` costs (``platform.Billing``)."""

    def charge(self, seconds: float) -> dict[str, Any]: ...


class Proxy:
    """The listening proxy; ``serve_proxy`` starts and stops one."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.log: deque[Exchange] = deque(maxlen=1000)  # bounded: a long class must not grow it forever
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connect, "127.0.0.1", self.config.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ClientGone, asyncio.CancelledError):
            pass  # cancelled: the proxy is closing (and Python 3.11 would log it)
        except Exception:  # one broken connection must not stop the proxy
            log.exception("unexpected error")
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read one request, answer it (or forward it), close."""
        try:
            request, body = await asyncio.wait_for(_read_request(reader, writer), HEAD_TIMEOUT)
        except HTTPError as error:
            return await _send(writer, error_response(error.status, error.message))
        except asyncio.TimeoutError:
            return await _send(writer, error_response(408, "request not received in time"))
        except (IncompleteBody, ConnectionError, ClientGone):
            return
        if request.path == LOG_PATH and request.method == "GET":
            rows = [asdict(exchange) for exchange in self.log]
            return await _send(writer, json_response(200, rows, {"Connection": "close"}))

        exchange = Exchange(request.method, request.target)
        self.log.append(exchange)
        try:
            await self._forward(request, body, reader, writer, exchange)
        finally:
            exchange.finish()
            if self.config.billing is not None:
                exchange.bill = self.config.billing.charge(exchange.seconds)
            log.info(exchange.summary())

    async def _forward(
        self,
        request: Request,
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        exchange: Exchange,
    ) -> None:
        """Connect upstream, send the request, then race the response against the client leaving."""
        host, port = self.config.upstream_host, self.config.upstream_port
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), CONNECT_TIMEOUT
            )
        except (OSError, asyncio.TimeoutError) as error:
            reason = str(error) or type(error).__name__
            return await _fail(writer, exchange, 502, f"upstream {host}:{port} unreachable: {reason}")
        try:
            client_ip = writer.get_extra_info("peername")[0]
            upstream = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 literal in brackets
            head = upstream_request_head(request, len(body), client_ip=client_ip, upstream=upstream)
            up_writer.write(head + body)
            # Whatever the client sends from now on: a tunnel forwards it, a
            # plain request only reads it, to notice the EOF of a departure.
            if is_upgrade(request):
                from_client = _copy(reader, up_writer)
            else:
                from_client = _read_until_eof(reader)
            client_side = asyncio.create_task(from_client)
            response = asyncio.create_task(self._respond(request, up_reader, writer, exchange))
            limit = self.config.max_duration
            try:
                done, _ = await asyncio.wait(
                    {client_side, response},
                    timeout=None if limit is None else max(0.0, limit - exchange.elapsed()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    exchange.cut = True  # the platform stops the function, mid-sentence
                elif response not in done:
                    # The reader left first. Closing the upstream connection
                    # (the finally below) is how the server finds out.
                    exchange.client_left = True
            finally:
                client_side.cancel()
                response.cancel()
                results = await asyncio.gather(client_side, response, return_exceptions=True)
            for result in results:
                if isinstance(result, ClientGone):  # a write to the client failed
                    exchange.client_left = True
                elif isinstance(result, Exception):
                    log.error("%s %s: %r", request.method, request.target, result)
            if exchange.cut:
                await self._cut(writer, exchange)
        finally:
            up_writer.close()

    async def _cut(self, writer: asyncio.StreamWriter, exchange: Exchange) -> None:
        """The execution limit struck: what the platform's front door tells the reader, if anything.

        Before any byte left (a buffering runtime, or a slow first token) the
        front door can still answer with an error status; once the stream
        has started, it can only close it, naming the limit in a last event
        (``--error-event``) or saying nothing at all.
        """
        limit = self.config.max_duration or 0.0
        if exchange.client_bytes == 0:
            await _fail(writer, exchange, 504, f"{EXECUTION_LIMIT}: the function ran for its limit of {limit:g} s")
        elif self.config.error_event:
            await _write(writer, cut_event(limit), exchange, body=True)

    async def _respond(
        self,
        request: Request,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        exchange: Exchange,
    ) -> None:
        """Upstream -> client: the head, then the body (or a tunnel's bytes)."""
        try:
            response, rest = await self._read_response_head(up_reader, exchange)
        except HTTPError as error:
            return await _fail(writer, exchange, 502, error.message)
        except _IdleTimeout:
            return await _fail(writer, exchange, 504, "no response head within the idle timeout")
        exchange.status = response.status
        try:
            if response.status == 101 and is_upgrade(request):
                exchange.mode = "tunnel"
                await _write(writer, client_response_head(response, "tunnel"), exchange)
                await _write(writer, rest, exchange, body=True)
                while data := await self._read_upstream(up_reader, exchange):
                    await _write(writer, data, exchange, body=True)
            else:
                await self._relay_body(request, response, rest, up_reader, writer, exchange)
        except _IdleTimeout:
            log.warning("%s %s: no upstream bytes for %s s, closing both connections",
                        request.method, request.target, self.config.idle_timeout)
        except HTTPError as error:  # a malformed body, after the head went out
            exchange.error = error.message

    async def _relay_body(
        self,
        request: Request,
        response: Response,
        rest: bytes,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        exchange: Exchange,
    ) -> None:
        """De-chunk the upstream's body, pass it through the forwarder, write what it releases.

        A forwarder that ``holds_head`` (a buffering runtime) keeps the head
        too, until its first write: the reader gets nothing, not even a status.
        """
        forwarder = forwarder_for(request, response, self.config)
        exchange.mode = forwarder.label
        body = BodyReader(response, request.method)
        head = client_response_head(response, forwarder.label, getattr(forwarder, "headers", ()))
        held_head = getattr(forwarder, "holds_head", False)
        if not held_head:
            await _write(writer, head, exchange)

        async def emit(data: bytes) -> None:
            nonlocal held_head
            if held_head:
                held_head = False
                await _write(writer, head, exchange)
            await _write(writer, data, exchange, body=True)

        data = rest
        while not body.done:
            for piece in body.feed(data):
                for block in forwarder.feed(piece):
                    await emit(block)
            if body.done:
                break
            data = await self._read_upstream(up_reader, exchange)
            if not data:
                try:
                    body.eof()
                except IncompleteBody as error:
                    # Our client reads a close-delimited body and cannot tell
                    # this cut from a proper end: why SSE needs an end event.
                    exchange.error = str(error)
                    break
        await emit(forwarder.finish())

    async def _read_response_head(
        self, up_reader: asyncio.StreamReader, exchange: Exchange
    ) -> tuple[Response, bytes]:
        """The upstream's final response head and the body bytes that came with it.

        Interim 1xx answers (other than 101) are skipped: the whole request
        body was already sent, so a ``100 Continue`` is of no use to anyone.
        """
        parser = ResponseHeadParser()
        while True:
            data = await self._read_upstream(up_reader, exchange)
            if not data:
                raise HTTPError(502, "upstream closed the connection without a response")
            response = parser.feed(data)
            while response is not None and 100 <= response.status < 200 and response.status != 101:
                rest, parser = parser.rest, ResponseHeadParser()
                response = parser.feed(rest)
            if response is not None:
                return response, parser.rest

    async def _read_upstream(self, up_reader: asyncio.StreamReader, exchange: Exchange) -> bytes:
        """The next bytes from the upstream; with an idle timeout, silence is fatal."""
        try:
            data = await asyncio.wait_for(up_reader.read(READ_SIZE), self.config.idle_timeout)
        except asyncio.TimeoutError:
            exchange.idle_timeout = True
            raise _IdleTimeout from None
        except ConnectionError:
            return b""  # a reset reads as an early end
        exchange.upstream_bytes += len(data)
        return data


async def _fail(writer: asyncio.StreamWriter, exchange: Exchange, status: int, message: str) -> None:
    """Answer with an error of our own (502, 504) in place of the upstream's response."""
    exchange.mode, exchange.status, exchange.error = "error", status, message
    await _write(writer, error_response(status, message), exchange)


async def _write(
    writer: asyncio.StreamWriter,
    data: bytes,
    exchange: Exchange,
    *,
    body: bool = False,
) -> None:
    """Write and drain: a proxy that forwards "now" must not leave bytes in its own buffer."""
    if data:
        await _send(writer, data)
        exchange.wrote(len(data), body=body)


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    try:
        writer.write(data)
        await writer.drain()
    except ConnectionError as error:
        raise ClientGone(WRITE_FAILED) from error


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> tuple[Request, bytes]:
    """A client's request head and its whole body (de-chunked), read with the shared parsers."""
    parser = RequestHeadParser()
    request = None
    while request is None:
        data = await reader.read(READ_SIZE)
        if not data:
            raise IncompleteBody("client closed before sending a request")
        request = parser.feed(data)
    body = BodyReader.for_request(request, max_body=MAX_BODY)
    pieces = body.feed(parser.rest)
    if not body.done and (request.header("expect") or "").lower() == "100-continue":
        await _send(writer, b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits 1 s for this otherwise
    while not body.done:
        data = await reader.read(READ_SIZE)
        if not data:
            body.eof()  # raises IncompleteBody
        pieces += body.feed(data)
    return request, b"".join(pieces)


async def _read_until_eof(reader: asyncio.StreamReader) -> None:
    """Return when the client closes: the only sign a proxy gets that the reader left.

    (A client that half-closes its sending side after the request looks
    the same; HTTP clients do not do that.)
    """
    with suppress(ConnectionError):
        while await reader.read(READ_SIZE):
            pass  # one request per connection: anything more is dropped


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Client -> upstream, byte for byte, for a tunnel (WebSocket frames)."""
    with suppress(ConnectionError):
        while data := await reader.read(READ_SIZE):
            writer.write(data)
            await writer.drain()


@asynccontextmanager
async def serve_proxy(
    upstream_port: int,
    *,
    upstream_host: str = "127.0.0.1",
    port: int = 0,
    block: int = DEFAULT_BLOCK,
    honor: bool = False,
    idle_timeout: float | None = None,
    **options: Any,
) -> AsyncIterator[Proxy]:
    """Run a proxy in this event loop: ``async with serve_proxy(8000) as proxy: ... proxy.url``.

    ``options`` are the rest of ``ProxyConfig`` (``gzip``, ``max_duration``...).
    """
    config = ProxyConfig(upstream_port, upstream_host, port, block, honor, idle_timeout, **options)
    BlockBuffer(block)  # refuse a bad block size before listening
    if config.gzip not in GZIP_MODES:
        raise ValueError(f"gzip must be one of {GZIP_MODES}")
    proxy = Proxy(config)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def build_parser(
    prog: str = "python -m streamlab proxy",
    description: str = "A reverse proxy that forwards response bodies in blocks (on 127.0.0.1).",
    block: int = DEFAULT_BLOCK,
) -> argparse.ArgumentParser:
    """The proxy's flags; ``platform.py`` adds its own to the same parser."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--upstream", type=_upstream, required=True, metavar="PORT",
                   help="the server: PORT, HOST:PORT or http://HOST:PORT")
    p.add_argument("--upstream-host", default=None, help="default 127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--block", type=int, default=block, help="forward bodies in blocks of this many bytes")
    p.add_argument("--honor", action="store_true",
                   help="pass through responses with 'X-Accel-Buffering: no'; never compress 'no-transform' ones")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="S", help="cut streams silent for S seconds")
    p.add_argument("--gzip", choices=GZIP_MODES, default="off",
                   help="compress for readers that accept gzip: buffered (as middlewares do) or with a sync flush per write")
    p.add_argument("--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (the parent died)")
    return p


def parse_args(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    p = parser or build_parser()
    args = p.parse_args(argv)
    if args.block < 1:
        p.error("--block must be at least 1")
    url_host, args.upstream = args.upstream
    args.upstream_host = args.upstream_host or url_host or "127.0.0.1"
    return args


def _upstream(text: str) -> tuple[str | None, int]:
    """``8000``, ``127.0.0.1:8000`` or ``http://127.0.0.1:8000``: whatever a reader is likely to paste."""
    if text.isdigit():
        return None, int(text)
    try:
        parts = urllib.parse.urlsplit(text if "//" in text else "//" + text)
        if parts.port is None:
            raise ValueError
        return parts.hostname, parts.port
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port or http://host:port: {text!r}") from None


async def _run(args: argparse.Namespace, options: dict[str, Any]) -> int:
    async with serve_proxy(
        args.upstream,
        upstream_host=args.upstream_host,
        port=args.port,
        block=args.block,
        honor=args.honor,
        idle_timeout=args.idle_timeout,
        gzip=args.gzip,
        **options,
    ) as proxy:
        await serve_until_signalled(proxy.url, exit_on_stdin_eof=args.exit_on_stdin_eof)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m streamlab proxy --upstream PORT``: run until SIGINT or SIGTERM, then exit 0."""
    args = parse_args(argv)
    return run(args, "proxy")


def run(args: argparse.Namespace, name: str, **options: Any) -> int:
    """Serve with parsed ``args`` (and ``ProxyConfig`` ``options`` a variant adds) until signalled."""
    logging.basicConfig(level=logging.INFO, format=f"streamlab {name}: %(message)s", stream=sys.stderr)
    return asyncio.run(_run(args, options))


if __name__ == "__main__":
    sys.exit(main())
