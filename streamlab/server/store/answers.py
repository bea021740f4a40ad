"""One answer as it streams (``AnswerWriter``), and the rounds that write every answer of a tick at once.

``streamlab.server.store.database`` holds the file and its SQL; this module decides
*when* an answer's text reaches it. An answer's text waits in memory and is
written at most every ``flush_interval`` seconds, so that a crash loses at
most that much of it without a commit per token.

On the server, a thousand answers stream at once. Each writing its own text
on its own timer made a thousand commits a second, each paying for its own
transaction (the WAL frames, the locks), and a thousand entries in the event
loop's timer heap: chapter 11's benchmark (``benchmarks/many_streams.py``)
found ~8% of the server's time there. So an answer made on a running event
loop joins the store's ``FlushRounds``: one timer for the whole store, and
at each of its ticks every answer with new text, and the heartbeat of every
other one when it is due, is written in one transaction. A reader of the file
sees a tick whole or not at all, and a crash still loses at most one interval:
a piece appended just after a tick is written by the next one.

An answer made off any loop (a script, a notebook, a thread of its own)
keeps a timer of its own, as before: one answer at a time has nothing to
share a transaction with.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Any

from streamlab.protocol.endings import ERROR, INTERRUPTED, STOP_REASONS
from streamlab.server.store.conversations import Begun, StoreUnavailable
from streamlab.server.store.schema import Message

__all__ = ["AnswerWriter", "FlushRounds"]

# The store these belong to is ``streamlab.server.store.database.Store``, typed ``Any`` here: it imports this module,
# and an import back (even for typing) would make a circle.
StoreLike = Any


class AnswerWriter:
    """Accumulates one answer as it is sent, and writes it down.

    ``append`` is called with each piece the server sends. The text lives
    in memory and reaches the database at most every ``flush_interval``
    seconds, and never later than that after a piece was appended: on a
    running event loop, by the store's rounds (see the module's docstring);
    elsewhere on the append that finds the interval passed, or, if the model
    goes quiet (a long pause, a slow token), from a timer of its own.
    ``finish`` writes the final text and why it ended, at once.

    The same timer (or round) refreshes the heartbeat every ``beat_every``
    seconds when nothing new came: other processes sharing the file see the
    answer is alive (``Lease.gone``). An answer's own timer is a thread when
    no loop runs. A thread per answer cost a server streaming to 1,000
    readers 1,000 threads, each started anew every second and each taking the
    GIL from the event loop to write: the chapter 11 benchmark measured gaps
    of 0.5 s between events against a 50 ms schedule, and ten times the CPU
    per event of uvicorn + Starlette.

    A second ``finish`` is ignored and returns the row as it stands: the
    first ending to arrive wins (the same rule as the server's
    ``stop_signal``), so a disconnect and the model's own end racing each
    other cannot fail the request. ``append`` after ``finish`` raises
    ``RuntimeError``: text after the end is a bug.

    ``kept``: an answer a dead writer began (``conversations.Begun``), continued
    here: its text and tokens come first, and ``append``'s running total counts
    this writer's tokens only (``tokens`` is the whole answer's; ``appended``
    the text this writer added).

    As a context manager, leaving the ``with`` by an exception finishes with
    ``error`` (the exception in ``error``); by a cancellation or an interrupt
    (``BaseException`` that is not an ``Exception``, such as asyncio's
    ``CancelledError``) with ``interrupted``, since nothing failed: the work
    was called off. Leaving normally without ``finish`` is a bug: the answer
    is closed as ``error`` and ``RuntimeError`` is raised.
    """

    def __init__(self, store: StoreLike, message: Message, kept: Begun | None = None) -> None:
        self._store = store
        self.message_id = message.id
        self.conversation_id = message.conversation_id
        self._kept_text, self._kept_tokens = (kept.text, kept.tokens) if kept is not None else ("", 0)
        self._parts: list[str] = [self._kept_text] if self._kept_text else []
        self._tokens = 0  # this writer's running total (after the kept ones)
        self._dirty = False
        self._finished: Message | None = None
        self._last_flush = message.created
        self._last_beat = message.created  # the row was born with our heartbeat
        self._timer: threading.Timer | asyncio.TimerHandle | None = None
        self._timer_due = 0.0  # when the timer fires, on the store's clock
        # Guards the parts and the timer: appends come from the event loop,
        # the timer fires in its own thread.
        self._lock = threading.Lock()
        self._rounds: FlushRounds | None = store._rounds.join(self)  # None: off the store's loop
        if self._rounds is None:
            with self._lock:
                self._arm_locked()  # from the first moment: a long prefill sends nothing, yet is alive

    @property
    def text(self) -> str:
        """All text appended so far (written to the database or not yet)."""
        with self._lock:
            return "".join(self._parts)

    @property
    def appended(self) -> str:
        """The text this writer was given (without a continued answer's kept text): what its generation sent."""
        return self.text[len(self._kept_text):]

    @property
    def tokens(self) -> int:
        return self._kept_tokens + self._tokens

    @property
    def finished(self) -> bool:
        return self._finished is not None

    def append(self, text: str, tokens: int) -> None:
        """Add a piece that is being sent to the reader.

        ``tokens`` is the running total of generated tokens (a ``Piece``'s
        ``tokens``), not an increment: a piece may hold several tokens, or none.
        """
        with self._lock:
            if self._finished is not None:
                raise RuntimeError("append after finish")
            if tokens < self._tokens:
                raise ValueError(f"tokens is the running total; it went from {self._tokens} to {tokens}")
            self._parts.append(text)
            self._tokens = tokens
            newly = not self._dirty
            self._dirty = True
            rounds = self._rounds
            if rounds is None:
                if self._store.clock() - self._last_flush >= self._store.flush_interval:
                    try:
                        self._flush_locked()
                    except StoreUnavailable:
                        pass  # the text still waits, for the timer the flush set again; the answer goes on
                else:
                    # Nothing more may come for a while: make sure this piece is
                    # written within the interval anyway.
                    self._arm_locked()
                return
        if newly:
            rounds.mark(self)
        if self._store.clock() - rounds.last >= self._store.flush_interval:
            rounds.run()  # the loop ran late, and the tick with it: this piece must not wait longer than the interval

    def _arm_locked(self) -> None:
        """Keep the one timer (one per answer, not per purpose) set for the waiting text's flush, else the heartbeat."""
        if self._rounds is not None:
            return  # the store's rounds keep the time
        store = self._store
        wait, since = (store.flush_interval, self._last_flush) if self._dirty else (store.beat_every, self._last_beat)
        due = since + wait
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = self._start_timer(min(max(due - store.clock(), 0.0), wait))

    def _start_timer(self, delay: float) -> threading.Timer | asyncio.TimerHandle:
        """``_on_timer`` in ``delay`` seconds: on the caller's event loop if it runs one, else in a thread."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            timer = threading.Timer(delay, self._on_timer)
            timer.daemon = True
            timer.start()
            return timer
        return loop.call_later(delay, self._on_timer)

    def flush(self) -> None:
        """Write the progress now, in a transaction of its own (normally left to ``append`` and the timer)."""
        with self._lock:
            if self._finished is None:
                self._flush_locked()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._finished is not None:
                return
            if self._dirty:
                try:
                    self._flush_locked()
                except StoreUnavailable:
                    pass  # the text still waits: the timer the flush set again writes it
            else:
                try:
                    if self._store.clock() - self._last_beat >= self._store.beat_every:
                        self._store._write_heartbeat(self.message_id)
                        self._last_beat = self._store.clock()
                except StoreUnavailable:
                    pass  # the next beat tries again
                finally:
                    self._arm_locked()  # a failed write (a lock held too long) must not end the heartbeat
        self._store._sweep_if_due()

    def _flush_locked(self) -> None:
        """Write what is waiting (the heartbeat with it), then set the timer for what is due next."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._last_flush = self._store.clock()
        try:
            if self._dirty:
                self._store._write_progress(self.message_id, "".join(self._parts), self.tokens)
                self._last_beat = self._last_flush
                self._dirty = False
        finally:
            self._arm_locked()

    def _take_progress(self, now: float) -> tuple[str, str, int] | None:
        """For a round: ``(message_id, text, tokens)`` when new text waits (it is then no longer waiting)."""
        with self._lock:
            if self._finished is not None or not self._dirty:
                return None
            self._dirty = False
            self._last_flush = self._last_beat = now
            return self.message_id, "".join(self._parts), self.tokens

    def _give_back_progress(self) -> bool:
        """A round's write failed: the text waits again (True), unless the answer has ended since."""
        with self._lock:
            if self._finished is not None:
                return False
            self._dirty = True
            return True

    def finish(self, stop_reason: str, *, error: str | None = None) -> Message:
        """Write the final text, status ``done``, the stop reason and the incomplete flag.

        Returns the finished row. Called again, it changes nothing and
        returns the row from the first call. The end is written at once, in
        a transaction of its own, never left to a round: the reader is told
        where it is stored, and may read it back the next moment. (A store
        that cannot be reached keeps the ending and writes it once it
        answers: ``shared.SharedStore``; the row returned is then the one it will write.)
        """
        if stop_reason not in STOP_REASONS:
            raise ValueError(f"unknown stop reason {stop_reason!r}; expected one of {STOP_REASONS}")
        with self._lock:
            if self._finished is not None:
                return self._finished
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._finished = self._store._write_final(self.message_id, "".join(self._parts), self.tokens,
                                                      stop_reason, error)
        if self._rounds is not None:
            self._rounds.leave(self)
        self._store._writers.discard(self)
        return self._finished

    def __enter__(self) -> AnswerWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.finished:
            return
        if exc is None:
            self.finish(ERROR, error="the writer was closed without finish()")
            raise RuntimeError("AnswerWriter left without finish(); closed as 'error'")
        if isinstance(exc, Exception):
            self.finish(ERROR, error=f"{type(exc).__name__}: {exc}")
        else:
            self.finish(INTERRUPTED, error=type(exc).__name__)


class FlushRounds:
    """The store's one timer on its event loop: each tick writes every answer's new text, and heartbeats, at once.

    A tick comes ``flush_interval`` seconds after the last one while some
    answer has text waiting, else when the heartbeats are due
    (``beat_every``). The first append to find a tick overdue (the loop ran
    late) runs it there and then, so that no piece waits longer than the
    interval for its tick. ``transactions`` counts the ticks that wrote.
    A tick whose store cannot be reached (``StoreUnavailable``: Redis gone)
    gives the text back to the next one and says nothing more: the answers
    go on streaming, and what they sent is written once the store answers.

    Locks, always in this order: the rounds', then an answer's (to take its
    text), then the store's (to write). ``finish`` and ``append`` release
    their answer's lock before they come here.
    """

    def __init__(self, store: StoreLike) -> None:
        self.store = store
        self.loop: asyncio.AbstractEventLoop | None = None
        self.members: set[AnswerWriter] = set()  # every answer streaming on the loop: heartbeats go to all
        self.waiting: dict[AnswerWriter, None] = {}  # those with new text since the last tick, in order
        self.last = self.last_beat = store.clock()
        self.transactions = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._lock = threading.Lock()

    def join(self, writer: AnswerWriter) -> FlushRounds | None:
        """Take ``writer`` into the rounds when it is made on the rounds' loop (or the first loop); else None."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        with self._lock:
            if loop is not self.loop:
                if self.members and self.loop is not None and not self.loop.is_closed():
                    return None  # another loop's answers are streaming: this one keeps a timer of its own
                self.loop, self._timer = loop, None
            self.members.add(writer)
            self._arm_locked()
        return self

    def leave(self, writer: AnswerWriter) -> None:
        with self._lock:
            self.members.discard(writer)
            self.waiting.pop(writer, None)
            self._arm_locked()

    def mark(self, writer: AnswerWriter) -> None:
        """``writer`` has new text for the next tick."""
        with self._lock:
            first = not self.waiting
            self.waiting[writer] = None
            if first:
                self._arm_locked()  # it may have been set for the later heartbeat

    def _on_timer(self) -> None:
        self._timer = None
        self.run()

    def run(self) -> None:
        """One tick: the new text of every waiting answer and, when due, every other's heartbeat, in one transaction."""
        store = self.store
        with self._lock:
            if self._timer is not None:  # run early (an append found it overdue): the timer is set again below
                self._timer.cancel()
                self._timer = None
            now = store.clock()
            writers, self.waiting = self.waiting, {}
            progress = [p for p in (w._take_progress(now) for w in writers) if p is not None]
            beat = now - self.last_beat >= store.beat_every
            if beat:
                written = {p[0] for p in progress}
                beats = [w.message_id for w in self.members if w.message_id not in written]
            else:
                beats = []
            self.last = now
            try:
                if progress or beats:
                    store._write_round(progress, beats, now)
                    self.transactions += 1
                if beat:
                    self.last_beat = now
            except BaseException as err:
                for writer in writers:
                    if writer._give_back_progress():
                        self.waiting[writer] = None  # the next tick tries again
                if not isinstance(err, StoreUnavailable):
                    raise
                return
            finally:
                self._arm_locked()
        store._sweep_if_due()

    def _arm_locked(self) -> None:
        """Set the one timer for the next tick (the text's, else the heartbeats'); none when nothing streams."""
        if not self.members or self.loop is None or self.loop.is_closed():
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        store = self.store
        due = self.last + store.flush_interval if self.waiting else self.last_beat + store.beat_every
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = self.loop.call_later(max(due - store.clock(), 0.0), self._on_timer)
