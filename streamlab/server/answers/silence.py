"""``Silence``: one timer per stream that says when a keep-alive is due, whatever the stream waits for.

A reader waits for its next piece (``answer.pieces_or_pings``) or for its turn
in line (``Jobs.in_queue``); either way, a silence of ``interval`` seconds
must end with a keep-alive, so that no proxy or load balancer (which close
connections idle for 60-100 s) cuts it. It has a module of its own because
it knows nothing of either: only a future to wait on and a clock.
"""

from __future__ import annotations

import asyncio


class Silence:
    """``wait(ready)``: True once the future ``ready`` is done, False after ``interval`` seconds of waiting (0: never).

    ``asyncio.wait({task}, timeout=interval)`` does the same, but makes a
    timer, a future and callbacks for every piece, and cancels the timer
    once the piece comes: chapter 11's benchmark (``benchmarks/many_streams.py``)
    measured it at a fifth of the server's CPU per event at 300 streams.
    Pieces come far more often than keep-alives are due, so this keeps one
    timer per stream: when it fires, it looks at when the current wait
    began, and either ends the wait (resolving the reader's own ``ready``
    future with False) or sets itself for the right moment.
    """

    def __init__(self, interval: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.interval = interval
        self.began = 0.0  # loop time when the current wait began
        self.waiter: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None

    async def wait(self, ready: asyncio.Future) -> bool:
        if ready.done():
            return bool(ready.result())
        self.waiter = ready
        self.began = self.loop.time()
        if self.interval > 0 and self.timer is None:
            self.timer = self.loop.call_at(self.began + self.interval, self._due)
        try:
            return bool(await ready)
        finally:
            self.waiter = None

    def _due(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait sets the timer again
        due = self.began + self.interval
        if self.loop.time() >= due:
            waiter.set_result(False)
        else:
            self.timer = self.loop.call_at(due, self._due)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
