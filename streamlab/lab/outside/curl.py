"""``curl -N`` as the tell: the same request straight at the server and through each hop.

"It streams locally, and in production the whole answer lands at once":
run ``curl -N`` at the server directly and it streams; through the hop it
does not. Then the cause is the infrastructure, not the code. Here curl
runs as a subprocess and each chunk of its stdout is timed as it arrives,
so the tell becomes a measurement. Without ``-N`` curl itself buffers its
output when it writes to a pipe, which is a tell of its own: the reader's
tool can be the last hop.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from streamlab.protocol import sse
from streamlab.client.tracing import Trace

__all__ = ["CurlRun", "curl_available", "curl_stream"]


@dataclass
class CurlRun:
    """What curl wrote to its stdout, and when (seconds since it started)."""

    command: list[str]
    chunks: list[tuple[float, int]] = field(default_factory=list)
    output: bytes = b""
    returncode: int | None = None
    text_times: list[float] = field(default_factory=list)  # when each SSE event carrying text was complete

    @property
    def first_text(self) -> float | None:
        return self.text_times[0] if self.text_times else None

    @property
    def end(self) -> float | None:
        return self.chunks[-1][0] if self.chunks else None

    @property
    def writes(self) -> int:
        return len(self.chunks)

    def trace(self, label: str) -> Trace:
        """The run as a ``Trace`` (one text event per event curl printed), for the chapters' timelines."""
        trace = Trace(way=label, chunks=list(self.chunks))
        for t in self.text_times:
            trace.got_event(t, "text", "·")
        trace.end = self.end
        return trace

    def summary(self) -> dict[str, Any]:
        return {"first text (s)": self.first_text, "end (s)": self.end, "stdout writes": self.writes,
                "text events": len(self.text_times), "exit": self.returncode}


def curl_available() -> bool:
    return shutil.which("curl") is not None


def curl_stream(
    url: str,
    body: dict[str, Any],
    *,
    no_buffer: bool = True,
    compressed: bool = False,
    timeout: float = 60.0,
) -> CurlRun:
    """``curl [-N] -s --no-progress-meter [--compressed] -d BODY URL``, its stdout timed chunk by chunk.

    The body goes on stdin (``-d @-``), so the command line a reader copies
    is the one that ran. Times are from the moment curl started (its own
    start-up, a few milliseconds, included).
    """
    command = ["curl", "-s", "--no-progress-meter", "-H", "Content-Type: application/json", "-d", "@-", url]
    if no_buffer:
        command.insert(1, "-N")
    if compressed:
        command.insert(1, "--compressed")
    run = CurlRun(command)
    parser = sse.EventStreamParser()
    started = time.perf_counter()
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps(body).encode())
    process.stdin.close()
    out = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = started + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not selector.select(left):
                process.kill()
                break
            data = os.read(process.stdout.fileno(), 65536)
            if not data:
                break
            t = time.perf_counter() - started
            run.chunks.append((t, len(data)))
            out += data
            for event in parser.feed(data):
                if event.event == "message" and '"text"' in event.data:
                    run.text_times.append(t)
    run.returncode = process.wait()
    run.output = bytes(out)
    return run
