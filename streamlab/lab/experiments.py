"""The chapters' experiments as functions: run against a live server, return tidy rows.

Notebooks call these so the prose and the plots stay short and the procedure
itself is tested code. Each returns plain dicts (one row per measurement) and
keeps the client traces for the plots.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from streamlab.client import timed as client
from streamlab.client import tracing
from streamlab.client import wire
from streamlab.lab.records import Recorded, recorded
from streamlab.client.tracing import Trace, TraceEvent

WAYS = ("complete", "stream", "ws")
THREE_WAYS_RUN = "02_three_ways"  # build/runs/02_three_ways.json: chapter 2's run, read back by chapters 3 and 4


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

    def to_json(self) -> list[dict[str, Any]]:
        return [{way: trace_to_json(t) for way, t in by_way.items()} for by_way in self.traces]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]], ways: Sequence[str] | None = None) -> ThreeWays:
        """The recorded traces back, only ``ways`` of them when given."""
        return cls([{way: trace_from_json(t) for way, t in by_way.items() if ways is None or way in ways}
                    for by_way in data])


def trace_to_json(trace: Trace) -> dict[str, Any]:
    """A client's trace as JSON, all of it (the body as base64), so a later chapter reads back the very same trace."""
    data = dataclasses.asdict(trace)
    data["body"] = base64.b64encode(trace.body).decode("ascii")
    return data


def trace_from_json(data: dict[str, Any]) -> Trace:
    fields = {f.name for f in dataclasses.fields(Trace)}
    values = {k: v for k, v in data.items() if k in fields}
    values["body"] = base64.b64decode(values.get("body", ""))
    values["chunks"] = [tuple(c) for c in values.get("chunks", [])]
    values["events"] = [TraceEvent(**e) for e in values.get("events", [])]
    return Trace(**values)


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


def _covers_ways(saved: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """A recording serves a chapter when everything matches and it holds every way the chapter reads."""
    def rest(key: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in key.items() if k != "ways"}

    return rest(saved) == rest(wanted) and set(wanted["ways"]) <= set(saved["ways"])


def three_ways_run(
    prompts: Sequence[str],
    *,
    max_tokens: int,
    seed: int,
    by: str,
    folder: str | Path | None = None,
    model_name: str | None = None,
    ways: Sequence[str] = WAYS,
    port: int | None = None,
    reuse: bool = True,
) -> Recorded:
    """Chapter 2's run of ``three_ways``, shared: read back when recorded with the same model, prompts, seed
    and size (and at least ``ways``), else run now (on ``port``, or a server started for it) and recorded.

    Chapter 2 owns the experiment (``reuse=False``: it always measures);
    chapters 3 and 4 read its run, and make it only when they run alone.
    ``.value`` is the ``ThreeWays``.
    """
    from streamlab.model.loading import DEFAULT_MODEL

    key = {"experiment": "three_ways", "model": model_name or os.environ.get("STREAMLAB_MODEL") or DEFAULT_MODEL,
           "prompts": list(prompts), "max_tokens": max_tokens, "seed": seed, "chat": False, "ignore_eos": True,
           "ways": list(ways)}

    def make() -> ThreeWays:
        if port is not None:
            return three_ways(port, prompts, max_tokens=max_tokens, seed=seed, ways=ways)
        from streamlab.lab.runner import serve

        with serve(*(["--model", model_name] if model_name else [])) as server:
            return three_ways(server.port, prompts, max_tokens=max_tokens, seed=seed, ways=ways)

    return recorded(THREE_WAYS_RUN, key, make, by=by, folder=folder, dump=ThreeWays.to_json,
                    load=lambda data: ThreeWays.from_json(data, ways), covers=_covers_ways, reuse=reuse)


async def give_up_on_complete(port: int, body: dict[str, Any], after_tokens: int, *, timeout: float = 120.0,
                              wait: bool = True) -> dict[str, Any]:
    """Send ``POST /complete``, hang up once the server has made ``after_tokens`` tokens.

    A ``/complete`` reader sees nothing before the end, so "leaving after 10
    pieces" has to be timed from the server's side: we watch its ``/log`` for
    our request's token count, then close the socket. Returns the server's
    final record of the request (how many tokens it made in all); with
    ``wait=False``, its record as it was when we hung up (its ``id`` says
    which to ask ``/log`` about later, once a server that runs on has finished).
    """
    known = {r["id"] for r in await client.get_json(port, "/log")}
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(wire.post_request(port, "/complete", body))
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
    return await client.wait_log(port, mine["id"], timeout) if wait else mine


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
