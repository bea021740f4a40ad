"""An ``EventSource`` after the end (chapter 8): how often a reader reconnects to a finished stream, and what stops it.

A browser's ``EventSource`` reconnects whenever the connection closes, even
after a normal end; only an answer that is not ``200 text/event-stream``
(a 204) stops it for good. ``eventsource_like`` follows those rules for a
few connections and counts them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from streamlab.client import timed as client
from streamlab.client import tracing


@dataclass
class Reconnects:
    """What an EventSource-like client did over a while: one entry per connection."""

    statuses: list[int] = field(default_factory=list)
    text_events: list[int] = field(default_factory=list)
    stopped_by_204: bool = False


async def eventsource_like(
    port: int, path: str, *, max_connections: int = 4, retry: float = 1.0, timeout: float = 120.0
) -> Reconnects:
    """Follow the WHATWG EventSource rules, for at most ``max_connections`` connections.

    A browser's EventSource reconnects whenever the connection closes, even
    after a normal end, waiting ``retry`` (the server may change it with a
    ``retry:`` field) and sending ``Last-Event-ID``. Only an answer that is not
    ``200 text/event-stream`` stops it for good: a server that wants a finished
    stream to stay finished answers the reconnect with 204 No Content. A
    browser would go on forever; we stop counting at ``max_connections``.
    """
    out = Reconnects()
    last_id: str | None = None
    while len(out.statuses) < max_connections:
        trace = await client.events(port, path, last_event_id=last_id, timeout=timeout)
        out.statuses.append(trace.status or 0)
        out.text_events.append(len(trace.text_events))
        if trace.status != 200:
            out.stopped_by_204 = trace.status == 204
            break
        last_id = tracing.last_id(trace) or last_id
        await asyncio.sleep(retry)
    return out


eventsource_like_sync = client.sync_twin(eventsource_like)


async def eventsource_after_the_end(
    ports: dict[str, int], body: dict[str, Any], *, max_connections: int = 4, retry: float = 1.0,
    timeout: float = 120.0,
) -> dict[str, tuple[str, Reconnects]]:
    """On each server, create a generation and follow it as an EventSource would: every server at once.

    Each label is a server of its own (its own process and model), and what
    is counted (connections, statuses, tokens) does not depend on timing, so
    they are watched together rather than one after the other. Returns label
    -> (the generation's id, what the EventSource-like client did).
    """

    async def watch(port: int) -> tuple[str, Reconnects]:
        created = await client.create_generation(port, body)
        seen = await eventsource_like(port, f"/generations/{created['id']}/events", max_connections=max_connections,
                                      retry=retry, timeout=timeout)
        return created["id"], seen

    results = await asyncio.gather(*(watch(port) for port in ports.values()))
    return dict(zip(ports, results))


eventsource_after_the_end_sync = client.sync_twin(eventsource_after_the_end)
