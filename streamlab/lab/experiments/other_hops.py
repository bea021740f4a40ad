"""Chapter 12's hops, named once: nginx settings for gzip and caches, and how to read what a reader saw.

Everything that moves bytes lives elsewhere (``proxy.py`` with its
``--gzip`` and platform options, ``nginx.py``, ``client.py``); this module
holds the settings each experiment puts in the way, the verdict on one
trace ("streamed", "all at once", "cut, no reason"...), and the bill of
the two designs a function platform allows: the stream held open, and the
asynchronous one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Mapping

from streamlab.client import timed as client
from streamlab.net.aio import run_sync
from streamlab.hops.function_platform import Billing, busy_time
from streamlab.client.tracing import Trace

__all__ = [
    "ACCEPT_GZIP",
    "NGINX_CACHE_EVERYTHING",
    "NGINX_CACHE_HONOURING",
    "NGINX_GZIP",
    "NGINX_GZIP_OFF",
    "Bill",
    "after",
    "asynchronous",
    "gather",
    "seen",
]

ACCEPT_GZIP = [("Accept-Encoding", "gzip")]  # what every browser sends

# gzip for event streams, as a "compress all text" rule writes it (nginx compresses only text/html unless told).
NGINX_GZIP = """
gzip on;
gzip_types text/event-stream application/json;
gzip_min_length 1;
"""
NGINX_GZIP_OFF = "gzip off;"  # the setting for the route, where a server cannot send the right headers

# A CDN rule "cache everything, for ten minutes, whatever the origin says": the origin's
# Cache-Control and X-Accel-Buffering are ignored, and a second reader of the same URL is
# held until the first response is whole (proxy_cache_lock), then served from the cache.
NGINX_CACHE_EVERYTHING = """
proxy_cache streamlab;
proxy_cache_valid 200 10m;
proxy_ignore_headers Cache-Control Expires X-Accel-Expires X-Accel-Buffering;
proxy_cache_lock on;
"""
# The same cache, honouring the origin: nginx stores nothing marked no-cache, no-store or
# private, and nothing it was told not to buffer.
NGINX_CACHE_HONOURING = """
proxy_cache streamlab;
proxy_cache_valid 200 10m;
"""


async def after(seconds: float, call: Awaitable[Any]) -> Any:
    """``call``, started ``seconds`` from now: a head start for the requests whose clock matters most."""
    await asyncio.sleep(seconds)
    return await call


def gather(calls: Mapping[str, Awaitable[Any]]) -> dict[str, Any]:
    """Run several client calls at once (one reader per hop): label -> result.

    The hops are separate processes and the readers only wait on sockets,
    so measuring them together costs the model a batch, not the readers
    their timing; it keeps the chapter inside its time.
    """

    async def main() -> list[Any]:
        return await asyncio.gather(*calls.values())

    return dict(zip(calls, run_sync(main())))


def seen(trace: Trace) -> str:
    """What the reader saw, in a few words: the verdict of one trace."""
    text = trace.text_events
    pieces = f"{len(text)} piece{'' if len(text) == 1 else 's'}"
    if trace.status is not None and trace.status >= 400:
        kind = (trace.error or {}).get("message", "") if isinstance(trace.error, dict) else str(trace.error)
        return f"{trace.status}, no text: {kind}"
    if trace.error is not None:
        name = trace.error.get("type") if isinstance(trace.error, dict) else trace.error
        return f"cut after {pieces}, error event: {name}"
    if not (trace.complete or trace.stop_reason):
        return f"cut after {pieces}, no end event: looks like any truncation"
    ids = [e.id for e in trace.events if e.id is not None]
    start = f", ids from {ids[0]}" if ids else ""
    if len(text) > 1 and text[-1].t - text[0].t < 0.05 * max(trace.end or 0.0, 1e-9) + 0.01:
        return f"all {pieces} at once{start}"
    return f"streamed {pieces}{start}"


@dataclass
class Bill:
    """One design's platform bill for the same answers: billed seconds in all, and what they cost."""

    design: str
    answers: int
    billed_s: float
    gb_s: float
    cost_usd: float

    @classmethod
    def held_open(cls, exchanges: list[dict[str, Any]]) -> Bill:
        """A function per reader, held open for its stream: each exchange's own bill (the platform's log)."""
        bills = [e["bill"] for e in exchanges]
        return cls("held-open stream", len(bills), sum(b["billed_s"] for b in bills), sum(b["gb_s"] for b in bills),
                   sum(b["cost_usd"] for b in bills))

    @classmethod
    def asynchronous(cls, posts: list[dict[str, Any]], generations: list[dict[str, Any]], billing: Billing) -> Bill:
        """``POST /generations`` through the platform (returns at once), plus a worker busy while it generates.

        The worker is one process running the generations: billed for the
        union of their runs (``started`` to ``ended`` in the server's log),
        not for the readers' waiting, which a stream service holds open.
        """
        worker = billing.charge(busy_time([(g["started"], g["ended"]) for g in generations]))
        bills = [p["bill"] for p in posts] + [worker]
        return cls("asynchronous: POST + worker", len(posts), sum(b["billed_s"] for b in bills),
                   sum(b["gb_s"] for b in bills), sum(b["cost_usd"] for b in bills))

    def row(self) -> dict[str, Any]:
        return {"design": self.design, "answers": self.answers, "billed (s)": round(self.billed_s, 3),
                "GB-s": round(self.gb_s, 3), "cost (USD per 1M such answers)": round(self.cost_usd / self.answers * 1e6, 2)}


async def asynchronous(front_port: int, stream_port: int, body: dict[str, Any]) -> tuple[str, Trace]:
    """The asynchronous design from the reader's side: ``POST /generations`` at the front door, then subscribe.

    The POST (through the platform, ``front_port``) returns the id at once;
    the reader follows ``/generations/{id}/events`` on the stream service
    (``stream_port``), where its waiting costs no function any time.
    """
    made = await client.create_generation(front_port, body)
    return made["id"], await client.events(stream_port, made["events"])
