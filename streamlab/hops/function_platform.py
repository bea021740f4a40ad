"""A function platform in front of the server: an execution limit, a buffering runtime, a bill.

Serverless platforms run a handler per request and charge for the time it
runs. Three things about them reach a stream:

- an **execution limit** applies to the whole invocation, streaming
  included, so a long answer is cut by the platform mid-sentence; to the
  reader that looks exactly like a truncation bug, unless something in the
  stream says why (``--error-event``: an SSE ``error`` event naming
  ``execution_limit``; our server's own ``end`` event with its
  ``stop_reason`` is what a complete answer has and a cut one lacks);
- some **runtimes buffer** what the handler returns and send it when the
  handler is done (``--buffer-response``): the first event is the end;
- a function held open for a stream is **billed** for the stream's whole
  wall-clock time, at the memory it was given.

``python -m streamlab platform`` is the stand-in proxy (``proxy.py``) with
these options, passing every byte on at once otherwise (``--block 1``):
one forwarding loop serves both. Each exchange's bill is in ``GET
/_proxy/log`` (``bill``) and on stderr: it cannot be a response header,
which left long before the function ended.

Its settings are declared with the proxy's, in ``settings.py``: the
platform takes every flag of the proxy (``--block`` defaulting to 1 byte)
and adds its own, and ``Billing``'s defaults are the declared ones.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Any

from streamlab.hops import proxy
from streamlab.hops.settings import BILLING, PLATFORM_FLAGS, PLATFORM_SETTINGS

__all__ = [
    "DEFAULT_MEMORY_MB", "DEFAULT_PRICE_PER_GB_S", "SETTINGS", "Billing", "build_parser", "busy_time", "config_from_args",
    "main", "parse_args", "platform_command",
]

SETTINGS = PLATFORM_SETTINGS  # what docs/limits.md renders for python -m streamlab platform
# The bill's defaults, read back from their declarations (settings.BILLING, where the price's source is).
DEFAULT_PRICE_PER_GB_S = BILLING.default("price_per_gb_s")
DEFAULT_MEMORY_MB = BILLING.default("memory_mb")
GRANULARITY_MS = BILLING.default("granularity_ms")


@dataclass(frozen=True)
class Billing:
    """Duration x memory x price, per invocation: what a platform charges for ``seconds`` of a function."""

    memory_mb: int = DEFAULT_MEMORY_MB
    price_per_gb_s: float = DEFAULT_PRICE_PER_GB_S
    granularity_ms: int = GRANULARITY_MS

    def billed_seconds(self, seconds: float) -> float:
        """The duration rounded up to the billing granularity: a 1 ms function still pays for 1 ms."""
        step = self.granularity_ms / 1000
        return round(math.ceil(round(seconds / step, 6)) * step, 6)

    def charge(self, seconds: float) -> dict[str, Any]:
        billed = self.billed_seconds(seconds)
        gb_s = billed * self.memory_mb / 1024
        return {"billed_s": billed, "gb_s": round(gb_s, 6), "cost_usd": gb_s * self.price_per_gb_s}


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals: how long a worker was running at all.

    One worker process running several generations at once is busy (and
    billed) once for the time they overlap, where a function per reader is
    billed for each reader's whole stream.
    """
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def build_parser() -> argparse.ArgumentParser:
    """The proxy's flags and the platform's, every default shown with its unit."""
    return proxy.build_parser(
        prog="python -m streamlab platform",
        description="A function platform in front of the server (on 127.0.0.1): an execution limit, "
        "a runtime that may buffer the whole response, a bill per request.",
        groups=PLATFORM_FLAGS,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = proxy.parse_args(argv, p)
    if args.max_duration <= 0 or args.memory_mb < 1 or args.price_per_gb_s < 0:
        p.error("--max-duration and --memory-mb must be positive, --price-per-gb-s not negative")
    if args.error_event and args.gzip != "off":
        p.error("--error-event writes a plain SSE event, which cannot go inside a compressed body: not with --gzip")
    return args


def main(argv: list[str] | None = None) -> int:
    """``python -m streamlab platform --upstream PORT --max-duration S``: run until SIGINT or SIGTERM."""
    args = parse_args(argv)
    return proxy.run(config_from_args(args), "platform", exit_on_stdin_eof=args.exit_on_stdin_eof)


def config_from_args(args: argparse.Namespace) -> proxy.ProxyConfig:
    """The proxy's config the platform's flags describe, with the bill ``--memory-mb`` and ``--price-per-gb-s`` make."""
    return proxy.config_from_args(args, PLATFORM_FLAGS, billing=Billing(args.memory_mb, args.price_per_gb_s))


def platform_command(*args: str) -> list[str]:
    """The command line of a platform on a free port that exits with its parent, as the runner starts it."""
    return [sys.executable, "-m", "streamlab", "platform", "--port", "0", "--exit-on-stdin-eof", *args]
