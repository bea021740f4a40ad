"""Real nginx (Debian's) in front of a slow event stream: what its defaults do.

The upstream here is a few lines of asyncio that answer like our server:
an SSE head, then small events 0.2 s apart, with or without
``X-Accel-Buffering: no``. A raw-socket client notes when each event
arrives through nginx. Skipped when nginx is not installed (CI installs it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamlab.protocol.http_body import BodyReader, IncompleteBody
from streamlab.protocol.http_head import RequestHeadParser, Response, ResponseHeadParser, response_head
from streamlab.hops.nginx import NginxError, NginxUnavailable, find_nginx, run_nginx, write_config
from streamlab.protocol.sse import EventStreamParser, encode_comment, encode_done, encode_event

needs_nginx = pytest.mark.skipif(find_nginx() is None, reason="nginx is not installed (apt-get install nginx-light)")
pytestmark = pytest.mark.timeout(60)

GAP = 0.2
EVENTS = 10


# --------------------------------------------------------------------------
# The configuration (no nginx needed)
# --------------------------------------------------------------------------


def test_config_keeps_nginx_defaults_and_stays_in_its_folder(tmp_path: Path):
    text = write_config(tmp_path, 8081, 8000).read_text()
    assert "listen 127.0.0.1:8081;" in text
    assert text.count("listen") == 1  # never 0.0.0.0, never port 80
    assert "proxy_pass http://127.0.0.1:8000;" in text
    assert "proxy_buffering" not in text  # the default (on) is the point
    assert "proxy_read_timeout" not in text
    assert "daemon off;" in text
    for directive in ("pid", "error_log", "access_log", "client_body_temp_path", "proxy_temp_path",
                      "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path"):
        line = next(line for line in text.splitlines() if line.strip().startswith(directive + " "))
        assert str(tmp_path.resolve()) in line, line


@pytest.mark.parametrize(("buffering", "line"), [(True, "proxy_buffering on;"), (False, "proxy_buffering off;")])
def test_config_writes_buffering_only_when_asked(tmp_path: Path, buffering, line):
    assert line in write_config(tmp_path, 1, 2, buffering=buffering).read_text()


def test_config_has_a_websocket_location_and_takes_extra(tmp_path: Path):
    text = write_config(tmp_path, 1, 2, extra="proxy_read_timeout 5s;").read_text()
    ws = text[text.index("location /ws") :]
    assert "proxy_http_version 1.1;" in ws
    assert "proxy_set_header Upgrade $http_upgrade;" in ws
    assert 'proxy_set_header Connection "upgrade";' in ws
    assert "        proxy_read_timeout 5s;" in text


def test_missing_nginx_is_reported_clearly(monkeypatch):
    monkeypatch.setattr("streamlab.hops.nginx.find_nginx", lambda: None)
    with pytest.raises(NginxUnavailable):
        with run_nginx(1):
            pass


@needs_nginx
def test_a_bad_configuration_fails_with_nginx_message():
    with pytest.raises(NginxError, match="unknown directive"):
        with run_nginx(1, extra="no_such_directive on;"):
            pass


# --------------------------------------------------------------------------
# A slow upstream and a timing client
# --------------------------------------------------------------------------


@dataclass
class SlowEvents:
    """An SSE upstream: ``n`` small events ``gap`` apart, then ``[DONE]``, then close.

    nginx asks with HTTP/1.0 by default, so the body is close-delimited.
    While sending it watches the connection, as our server does, and notes
    when nginx closed it (``eof_after``) or a write failed.
    """

    accel_header: bool = False
    n: int = EVENTS
    gap: float = GAP
    pause: float = 0.0  # silence after the first event
    ping_every: float | None = None  # ": ping" comments during the pause
    port: int = 0
    request_heads: list = field(default_factory=list)
    eof_after: list[float] = field(default_factory=list)
    sent: int = 0
    completed: int = 0

    @property
    def duration(self) -> float:
        return self.n * self.gap + self.pause

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        watcher = None
        try:
            parser, request = RequestHeadParser(), None
            while request is None:
                data = await reader.read(65536)
                if not data:
                    return
                request = parser.feed(data)
            self.request_heads.append(request)
            started = time.monotonic()
            gone = asyncio.Event()

            async def watch() -> None:
                with suppress(ConnectionError):
                    while await reader.read(65536):
                        pass
                self.eof_after.append(time.monotonic() - started)
                gone.set()

            async def still_there_after(delay: float) -> bool:
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(gone.wait(), delay)
                return not gone.is_set()

            watcher = asyncio.create_task(watch())
            headers = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")]
            if self.accel_header:
                headers.append(("X-Accel-Buffering", "no"))
            writer.write(response_head(200, headers + [("Connection", "close")]))
            for i in range(self.n):
                if i == 1 and self.pause:
                    every = self.ping_every or self.pause
                    for _ in range(round(self.pause / every)):
                        if not await still_there_after(every):
                            return
                        if self.ping_every:
                            writer.write(encode_comment("ping"))
                if not await still_there_after(self.gap):
                    return  # nginx hung up: stop "generating"
                writer.write(encode_event(f"token {i}"))
                await writer.drain()
                self.sent += 1
            writer.write(encode_done())
            await writer.drain()
            self.completed += 1
        except ConnectionError:
            self.eof_after.append(-1.0)  # a write failed before the watcher saw EOF
        except asyncio.CancelledError:
            pass
        finally:
            if watcher is not None:
                watcher.cancel()
            writer.close()


@asynccontextmanager
async def serving(upstream: SlowEvents) -> AsyncIterator[SlowEvents]:
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    try:
        yield upstream
    finally:
        server.close()


@dataclass
class Arrivals:
    response: Response | None = None
    head_time: float | None = None
    events: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    truncated: bool = False  # the connection closed before the body's end


async def watch_stream(port: int, *, leave_after: float | None = None, path: str = "/stream") -> Arrivals:
    """GET through nginx, noting when each event arrives; close after ``leave_after`` seconds."""
    out = Arrivals()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode())
    parser, body, sse = ResponseHeadParser(), None, EventStreamParser()
    try:
        while body is None or not body.done:
            left = None if leave_after is None else leave_after - (time.monotonic() - started)
            try:
                data = await asyncio.wait_for(reader.read(65536), left)
            except asyncio.TimeoutError:
                break  # the reader leaves
            now = time.monotonic() - started
            if body is None:
                out.response = parser.feed(data) if data else None
                if out.response is None:
                    if not data:
                        break
                    continue
                out.head_time = now
                body, data = BodyReader(out.response), parser.rest
            elif not data:
                try:
                    body.eof()
                except IncompleteBody:
                    out.truncated = True
                    break
            for piece in body.feed(data) if data else []:
                for event in sse.feed(piece):
                    out.events.append(event.data)
                    out.times.append(now)
    finally:
        writer.close()
    return out


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------
# What nginx's defaults do to a stream
# --------------------------------------------------------------------------


@needs_nginx
@pytest.mark.parametrize(
    ("accel_header", "buffering", "early"),
    [(False, None, False), (True, None, True), (False, False, True)],
    ids=["defaults", "x-accel-buffering-no", "proxy_buffering-off"],
)
def test_first_event_through_nginx(accel_header, buffering, early):
    async def main():
        async with serving(SlowEvents(accel_header=accel_header)) as up:
            with run_nginx(up.port, buffering=buffering) as nginx:
                arrivals = await watch_stream(nginx.port)
                return up, arrivals, nginx.access_log()

    up, arrivals, access_log = run(main())
    print(f"\nhead after {arrivals.head_time:.3f} s, first event after {arrivals.times[0]:.3f} s, "
          f"last after {arrivals.times[-1]:.3f} s "
          f"(upstream took {up.duration:.1f} s); nginx: {access_log.strip()}")
    assert arrivals.response.status == 200
    assert arrivals.events == [f"token {i}" for i in range(EVENTS)] + ["[DONE]"]
    if early:
        assert arrivals.head_time < 0.1
        assert arrivals.times[0] < 0.3 * up.duration
        assert arrivals.times[-1] - arrivals.times[0] >= 0.7 * (up.duration - up.gap)  # spread out
    else:
        # 10 small events (< 4 KiB) never fill one of nginx's buffers: they
        # all come out together when the upstream closes.
        assert arrivals.times[0] >= 0.8 * up.duration
        assert arrivals.times[-1] - arrivals.times[0] < 0.1
        # Even the head waits: smaller than postpone_output (1460 bytes) and
        # never flushed, it leaves with the body.
        assert arrivals.head_time >= 0.8 * up.duration
    # What nginx asked the upstream, by default: HTTP/1.0, its own Host.
    (request,) = up.request_heads
    assert request.version == "HTTP/1.0"
    assert request.header("connection") == "close"
    assert request.header("host") == f"127.0.0.1:{up.port}"
    assert request.header("x-accel-buffering") is None


@needs_nginx
@pytest.mark.parametrize("accel_header", [True, False], ids=["unbuffered", "buffered"])
def test_client_leaving_makes_nginx_close_the_upstream(accel_header):
    leave_after = 0.5

    async def main():
        async with serving(SlowEvents(accel_header=accel_header, n=30, gap=0.1)) as up:
            with run_nginx(up.port) as nginx:
                arrivals = await watch_stream(nginx.port, leave_after=leave_after)
                for _ in range(200):  # up to 2 s for the upstream to notice
                    if up.eof_after:
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
                return up, arrivals, nginx.access_log(), nginx.error_log()

    up, arrivals, access_log, error_log = run(main())
    print(f"\nclient left after {leave_after} s having seen {len(arrivals.events)} events; "
          f"upstream saw nginx close after {up.eof_after} s, having sent {up.sent} events; "
          f"nginx: {access_log.strip()}")
    assert up.eof_after, "nginx never closed the upstream connection"
    assert 0 < up.eof_after[0] < leave_after + 1.0
    assert up.completed == 0
    # nginx watches the client socket with epoll while it reads the upstream,
    # so it notices the close at once, not at its next write.
    assert "client prematurely closed connection, so upstream connection is closed too" in error_log
    if accel_header:
        assert len(arrivals.events) >= 2
        assert '" 200 ' in access_log  # the head had gone out: the status stays 200
    else:
        assert arrivals.response is None  # not even the head had left nginx
        assert '" 499 ' in access_log  # nginx's code for "client closed request"


@needs_nginx
@pytest.mark.parametrize(("pings", "survives"), [(False, False), (True, True)], ids=["silent", "pings"])
def test_proxy_read_timeout_cuts_a_silent_stream(pings, survives):
    upstream = SlowEvents(accel_header=True, n=3, gap=0.1, pause=2.0, ping_every=0.25 if pings else None)

    async def main():
        async with serving(upstream) as up:
            with run_nginx(up.port, extra="proxy_read_timeout 1s;") as nginx:
                arrivals = await watch_stream(nginx.port)
                return up, arrivals, nginx.error_log()

    up, arrivals, error_log = run(main())
    if survives:
        assert arrivals.events[-1] == "[DONE]"
    else:
        assert arrivals.events == ["token 0"]  # cut during the silence, no end marker
        assert arrivals.truncated  # nginx ends the chunked body without its last chunk
        assert "upstream timed out" in error_log


@needs_nginx
def test_websocket_through_nginx():
    websockets = pytest.importorskip("websockets.asyncio.server")
    from websockets.asyncio.client import connect

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async def main():
        async with websockets.serve(echo, "127.0.0.1", 0) as server:
            port = next(iter(server.sockets)).getsockname()[1]
            with run_nginx(port) as nginx:
                async with connect(f"ws://127.0.0.1:{nginx.port}/ws") as ws:
                    await ws.send("through nginx")
                    return await asyncio.wait_for(ws.recv(), 5)

    assert run(main()) == "through nginx"
