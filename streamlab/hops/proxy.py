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
- it logs every request (``GET /_proxy/log``), each with the one
  ``outcome`` its exchange ended with, so an experiment can check what the
  proxy did instead of guessing.

The other hops of chapters 10 and 12 are options of this one forwarding
loop, not copies of it: ``--gzip`` compresses like a middleware
(``compress.py``), ``--cut-after N`` ends event streams cleanly after N
events as a hop with a limit does (chapter 10), and ``python -m streamlab
platform`` (``function_platform.py``) runs it as a function platform: an
execution limit on the whole exchange, a runtime that may buffer the whole
response, a bill per request.

The decisions are pure and live elsewhere: which headers pass in
``heads.py``, what a body becomes on the way in ``forwarders.py``, how an
exchange ended in ``exchange.py``; every setting, its default and its
unit in ``settings.py``. This module only moves bytes between the sockets
and them. One request per connection: both sides get
``Connection: close``, which keeps the bookkeeping obvious and makes a
closed connection mean one thing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict
from typing import Any

from streamlab.hops.compress import GZIP_MODES
from streamlab.hops.exchange import CLIENT_LEFT, COMPLETE, CUT_AFTER, IDLE_TIMEOUT, UPSTREAM_CUT, UPSTREAM_ERROR, Exchange
from streamlab.hops.forwarders import (
    EXECUTION_LIMIT, BlockBuffer, CuttingForwarder, cut_event, forwarder_for,
)
from streamlab.hops.heads import client_response_head, is_upgrade, upstream_request_head
from streamlab.hops.settings import (
    CONFIG, FIXED, FORWARDING, FUNCTION, PROXY_FLAGS, PROXY_SETTINGS, add_flags, make_proxy_config,
)
from streamlab.net.errors import ArgumentParser
from streamlab.net.serving import ClientGone, serve_until_signalled
from streamlab.net.settings import Settings, config_values
from streamlab.protocol.endings import WRITE_FAILED
from streamlab.protocol.http_body import BodyReader, IncompleteBody
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import (
    FinalResponseParser,
    Request,
    RequestHeadParser,
    Response,
    error_response,
    json_response,
)

# choose_forwarder and forwarder_for are re-exported: chapters 6 and 12 show them as the proxy's.
__all__ = [
    "LOG_PATH",
    "SETTINGS",
    "Proxy",
    "ProxyConfig",
    "build_parser",
    "config_from_args",
    "main",
    "parse_args",
    "serve_proxy",
]

log = logging.getLogger("streamlab.hops.proxy")

LOG_PATH = "/_proxy/log"  # answered by the proxy itself, never forwarded
READ_SIZE = 65536  # bytes asked of a socket per read: a buffer size, not a limit
SETTINGS = PROXY_SETTINGS  # what docs/limits.md renders for python -m streamlab proxy
# The bounds fixed in the code, read back from their declarations (settings.FIXED).
MAX_BODY = FIXED.default("max_body")
HEAD_TIMEOUT = FIXED.default("head_timeout")
CONNECT_TIMEOUT = FIXED.default("connect_timeout")
MAX_LOG_RECORDS = FIXED.default("max_log_records")


class _IdleTimeout(Exception):
    pass


# --------------------------------------------------------------------------
# The I/O: thin glue between sockets, the heads and the forwarders
# --------------------------------------------------------------------------


ProxyConfig = make_proxy_config(
    "ProxyConfig", CONFIG, module=__name__,
    doc="Where to forward, and how badly to buffer: ``ProxyConfig(8000, block=1)``; every field a declaration"
    " in settings.py (the flags of both programs set them).",
)


