"""An ``EventSource``, as a browser runs one: read, and on every drop wait ``retry`` and reconnect with ``Last-Event-ID``.

The browser's rules (the HTML standard's, which this follows, case by case
as web-platform-tests' ``eventsource/`` checks them): a stream that closes,
cleanly or not, is reconnected after the reconnection time (``retry:``
from the stream, else ``retry`` here), sending the stream's last event ID
string (the id of the last *dispatched* block; none when it is empty); a
``204`` ends it for good (the server has nothing more), and so does any
status other than 200 (a 404 from a server that knows nothing of the
stream: the connection *fails*, and the page is told with an ``error``
event) and a 200 that is not ``text/event-stream``. Redirects (301, 302,
303, 307, 308) are followed, and a reconnect goes back to the first URL. A
connection that cannot even be made is retried.

Each connection is one :class:`~streamlab.client.tracing.Trace`, filled as
its events arrive (``EventSourceRun.traces``, to watch while it runs), so
what the reader lived through is all there: which events each connection
brought, when, from which server, and the gap between them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

from streamlab.client.timed import events
from streamlab.client.tracing import Trace, last_id
from streamlab.client.wire import _host_header
from streamlab.protocol import sse

RETRY = 1.0  # s: a browser's default retry delay is about as long (3 s in Firefox), and streamlab sends "retry: 1000"
REDIRECTS = (301, 302, 303, 307, 308)  # followed, as fetch follows them
MAX_REDIRECTS = 20  # fetch's limit: past it the connection fails


@dataclass
class EventSourceRun:
    """Every connection one ``EventSource`` made, and how it ended.

    ``outcome``: ``204``, ``failed 404`` (any status but 200),
    ``failed mime`` (a 200 that is not an event stream), ``failed
    redirects`` (over ``MAX_REDIRECTS``), ``gave up`` (``max_connections``
    reached). ``waits``: the seconds it waited before each reconnect.
    ``redirects``: ``(status, Location)`` of every redirect it followed.
    """

    path: str
    traces: list[Trace] = field(default_factory=list)
    outcome: str = ""
    started: float = field(default_factory=time.perf_counter)
    waits: list[float] = field(default_factory=list)
    redirects: list[tuple[int, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(e.text for trace in self.traces for e in trace.text_events)

    @property
    def ended(self) -> bool:
        """Whether the answer's ``end`` event reached the reader."""
        return any(e.kind == "end" for trace in self.traces for e in trace.events)

    def timeline(self) -> list[tuple[float, int, int]]:
        """``(seconds since the start, text events so far, connection)`` for every text event."""
        rows, count = [], 0
        for number, trace in enumerate(self.traces):
            for e in trace.text_events:
                count += 1
                rows.append((trace.sent + e.t - self.started, count, number))
        return rows

    def gap(self) -> float | None:
        """The longest silence between two text events that came on different connections (None: one connection)."""
        rows = self.timeline()
        gaps = [b[0] - a[0] for a, b in zip(rows, rows[1:]) if a[2] != b[2]]
        return max(gaps) if gaps else None


def _follow(host: str, port: int, path: str, location: str) -> tuple[str, int, str] | None:
    """Where a redirect's ``Location`` points, resolved against the URL it answered; None if not http."""
    url = urlsplit(urljoin(f"http://{_host_header(host, port)}{path}", location))
    if url.scheme != "http" or not url.hostname:
        return None
    return url.hostname, url.port or 80, (url.path or "/") + (f"?{url.query}" if url.query else "")


async def event_source(port: int, path: str, *, host: str = "127.0.0.1", retry: float = RETRY,
                       max_connections: int = 8, timeout: float = 60.0, first_port: int | None = None,
                       run: EventSourceRun | None = None, last_event_id: str | None = None) -> EventSourceRun:
    """Read ``path`` as an ``EventSource`` until a 204, a failure, or ``max_connections`` connections.

    ``first_port``: the first connection goes there, the reconnects to
    ``port`` (a session stuck to one server until it is gone). ``run``: a
    run of the caller's, filled as the events come (to watch it meanwhile).
    ``retry``: the reconnection time in seconds until the stream sets one
    with ``retry:``. ``last_event_id``: an id already held, sent with the
    first connection (a page restoring its place).
    """
    run = run if run is not None else EventSourceRun(path)
    last = last_event_id or None
    delay = retry
    while len(run.traces) < max_connections:
        trace = Trace(way="events")
        run.traces.append(trace)
        target = (host, first_port if first_port is not None and len(run.traces) == 1 else port, path)
        for _ in range(MAX_REDIRECTS + 1):
            try:
                await events(target[1], target[2], last_event_id=last, timeout=timeout, host=target[0], trace=trace)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as err:
                trace.error = repr(err)
            location = trace.headers.get("location")
            if trace.status not in REDIRECTS or not location:
                break
            followed = _follow(*target, location)
            if followed is None:
                break
            run.redirects.append((trace.status, location))
            target, trace = followed, Trace(way="events")
            run.traces[-1] = trace
        else:
            run.outcome = "failed redirects"
            return run
        last = last_id(trace)  # the trace's ids started from the one sent: it is the stream's string now
        if trace.status == 204:
            run.outcome = "204"
            return run
        if trace.status is not None and trace.status != 200:
            run.outcome = f"failed {trace.status}"
            return run
        if trace.status == 200 and not sse.is_event_stream(trace.headers.get("content-type")):
            run.outcome = "failed mime"
            return run
        if trace.retry is not None:
            delay = trace.retry / 1000  # the stream's reconnection time, kept for every later drop
        run.waits.append(delay)
        await asyncio.sleep(delay)
    run.outcome = "gave up"
    return run
