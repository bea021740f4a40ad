"""The chapters' experiments as functions: run against a live server, return tidy rows.

Notebooks call these so the prose and the plots stay short and the procedure
itself is tested code. Each returns plain dicts (one row per measurement) and
keeps the client traces for the plots.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import client

WAYS = ("complete", "stream", "ws")


@dataclass
class ThreeWays:
    """Every prompt answered three ways; ``traces[i][way]`` is the client's trace."""

    traces: list[dict[str, Any]] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for i, by_way in enumerate(self.traces):
            for way, t in by_way.items():
                out.append({
                    "prompt": i, "way": way, "first text (s)": t.first_text, "end (s)": t.end,
                    "bytes on the wire": t.total_bytes, "bytes of text": t.text_bytes, "ratio": t.ratio,
                    "pieces": len(t.text_events), "tokens": t.tokens, "complete": t.complete,
                })
        return out

    def same_text(self) -> bool:
        """Did the same text arrive all three ways, for every prompt?"""
        return all(len({t.text for t in by_way.values()}) == 1 for by_way in self.traces)


def three_ways(
    port: int, prompts: Sequence[str], *, max_tokens: int = 100, seed: int = 0, ways: Sequence[str] = WAYS,
) -> ThreeWays:
    """Ask the same question through /complete, /stream and /ws, one after another.

    ``chat=False`` continues each paragraph as prose; ``ignore_eos`` makes every
    answer exactly ``max_tokens`` long, so the three ways carry equal work.
    """
    result = ThreeWays()
    common = {"seed": seed, "chat": False, "ignore_eos": True}
    for prompt in prompts:
        by_way: dict[str, Any] = {}
        for way in ways:
            if way == "ws":
                by_way[way] = client.websocket_sync(port, prompt, max_tokens, **common)
            else:
                by_way[way] = client.post_sync(port, f"/{way}", {"prompt": prompt, "max_tokens": max_tokens, **common})
        result.traces.append(by_way)
    return result


async def give_up_on_complete(port: int, body: dict[str, Any], after_tokens: int, *, timeout: float = 120.0) -> dict[str, Any]:
    """Send ``POST /complete``, hang up once the server has made ``after_tokens`` tokens.

    A ``/complete`` reader sees nothing before the end, so "leaving after 10
    pieces" has to be timed from the server's side: we watch its ``/log`` for
    our request's token count, then close the socket. Returns the server's
    final record of the request (how many tokens it made in all).
    """
    known = {r["id"] for r in await client.get_json(port, "/log")}
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(client.post_request(port, "/complete", body))
    await writer.drain()
    deadline = time.perf_counter() + timeout
    mine: dict[str, Any] | None = None
    while time.perf_counter() < deadline:
        new = [r for r in await client.get_json(port, "/log") if r["id"] not in known]
        mine = new[0] if new else None
        if mine and (mine["tokens"] >= after_tokens or mine["done"]):
            break
        await asyncio.sleep(0.01)
    writer.close()
    if mine is None:
        raise TimeoutError("the server never logged the /complete request")
    return await client.wait_log(port, mine["id"], timeout)


give_up_on_complete_sync = client.sync_twin(give_up_on_complete)


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
        last_id = client.last_id(trace) or last_id
        await asyncio.sleep(retry)
    return out


eventsource_like_sync = client.sync_twin(eventsource_like)
