"""Backpressure: how far an answer may run ahead of its reader, and how long it may be kept waiting.

A generation hands each piece to the server's event loop, which writes it to
the reader's socket. When the reader is slower than the model (a phone on a
poor link, a client that reads 1 KB/s), the bytes pile up, in this order:

1. the reader's kernel receive buffer (its ``SO_RCVBUF``), then the server's
   kernel send buffer: the socket takes bytes until both are full (measured
   for a reader with a 4 KB window on a 1448-byte MSS: ~50 KB at first, ~220 KB
   once the kernel has tuned it; over loopback, with 64 KB segments, megabytes);
2. asyncio's transport buffer: ``writer.write`` never refuses bytes, and
   ``ClientConnection.send`` waits in ``drain()`` once more than 64 KiB are
   held there (asyncio's high-water mark), until it is down to 16 KiB (the
   low-water mark): the streaming loop stops taking pieces meanwhile;
3. the generation's queue of pieces, which nothing bounded before this
   module: the model ran on to ``max_tokens`` while its reader was still near
   the beginning, spending compute on text that may never be read (a reader
   who leaves halfway). The pieces themselves are cheap (~200 bytes each in
   the queue); the KV cache of a generation that runs on grows with every
   token (45 KiB per token for SmolLM2-135M in float32).

:class:`Backlog` bounds the third: at most ``max_queued`` pieces handed over
and not yet taken by the reader. At the bound the generation *waits* (the
model's thread blocks, or a batching engine leaves it out of its next step),
and once it has spent ``slow_reader_timeout`` seconds waiting, all its waits
together, the generation is stopped with the stop reason ``slow_reader``: the
reader still gets every piece made before, then an ending that says the answer
is incomplete. All waits together, not the longest one: a reader that takes a
piece now and then, but stays ``max_queued`` behind, holds the generation (its
thread, its KV cache) as surely as one that takes nothing, and one wait cannot
outlast the write timeout anyway (below).

A stopped generation hands over what it has made without waiting (the piece in
hand, the detokenizer's last text): the queue may then hold a piece or two
beyond the bound.

``--write-timeout`` (``ClientConnection.send``) is a limit of its own on the
same reader, counted in bytes rather than pieces: one ``drain()`` must empty
the transport buffer from above 64 KiB to 16 KiB within it, so a reader slower
than 48 KiB per write timeout (1.6 KB/s at the default 30 s) is cut off, its
connection aborted, once the buffers in front of it are full, however steadily
it reads. While the streaming loop waits in ``drain()`` it takes no piece,
so no single wait for room outlasts the write timeout (unless that is 0); a
reader a little faster, which never trips it but stays behind, is what
``slow_reader_timeout`` stops. That stop is the gentler end: the connection
stays open and the reader gets what was made and a proper ending.

The counters (``queued``, ``most_queued``, ``wait_began``, ``waited``...) are
what ``GET /debug/queues`` shows and what :mod:`streamlab.lab.experiments.backpressure`
measures. Everything here is thread-safe: the model's thread hands pieces over
while the event loop takes them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


class Backlog:
    """Pieces handed over and not yet taken; the bound on them, and the waits it causes.

    ``max_queued`` None means unbounded (the generation never waits);
    ``slow_reader_timeout`` None means it may wait for ever; otherwise it is
    the most seconds it may spend waiting, all its waits together. A source
    calls :meth:`put` for every piece it hands over, and its ``pieces()``
    calls :meth:`take` for every piece the reader takes.
    """

    def __init__(self, max_queued: int | None = None, slow_reader_timeout: float | None = None) -> None:
        if max_queued is not None and int(max_queued) < 1:
            raise ValueError("max_queued must be at least 1 piece (None: unbounded)")
        if slow_reader_timeout is not None and float(slow_reader_timeout) <= 0:
            raise ValueError("slow_reader_timeout must be a positive number of seconds (None: never)")
        self.max_queued = None if max_queued is None else int(max_queued)
        self.slow_reader_timeout = None if slow_reader_timeout is None else float(slow_reader_timeout)
        self._cond = threading.Condition()
        self.handed = 0  # pieces handed over in all
        self.taken = 0  # pieces the reader took in all
        self.most_queued = 0  # the largest ``queued`` seen
        self.wait_began: float | None = None  # time.monotonic() when the current wait for room began
        self.waits = 0  # how many times the bound made the source wait
        self.waited = 0.0  # seconds spent waiting for room, every ended wait together
        self.longest_wait = 0.0
        self.released = False  # the reader is gone: nothing left to wait for

    # -- what the counters say ----------------------------------------------------

    @property
    def queued(self) -> int:
        """Pieces handed over and not yet taken by the reader."""
        return max(0, self.handed - self.taken)

    @property
    def bounded(self) -> bool:
        return self.max_queued is not None and not self.released

    def room(self) -> bool:
        """Whether one more piece may be handed over now (no side effects)."""
        return not self.bounded or self.queued < self.max_queued  # type: ignore[operator]

    def waiting_for(self, now: float | None = None) -> float:
        """Seconds the current wait has lasted (0 when the source is not waiting)."""
        began = self.wait_began
        return 0.0 if began is None else (time.monotonic() if now is None else now) - began

    def total_waited(self, now: float | None = None) -> float:
        """Seconds spent waiting for the reader, every wait together, the current one included."""
        return self.waited + self.waiting_for(now)

    def overdue(self, now: float | None = None) -> bool:
        """Whether, waiting now, it has waited ``slow_reader_timeout`` in all: the reader is too slow."""
        timeout = self.slow_reader_timeout
        return timeout is not None and self.wait_began is not None and self.total_waited(now) >= timeout

    def snapshot(self) -> dict[str, Any]:
        """The counters as plain values (for ``/debug/queues`` and the experiment)."""
        now = time.monotonic()
        return {
            "max_queued": self.max_queued,
            "slow_reader_timeout": self.slow_reader_timeout,
            "queued": self.queued,
            "most_queued": self.most_queued,
            "handed": self.handed,
            "taken": self.taken,
            "waiting_for": round(self.waiting_for(now), 3),
            "waits": self.waits,
            "waited": round(self.total_waited(now), 3),
            "longest_wait": round(max(self.longest_wait, self.waiting_for(now)), 3),
            "released": self.released,
        }

    # -- the producer's side ----------------------------------------------------------

    def put(self) -> None:
        """One more piece handed over."""
        with self._cond:
            self.handed += 1
            self.most_queued = max(self.most_queued, self.queued)

    def check(self) -> bool:
        """Non-blocking: room now? If not, the wait begins (or goes on) from this moment.

        For a producer that must not block (an engine stepping many
        generations in one loop, a source on the event loop): it asks before
        making the next piece, and leaves this one out while the answer is False.
        """
        with self._cond:
            if self.room():
                return True
            self._begin_wait()
            return False

    def wait(self, stopping: Callable[[], bool]) -> bool:
        """Block until there is room (True), ``stopping()`` is true (True), or the waiting is overdue (False).

        For a producer with a thread of its own. Never call it holding a lock
        that the reader's side needs (the model lock is held only inside a
        forward pass, and a hand-over comes after it). :meth:`wake` makes it
        look at ``stopping()`` again.
        """
        with self._cond:
            while not self.room():
                if stopping():
                    self._end_wait(force=True)
                    return True
                self._begin_wait()
                timeout = self.slow_reader_timeout
                if timeout is None:
                    self._cond.wait()
                    continue
                left = timeout - self.total_waited()
                if left <= 0:
                    self._end_wait(force=True)
                    return False
                self._cond.wait(left)
            return True

    def end_wait(self) -> None:
        """The source stops: whatever it was waiting for, its waiting is over (and counted)."""
        with self._cond:
            self._end_wait(force=True)

    def wake(self) -> None:
        """Make a blocked :meth:`wait` look again (call it after setting the stop flag)."""
        with self._cond:
            self._cond.notify_all()

    # -- the reader's side ----------------------------------------------------------------

    def take(self) -> None:
        """The reader took one piece: room for one more, and the end of a wait."""
        with self._cond:
            self.taken += 1
            self._end_wait()
            self._cond.notify_all()

    def release(self) -> None:
        """The reader is gone: the bound no longer applies (whatever runs on, runs for nobody)."""
        with self._cond:
            self.released = True
            self._end_wait()
            self._cond.notify_all()

    # -- waits -------------------------------------------------------------------------------

    def _begin_wait(self) -> None:
        if self.wait_began is None:
            self.wait_began = time.monotonic()
            self.waits += 1

    def _end_wait(self, force: bool = False) -> None:
        if self.wait_began is not None and (force or self.room()):
            lasted = time.monotonic() - self.wait_began
            self.waited += lasted
            self.longest_wait = max(self.longest_wait, lasted)
            self.wait_began = None
