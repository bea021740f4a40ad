"""An ``EventSource``, as a browser runs one: read, and on every drop wait ``retry`` and reconnect with ``Last-Event-ID``.

The browser's rules (the HTML standard's, which this follows): a stream that
closes, cleanly or not, is reconnected after the retry delay, sending the
last ``id:`` seen; a ``204`` ends it for good (the server has nothing more),
and so does any status other than 200 (a 404 from a server that knows
nothing of the stream: the connection *fails*, and the page is told with an
``error`` event). A connection that cannot even be made is retried.

Each connection is one :class:`~streamlab.client.tracing.Trace`, filled as
its events arrive (``EventSourceRun.traces``, to watch while it runs), so
what the reader lived through is all there: which events each connection
brought, when, from which server, and the gap between them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from streamlab.client.timed import events
from streamlab.client.tracing import Trace, last_id

RETRY = 1.0  # s: a browser's default retry delay is about as long (3 s in Firefox), and streamlab sends "retry: 1000"


@dataclass
class EventSourceRun:
    """Every connection one ``EventSource`` made, and how it ended: ``end``, ``204``, ``failed 404``, ``gave up``."""

    path: str
    traces: list[Trace] = field(default_factory=list)
    outcome: str = ""
    started: float = field(default_factory=time.perf_counter)

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


async def event_source(port: int, path: str, *, host: str = "127.0.0.1", retry: float = RETRY,
                       max_connections: int = 8, timeout: float = 60.0, first_port: int | None = None,
                       run: EventSourceRun | None = None) -> EventSourceRun:
    """Read ``path`` as an ``EventSource`` until a 204, a failure, or ``max_connections`` connections.

    ``first_port``: the first connection goes there, the reconnects to
    ``port`` (a session stuck to one server until it is gone). ``run``: a
    run of the caller's, filled as the events come (to watch it meanwhile).
    """
    run = run if run is not None else EventSourceRun(path)
    last: str | None = None
    while len(run.traces) < max_connections:
        trace = Trace(way="events")
        run.traces.append(trace)
        target = first_port if first_port is not None and len(run.traces) == 1 else port
        try:
            await events(target, path, last_event_id=last, timeout=timeout, host=host, trace=trace)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as err:
            trace.error = repr(err)
        last = last_id(trace) or last
        if trace.status == 204:
            run.outcome = "204"
            return run
        if trace.status is not None and trace.status != 200:
            run.outcome = f"failed {trace.status}"
            return run
        await asyncio.sleep(retry)
    run.outcome = "gave up"
    return run