class Proxy:
    """The listening proxy; ``serve_proxy`` starts and stops one."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.log: deque[Exchange] = deque(maxlen=MAX_LOG_RECORDS)  # bounded: a long class must not grow it forever
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
                    exchange.end(EXECUTION_LIMIT)  # the platform stops the function, mid-sentence
                elif response not in done:
                    # The reader left first. Closing the upstream connection
                    # (the finally below) is how the server finds out.
                    exchange.end(CLIENT_LEFT)
            finally:
                client_side.cancel()
                response.cancel()
                results = await asyncio.gather(client_side, response, return_exceptions=True)
            for result in results:
                if isinstance(result, ClientGone):  # a write to the client failed
                    exchange.end(CLIENT_LEFT)
                elif isinstance(result, Exception):
                    log.error("%s %s: %r", request.method, request.target, result)
            if exchange.outcome == EXECUTION_LIMIT:
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
            await _fail(writer, exchange, 504, f"{EXECUTION_LIMIT}: the function ran for its limit of {limit:g} s"
                        f" ({FUNCTION.flag('max_duration')})")
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
            return await _fail(writer, exchange, 504, "no response head within the idle timeout"
                               f" ({FORWARDING.flag('idle_timeout')} {self.config.idle_timeout:g})")
        exchange.status = response.status
        try:
            if response.status == 101 and is_upgrade(request):
                exchange.mode = "tunnel"
                await _write(writer, client_response_head(response, "tunnel"), exchange)
                await _write(writer, rest, exchange, body=True)
                while data := await self._read_upstream(up_reader, exchange):
                    await _write(writer, data, exchange, body=True)
                exchange.end(COMPLETE)
            else:
                await self._relay_body(request, response, rest, up_reader, writer, exchange)
        except _IdleTimeout:
            log.warning("%s %s: no upstream bytes for %s s, closing both connections",
                        request.method, request.target, self.config.idle_timeout)
        except HTTPError as error:  # a malformed body, after the head went out
            exchange.error = error.message
            exchange.end(UPSTREAM_ERROR)

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
        One that has ``ended`` the body (a cutting hop) is read no further:
        returning closes the upstream, which is how the server finds out.
        """
        forwarder = forwarder_for(request, response, self.config)
        exchange.mode = forwarder.label
        body = BodyReader(response, request.method)
        head = client_response_head(response, forwarder.label, forwarder.headers)
        held_head = forwarder.holds_head
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
                blocks = forwarder.feed(piece)
                if forwarder.ended:  # said before the last chunk leaves: a reader that saw the end finds it logged
                    exchange.end(CUT_AFTER)
                for block in blocks:
                    await emit(block)
            if body.done or forwarder.ended:
                break
            data = await self._read_upstream(up_reader, exchange)
            if not data:
                try:
                    body.eof()
                except IncompleteBody as error:
                    # Our client reads a close-delimited body and cannot tell
                    # this cut from a proper end: why SSE needs an end event.
                    exchange.error = str(error)
                    exchange.end(UPSTREAM_CUT)
                    break
        # A body that cannot be (HEAD, 204, 304) gets no forwarder's last bytes, not even a gzip trailer.
        await emit(forwarder.finish() if body.mode != "none" else b"")
        exchange.end(COMPLETE)

    async def _read_response_head(
        self, up_reader: asyncio.StreamReader, exchange: Exchange
    ) -> tuple[Response, bytes]:
        """The upstream's final response head and the body bytes that came with it.

        Interim 1xx answers (other than 101) are skipped: the whole request
        body was already sent, so a ``100 Continue`` is of no use to anyone.
        """
        parser = FinalResponseParser()
        while True:
            data = await self._read_upstream(up_reader, exchange)
            if not data:
                raise HTTPError(502, "upstream closed the connection without a response")
            response = parser.feed(data)
            if response is not None:
                return response, parser.rest

    async def _read_upstream(self, up_reader: asyncio.StreamReader, exchange: Exchange) -> bytes:
        """The next bytes from the upstream; with an idle timeout, silence is fatal."""
        try:
            data = await asyncio.wait_for(up_reader.read(READ_SIZE), self.config.idle_timeout)
        except asyncio.TimeoutError:
            exchange.end(IDLE_TIMEOUT)
            raise _IdleTimeout from None
        except ConnectionError:
            return b""  # a reset reads as an early end
        exchange.upstream_bytes += len(data)
        return data


async def _fail(writer: asyncio.StreamWriter, exchange: Exchange, status: int, message: str) -> None:
    """Answer with an error of our own (502, 504) in place of the upstream's response.

    The outcome is the upstream's error unless something ended the exchange
    first: the 504 of an idle timeout or of the execution limit.
    """
    exchange.mode, exchange.status, exchange.error = "error", status, message
    exchange.end(UPSTREAM_ERROR)
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
async def serve_proxy(upstream_port: int, **options: Any) -> AsyncIterator[Proxy]:
    """Run a proxy in this event loop: ``async with serve_proxy(8000, block=1) as proxy: ... proxy.url``.

    ``options`` are the rest of ``ProxyConfig`` (``upstream_host``, ``honor``,
    ``gzip``, ``max_duration``...), by name, their defaults its own.
    """
    async with serving(ProxyConfig(upstream_port, **options)) as proxy:
        yield proxy


@asynccontextmanager
async def serving(config: ProxyConfig) -> AsyncIterator[Proxy]:
    """Run a proxy with ``config``, refusing a bad one before it listens."""
    BlockBuffer(config.block)  # a bad block size
    if config.cut_after is not None:
        CuttingForwarder(config.cut_after)  # a bad cut
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
    groups: Sequence[Settings] = PROXY_FLAGS,
) -> argparse.ArgumentParser:
    """A command line of ``groups`` (the proxy's; the platform's are the proxy's and its own), a section each."""
    p = ArgumentParser(prog=prog, description=description, epilog="Every setting as a table: docs/limits.md.")
    add_flags(p, groups)
    return p


def parse_args(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The flags, checked; ``--upstream`` becomes the port, its host (if it names one) ``--upstream-host``'s default."""
    p = parser or build_parser()
    # A namespace that already holds upstream_host keeps argparse from writing the
    # default there: still None afterwards, the flag was not given.
    args = p.parse_args(argv, namespace=argparse.Namespace(upstream_host=None))
    if args.block < 1:
        p.error("--block must be at least 1")
    if args.cut_after is not None and args.cut_after < 1:
        p.error("--cut-after must be at least 1")
    url_host, args.upstream = args.upstream
    args.upstream_host = args.upstream_host or url_host or p.get_default("upstream_host")
    return args


def config_from_args(
    args: argparse.Namespace, groups: Sequence[Settings] = PROXY_FLAGS, **overrides: Any
) -> ProxyConfig:
    """The config the flags of ``groups`` parsed to (``parse_args``'s), with ``overrides`` a program adds."""
    return ProxyConfig(args.upstream, **{**config_values(args, *groups), **overrides})


def main(argv: list[str] | None = None) -> int:
    """``python -m streamlab proxy --upstream PORT``: run until SIGINT or SIGTERM, then exit 0."""
    args = parse_args(argv)
    return run(config_from_args(args), "proxy", exit_on_stdin_eof=args.exit_on_stdin_eof)


def run(config: ProxyConfig, name: str, *, exit_on_stdin_eof: bool = False) -> int:
    """Serve ``config`` until signalled, logging as ``name`` (the proxy, or the platform)."""
    logging.basicConfig(level=logging.INFO, format=f"streamlab {name}: %(message)s", stream=sys.stderr)
    return asyncio.run(_run(config, exit_on_stdin_eof))


async def _run(config: ProxyConfig, exit_on_stdin_eof: bool) -> int:
    async with serving(config) as proxy:
        await serve_until_signalled(proxy.url, exit_on_stdin_eof=exit_on_stdin_eof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
