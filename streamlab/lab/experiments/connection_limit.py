"""Many event streams in one browser page: the 6-connections-per-host limit, and HTTP/2 lifting it.

A browser keeps at most six HTTP/1.1 connections open to one host (scheme,
name and port), and an HTTP/1.1 connection carries one response at a time. An
event stream is a response that stays open for the whole answer, so a page
that opens eight ``EventSource`` streams to one origin gets six; the seventh
and eighth wait, sent nowhere, until one of the six ends. HTTP/2 carries many
requests on one connection at once, each a *stream* of its own (multiplexing),
so the same eight go out together on one connection.

``run_paths`` measures it in headless Chromium. Each path is an origin the
page is loaded from (our server directly, or nginx in front of it, with TLS,
speaking HTTP/1.1 or HTTP/2); for each, the page opens ``streams`` event
streams at the same instant (``PAGE_SCRIPT``) and records, in the page's own
clock, when each stream's response arrived, its first event and its end. The
browser's DevTools log says which protocol and which connection carried each
stream. The server is expected to be run with ``--forget``, so that each
answer is generated from the moment its reader connects (a stream that waits
for a connection also waits for its first word), and a scripted source
(``--scripted-rate``), so every answer is as long as every other.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from streamlab.client.timed import create_generation_sync, get_json_sync
from streamlab.hops import tls
from streamlab.hops.nginx import run_nginx
from streamlab.lab.setups import runner
from streamlab.lab.outside.headless import chromium, responses_received, wait_for
from streamlab.net.processes import free_port

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

__all__ = [
    "DIRECT", "HTTP1_TLS", "HTTP2_TLS", "NGINX_LOCATION", "PAGE_SCRIPT", "Paths", "PathRun", "StreamTiming",
    "cancelled_on", "connections_of", "open_streams", "paths_to_one_server", "run_paths",
]

DIRECT, HTTP1_TLS, HTTP2_TLS = "HTTP/1.1, straight to the server", "HTTP/1.1 over TLS, nginx", "HTTP/2 over TLS, nginx"
# In front of event streams nginx must not buffer (our server also says so: X-Accel-Buffering: no).
NGINX_LOCATION = "proxy_buffering off;"

# What the page runs: every stream opened at the same instant, each one timed in the page's own clock.
PAGE_SCRIPT = """
const urls = arguments[0], abort = arguments[1];  // abort: {stream, after}, one stream the page stops early
const t0 = performance.now();
const since = () => (performance.now() - t0) / 1000;  // seconds since the page opened them all
window.streams = urls.map((url, i) => {
  const s = { stream: i + 1, url: new URL(url, location.href).href,
              opened: null, first_event: null, end: null, pieces: 0, errors: 0, aborted: null };
  const source = new EventSource(url);
  source.onopen = () => { s.opened = since(); };          // the response's head arrived
  source.onmessage = () => {                               // a piece of the answer
    s.pieces += 1;
    if (s.first_event === null) s.first_event = since();
    if (abort && abort.stream === s.stream && s.pieces === abort.after) {  // the reader's stop button
      s.aborted = s.end = since();
      source.close();
    }
  };
  source.addEventListener("end", () => { s.end = since(); source.close(); });
  source.onerror = () => { s.errors += 1; };
  return s;
});
"""


@dataclass
class StreamTiming:
    """One event stream, as the page saw it: seconds since all of them were opened."""

    stream: int
    url: str
    opened: float | None
    first_event: float | None
    end: float | None
    pieces: int
    errors: int
    aborted: float | None = None  # when the page closed it early (``abort``), by the page's clock
    protocol: str | None = None  # as Chromium names it: "http/1.1", "h2"
    connection: int | None = None  # Chromium's id of the connection that carried it


@dataclass
class PathRun:
    """Every stream of one path (one origin), and what carried them."""

    label: str
    origin: str
    streams: list[StreamTiming] = field(default_factory=list)
    cancelled: dict[str, Any] | None = None  # with ``abort``: what the server made for the stream the page closed

    @property
    def protocols(self) -> list[str]:
        return sorted({s.protocol for s in self.streams if s.protocol})

    @property
    def connections(self) -> int:
        """How many connections carried the streams (Chromium's ids, counted once each)."""
        return len({s.connection for s in self.streams if s.connection is not None})

    def most_at_once(self) -> int:
        """The most streams open together (from a response's arrival to its end), by the page's clock."""
        marks = sorted([(s.opened, 1) for s in self.streams if s.opened is not None]
                       + [(s.end, -1) for s in self.streams if s.end is not None])
        most = open_now = 0
        for _, step in marks:  # at a tie an end comes first (-1 < 1): a connection freed, then reused
            open_now += step
            most = max(most, open_now)
        return most

    def first_end(self) -> float:
        """When the earliest stream ended."""
        return min(s.end for s in self.streams if s.end is not None)

    def waited(self) -> list[StreamTiming]:
        """The streams whose first event came only after a stream had ended."""
        first_end = self.first_end()
        return [s for s in self.streams if s.first_event is not None and s.first_event >= first_end]

    def row(self) -> dict[str, Any]:
        return {"path": self.label, **{k: v for k, v in asdict(self).items() if k != "streams"},
                "protocols": self.protocols, "connections": self.connections, "most at once": self.most_at_once(),
                "streams": [asdict(s) for s in self.streams]}


def open_streams(driver: "Chrome", origin: str, paths: Sequence[str], *, timeout: float = 60.0,
                 abort: tuple[int, int] | None = None) -> list[StreamTiming]:
    """Load ``origin``'s ``/health``, open an EventSource on each of ``paths`` at once, wait for every end event.

    ``abort`` (stream, pieces): that stream is closed by the page after that many pieces, as a stop button would.
    """
    driver.get(origin.rstrip("/") + "/health")
    driver.execute_script(PAGE_SCRIPT, list(paths), None if abort is None else {"stream": abort[0], "after": abort[1]})

    def ended() -> list[dict] | None:
        streams = driver.execute_script("return window.streams")
        return streams if all(s["end"] is not None for s in streams) else None

    try:
        streams = wait_for(ended, timeout, f"{len(paths)} event streams from {origin} to end", interval=0.1)
    except TimeoutError as err:
        seen = driver.execute_script("return window.streams")
        raise TimeoutError(f"{err}; the page saw: {json.dumps(seen)}") from None
    return [StreamTiming(**s) for s in streams]


def connections_of(entries: list[dict]) -> dict[str, tuple[str | None, int | None]]:
    """Chromium's performance-log entries → each response's URL: (protocol, connection id)."""
    return {response["url"]: (response.get("protocol"),
                              int(response["connectionId"]) if response.get("connectionId") is not None else None)
            for response in responses_received(entries)}


def run_paths(
    origins: dict[str, str],
    server_port: int,
    *,
    streams: int = 8,
    tokens: int = 60,
    flags: Sequence[str] = (),
    timeout: float = 60.0,
    abort: tuple[int, int] | None = None,
) -> dict[str, PathRun]:
    """For each ``label -> origin``, one page opening ``streams`` event streams of ``tokens``-piece answers.

    The generations are made on our server (``POST /generations`` on
    ``server_port``; with ``--forget`` none starts until its reader
    connects), and read through the path's origin. One browser for every
    path, one path after another: each origin has connections of its own.
    With ``abort`` (stream, pieces) the page closes that stream early, and
    each run's ``cancelled`` says what the server made for it (``cancelled_on``).
    """
    body = {"prompt": "Tell me about the lighthouse.", "max_tokens": tokens}
    runs: dict[str, PathRun] = {}
    with chromium(network_log=True, flags=tuple(flags)) as driver:
        for label, origin in origins.items():
            events = [create_generation_sync(server_port, body)["events"] for _ in range(streams)]
            driver.get_log("performance")  # what came before this path is not this path's
            timings = open_streams(driver, origin, events, timeout=timeout, abort=abort)
            carried = connections_of(driver.get_log("performance"))
            for timing in timings:
                timing.protocol, timing.connection = carried.get(timing.url, (None, None))
            runs[label] = PathRun(label, origin, timings)
            if abort is not None:
                runs[label].cancelled = cancelled_on(server_port, events, timings, abort[0], tokens)
    return runs


def cancelled_on(server_port: int, events: Sequence[str], timings: Sequence[StreamTiming], stream: int,
                 tokens: int, timeout: float = 30.0) -> dict[str, Any]:
    """What the server made for the stream the page closed, from its ``/log``, and whether the others were whole.

    Each stream's generation is its events URL's (``/generations/{id}/events``):
    its record is the one with that ``generation_id``, read once done.
    """
    generation_id = events[stream - 1].split("/")[2]
    deadline = time.monotonic() + timeout
    while True:
        mine = [r for r in get_json_sync(server_port, "/log") if r.get("generation_id") == generation_id]
        if mine and all(r["done"] for r in mine) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    record = mine[-1] if mine else {}
    closed = timings[stream - 1]
    others = [t for t in timings if t.stream != stream]
    heard = record.get("tokens_at_stop")
    # Counted from the page's close, the model's lead over the page and the close's way to the server are in it
    # (7 tokens over HTTP/2 through nginx with AVX2's kernels, beside another worker); from when the server heard
    # it, only what the server did: chapters 5 and 6 count both.
    return {"stream": stream, "pieces read": closed.pieces, "tokens made": record.get("tokens"),
            "tokens after the close": None if not record else record["tokens"] - closed.pieces,
            "made when it heard": heard,
            "tokens after it heard": None if not record or heard is None else record["tokens"] - heard,
            "noticed by": record.get("stop_signal"), "stored as": record.get("stored_reason"),
            "the others whole": all(t.pieces == tokens and t.errors == 0 for t in others)}


@dataclass
class Paths:
    """Our server, and the origins in front of it: label -> origin, and what the browser needs to trust them."""

    server: Any  # streamlab.lab.setups.runner.RunningServer
    origins: dict[str, str]
    flags: tuple[str, ...]  # Chromium's flag trusting the certificate, when nginx is there
    nginx_config: str | None  # nginx's configuration as written, when nginx is there


@contextmanager
def paths_to_one_server(*, rate: float, streams: int, nginx: bool = True) -> Iterator[Paths]:
    """A scripted server (``--scripted-rate rate --forget``) and, with ``nginx``, nginx with TLS in front of it.

    nginx listens on two ports of its own with one certificate made for
    this run: HTTP/1.1 only on one, HTTP/2 (offered by ALPN) on the other.
    Everything stops on the way out.
    """
    with tempfile.TemporaryDirectory(prefix="streamlab-streams-") as tmp, runner.serve(
        "--scripted-rate", f"{rate:g}", "--forget", "--max-active", str(max(streams, 1)),
        "--db", str(Path(tmp) / "db.sqlite"),
    ) as server:
        origins = {DIRECT: server.url}
        if not nginx:
            yield Paths(server, origins, (), None)
            return
        certificate = tls.make_certificate(Path(tmp) / "tls")
        http1, http2 = free_port(), free_port()
        listen = tls.listen_lines(certificate, http1_port=http1, http2_port=http2)
        with run_nginx(server.port, extra=listen, location=NGINX_LOCATION) as running:
            origins |= {HTTP1_TLS: f"https://{tls.HOST}:{http1}", HTTP2_TLS: f"https://{tls.HOST}:{http2}"}
            config = (running.folder / "nginx.conf").read_text()
            yield Paths(server, origins, (certificate.chromium_flag(),), config)
