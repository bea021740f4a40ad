"""The proxy's log: one row per exchange, ending with one outcome.

A stream ends with one stop reason (``streamlab.protocol.endings``), and an
exchange through the proxy ends with one outcome: the reader left, the
upstream went quiet, the platform's limit struck, the hop cut it. One
field, not a flag per way of ending, so a row cannot say two things at
once and a reader of ``GET /_proxy/log`` tests one value.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from streamlab.hops.forwarders import EXECUTION_LIMIT

__all__ = [
    "CLIENT_LEFT",
    "COMPLETE",
    "CUT_AFTER",
    "IDLE_TIMEOUT",
    "INTERRUPTED",
    "OUTCOMES",
    "UPSTREAM_CUT",
    "UPSTREAM_ERROR",
    "Exchange",
]

# One word per exchange, as a stream ends with one stop reason. When two
# things happen at once (the limit strikes while the reader leaves) the
# first sign that came is the one recorded.
COMPLETE = "complete"  # the upstream's response ended, and all of it was forwarded
CLIENT_LEFT = "client_left"  # the reader closed, or a write to it failed, first: the upstream was closed
IDLE_TIMEOUT = "idle_timeout"  # no upstream bytes for --idle-timeout: both closed (a 504 if no head had come)
# EXECUTION_LIMIT = "execution_limit": the platform's --max-duration struck (the word its error event names)
CUT_AFTER = "cut_after"  # --cut-after: the body was ended cleanly after N events and the upstream closed
UPSTREAM_CUT = "upstream_cut"  # the upstream closed before the body its head announced was complete
UPSTREAM_ERROR = "upstream_error"  # unreachable, or a malformed head or body: a 502 of our own if none had begun
INTERRUPTED = "interrupted"  # the proxy itself stopped (shut down, or failed) in the middle
OUTCOMES = (COMPLETE, CLIENT_LEFT, IDLE_TIMEOUT, EXECUTION_LIMIT, CUT_AFTER, UPSTREAM_CUT, UPSTREAM_ERROR, INTERRUPTED)


@dataclass
class Exchange:
    """What the proxy did with one request: a row of ``GET /_proxy/log``."""

    method: str
    target: str
    status: int | None = None
    mode: str = ""  # the forwarder's label ("buffering block=N", "passthrough"...), "tunnel" or "error"
    upstream_bytes: int = 0  # read from the upstream, head and framing included
    client_bytes: int = 0  # written to the client, head included
    writes: int = 0  # body writes to the client: the blocks, when buffering
    first_write_s: float | None = None  # from the request to the first body write
    seconds: float = 0.0
    outcome: str | None = None  # how it ended, one of OUTCOMES; None while it runs
    error: str | None = None
    bill: dict[str, Any] | None = None  # what a platform charges for it (--memory-mb, --price-per-gb-s)

    def __post_init__(self) -> None:
        self._started = time.monotonic()  # not a field: the log shows durations, not clocks

    def end(self, outcome: str) -> None:
        """Record how the exchange ended, unless something already did: the first sign wins."""
        if self.outcome is None:
            self.outcome = outcome

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
        self.end(INTERRUPTED)  # nothing said how it ended: the proxy was stopped under it

    def summary(self) -> str:
        notes = [f"{self.upstream_bytes} bytes in, {self.client_bytes} out, {self.writes} writes"]
        if self.bill:
            notes.append("billed " + ", ".join(f"{k}={v}" for k, v in self.bill.items()))
        if self.error:
            notes.append(self.error)
        return (f"{self.method} {self.target} -> {self.status} {self.mode} in {self.seconds:.2f} s, "
                f"{self.outcome}: " + "; ".join(notes))
