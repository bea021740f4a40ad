"""Run the model in a thread and hand text pieces to asyncio as they are made.

A forward pass takes tens of milliseconds of pure computation. Run on the event
loop it would freeze every connection the server holds (no pings answered, no
disconnects noticed), so each generation gets a thread. The thread hands each
piece over with ``loop.call_soon_threadsafe`` (an ``asyncio.Queue`` is not
thread-safe), and checks a stop flag before every token: that flag is how a
server that notices a departed client stops spending compute on it.

The prompt is read in chunks of :data:`PREFILL_CHUNK` tokens, each its own turn
with the model lock, the KV cache carried from one to the next. Read in one
forward pass, a 4,000-token prompt holds the model for ~10-30 s on a 2-core
CPU: every other stream freezes for that long, and a reader who leaves is only
noticed at the end. In chunks, the other streams' tokens slip in between (the
lock is fair: see :class:`streamlab.model.loading.FairLock`) and the stop flag is
checked before each chunk. The price is more work in all, about a quarter on a
CPU at the default size: see :data:`PREFILL_CHUNK` and ``benchmarks/prefill.py``.

The thread is one of two drivers (the other is the batched engine): what
each token becomes, and why an answer ends, is :mod:`streamlab.model.lifecycle`'s,
so that both give a reader the same answer.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import deque
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from streamlab.net.aio import run_sync
from streamlab.model.backlog import Backlog
from streamlab.model.lifecycle import GenerationResult, Lifecycle, Piece  # callers import Piece and the result from here too
from streamlab.model.sampling import Sampler
from streamlab.model.openmp import release_idle_team
from streamlab.protocol.endings import EOS, ERROR, SLOW_READER, STOPPED

# Prompt tokens per forward pass while reading a prompt (0 or None: all in one pass).
# Measured on a 2-core CPU with SmolLM2-135M, a 4,000-token prompt, with
# `python benchmarks/prefill.py` (2026-12-01; the machine is shared, figures move
# by ~30% between runs): one pass 17.5 s, and a 20-token request arriving 1 s in
# waited 15.8 s for its first token. In chunks of 256: 23.0 s (+31%: smaller
# matrix products, and attention that cannot use the one-pass causal kernel), no
# turn with the lock over 1.9 s, the other request's first token in 0.6 s, a
# stop obeyed in 0.5 s (one chunk). Chunks of 512 cost +12% but hold the lock up
# to 3.3 s a turn; chunks of 128 hold it 1.4 s but cost +53%. On a GPU every
# figure shrinks a hundredfold and any of these sizes is cheap.
PREFILL_CHUNK = 256
ROOM_POLL = 0.02  # seconds between looks for room, for a source on the event loop held back by its reader
# The longest a driver waits, after handing a piece to a reader who was waiting for it, for the event loop
# to have written it (see Generation.await_reader). On the shared 2-core machine at a load of 5, the loop
# took up to 0.8 ms (p90) to write a piece, and 1 wait in 260 ran out at 2 ms: a loop busier than that
# is not waited for, and a step never loses more than this to it.
HANDOVER_WAIT = 0.002


def chat_template_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of a conversation in the model's chat template, ending where the assistant's turn begins."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # some versions return a BatchEncoding
        ids = ids["input_ids"]
    return list(map(int, ids))


def encode_prompt(tokenizer: Any, prompt: str, *, chat: bool = True) -> list[int]:
    """Token ids for ``prompt``: wrapped in the model's chat template when it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        return chat_template_ids(tokenizer, [{"role": "user", "content": prompt}])
    return list(map(int, tokenizer(prompt)["input_ids"]))


class PieceQueue:
    """The pieces handed to the event loop and not yet taken: ``put_nowait``, ``get_nowait`` and ``ready()``.

    ``ready()`` is a future that is done once an item is there, so that a
    reader can wait for the next piece *or* for a keep-alive to fall due
    with one future and one timer. With ``asyncio.Queue`` that wait needs
    ``get()`` wrapped in a task for every piece (a task survives a timeout;
    ``wait_for`` would cancel the get): at a thousand streams those tasks
    were the biggest share of the server's CPU per event. A future resolved
    by a timer is its reader's own: ``put_nowait`` wakes the others.
    """

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiters: list[asyncio.Future] = []
        self._caught_up: threading.Event | None = None  # set when a reader waits on an empty queue

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    def get_nowait(self) -> Any:
        """The oldest item; ``asyncio.QueueEmpty`` when there is none."""
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    def ready(self) -> asyncio.Future:
        """A future of this loop, done (True) once an item is queued; done already if one is."""
        waiter = asyncio.get_running_loop().create_future()
        if self._items:
            waiter.set_result(True)
        else:
            self._waiters.append(waiter)
            if self._caught_up is not None:
                self._caught_up.set()
        return waiter

    def empty(self) -> bool:
        return not self._items

    # -- for a producer on another thread -----------------------------------------
    def reader_waiting(self) -> bool:
        """Whether a reader is parked on ``ready()`` now (a hint, read from any thread)."""
        return any(not waiter.done() for waiter in self._waiters)

    def caught_up(self) -> threading.Event:
        """An event ``ready()`` sets each time a reader finds the queue empty: all it was given is taken.

        A producer on another thread clears it, hands a piece over, and waits
        on it (see ``Generation.await_reader``). Made on the first call, so a
        queue nobody watches pays nothing per piece.
        """
        if self._caught_up is None:
            self._caught_up = threading.Event()
        return self._caught_up


class PieceStream:
    """What a server reads from anything that makes an answer: ``pieces()`` as they come, ``wait()`` for the end.

    A subclass puts each ``Piece`` on ``self._queue``, a :class:`PieceQueue` (in the event loop),
    then ``None``, sets ``self.result`` and then ``self.done``. Both
    :class:`Generation` (a model in a thread) and the relay's
    ``UpstreamGeneration`` (an HTTP stream from another server) are one.

    Backpressure, for every kind of source (see :mod:`streamlab.model.backlog`):
    ``set_backpressure(max_queued, slow_reader_timeout)`` bounds the pieces
    handed over and not yet taken by the reader. A subclass counts each piece
    it hands over with ``self.backlog.put()`` (``pieces()`` counts it taken)
    and, before making the next one, lets the bound hold it back: a thread of
    its own blocks in ``_wait_for_room()``, a task on the event loop awaits
    ``_room()``, an engine that steps many answers asks ``has_room()``. Waiting
    ``slow_reader_timeout`` seconds in all stops the answer with ``slow_reader``.
    """

    _queue: PieceQueue | None = None
    done: asyncio.Event | None = None
    result: GenerationResult | None = None
    stopped_by: str | None = None  # the first reason it was told to stop (a reader gone, a cancel, slow_reader)
    _stopping: bool = False  # a stop was asked, for a source that lives on the event loop (``_stop_on_loop``)
    # A relay's: its upstream must answer before the reader's response opens (``answered``), and a failure
    # there is told as a gateway tells it (``gateway_status``: 502, 504). A source here has nothing to wait for.
    relayed: bool = False
    gateway_status: int | None = None

    async def answered(self) -> None:
        """Until the source has begun to answer: a relay's upstream, its response head; a model here, at once."""
        return None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> "PieceStream":
        raise NotImplementedError

    def stop(self, source: str = STOPPED) -> None:
        raise NotImplementedError

    @property
    def stopping(self) -> bool:
        raise NotImplementedError

    def _stop_on_loop(self, source: str, halt: Callable[[], None]) -> None:
        """``stop()`` for a source that lives on the event loop (no thread): note why, then ``halt`` once, there.

        Any thread may call ``stop()``; the first reason given is the one
        kept. Before ``start`` only the flag is set (``start`` looks at it).
        """
        if self.stopped_by is None:
            self.stopped_by = source
        if self._stopping:
            return
        self._stopping = True
        if getattr(self, "_loop", None) is not None:
            self._call_on_loop(halt)

    def _call_on_loop(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the source's event loop: now if this is its thread, else as soon as it can.

        A closed loop has nobody left to tell, and is ignored.
        """
        loop = getattr(self, "_loop", None)
        assert loop is not None
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            callback()
            return
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop is closed: nothing is left to stop
            pass

    # -- backpressure ------------------------------------------------------------
    def set_backpressure(self, max_queued: int | None = None, slow_reader_timeout: float | None = None) -> "PieceStream":
        """Run at most ``max_queued`` pieces ahead of the reader; stop once that has cost ``slow_reader_timeout`` s of waiting.

        None for either: no bound (today's default for a bare source), no
        timeout. Call it before ``start``; returns the source.
        """
        self._backlog = Backlog(max_queued, slow_reader_timeout)
        return self

    @property
    def backlog(self) -> Backlog:
        """The counters and the bound: pieces queued now, the most queued, when the current wait began."""
        backlog = self.__dict__.get("_backlog")
        if backlog is None:  # unbounded; setdefault keeps one, whichever thread asks first
            backlog = self.__dict__.setdefault("_backlog", Backlog())
        return backlog

    def has_room(self) -> bool:
        """Whether the next piece may be made now: never blocks (for an engine that steps many answers at once).

        False: leave this answer out of the step, its reader is ``max_queued``
        pieces behind. Once it has waited ``slow_reader_timeout`` seconds in
        all it is stopped (``slow_reader``) and the answer is True again: step it, so
        that it sees its stop and ends. A stopping source always has room.
        """
        backlog = self.backlog
        if self.stopping:
            backlog.end_wait()
            return True
        if backlog.check():
            return True
        if backlog.overdue():
            self.stop(SLOW_READER)
            backlog.end_wait()
            return True
        return False

    def _wait_for_room(self) -> None:
        """Block the source's own thread while its reader is ``max_queued`` pieces behind (never holding a lock).

        Returns when the reader takes a piece or leaves, when the source is
        stopped (its ``stop`` calls ``self.backlog.wake()``), or after
        ``slow_reader_timeout``, having stopped it with ``slow_reader``.
        """
        if not self.backlog.wait(lambda: self.stopping):
            self.stop(SLOW_READER)

    async def _room(self) -> None:
        """``_wait_for_room`` for a source that runs on the event loop (the relay): it looks every ``ROOM_POLL`` s."""
        while not self.has_room():
            await asyncio.sleep(ROOM_POLL)

    # -- the reader's side ---------------------------------------------------------
    async def pieces(self, until: Callable[[asyncio.Future], Awaitable[bool]] | None = None) -> AsyncIterator[Piece | None]:
        """Yield each piece as it is made; ``self.result`` is set at the end.

        ``until`` waits for the next piece on the caller's terms: given the
        queue's ``ready()`` future, it returns True once that is done, or False
        to give up for now (a keep-alive is due), and then ``None`` is yielded
        before waiting again. Without it, only pieces come.
        """
        self.start()
        queue = self._queue
        assert queue is not None
        backlog = self.backlog
        ended = False
        try:
            while True:
                if queue.empty():
                    ready = queue.ready()
                    if until is None:
                        await ready
                    elif not await until(ready):
                        yield None
                        continue
                item = queue.get_nowait()
                if item is None:
                    queue.put_nowait(None)  # a later reader ends too, instead of waiting forever
                    ended = True
                    return
                backlog.take()
                yield item
        finally:
            if not ended:
                backlog.release()  # the reader left early: whatever runs on (--naive) runs for nobody, unbounded

    def __aiter__(self) -> AsyncIterator[Piece]:
        return self.pieces()

    async def wait(self) -> GenerationResult:
        """Wait for the end (whether or not anyone reads the pieces)."""
        self.start()
        assert self.done is not None
        await self.done.wait()
        self._after_end()
        assert self.result is not None
        return self.result

    def _after_end(self) -> None:
        """Called once the end is known, before the result is returned (a thread is joined here)."""

class Generation(PieceStream):
    """One answer being generated: start it, iterate its pieces, stop it.

    ``prefill_chunk`` is how many prompt tokens go through the model per
    forward pass (and per turn with the lock); 0 or None reads the prompt in one
    pass. ``prompt_tokens_read`` counts the prompt tokens read so far.

    ``pauses`` maps a token count to seconds of silence after that token (for
    the keep-alive experiments); ``fail_after`` raises an error after that many
    tokens (for the errors-after-success experiments); ``token_delay`` adds a
    fixed delay per forward pass, standing in for a slower model.

    ``stop_sequences`` end the answer where one of them appears in the text,
    which is cut just before it (``stop_reason`` ``stop_sequence``, and
    ``result.stop_sequence`` names it): see :mod:`streamlab.model.stop_sequences`.

    ``scheduler``: something with ``submit(generation)`` that runs the model
    for it instead of a thread of its own (a
    :class:`streamlab.model.batching.BatchedEngine`, which steps every generation it
    holds in one batch). Either driver moves the generation through the same
    public moves (``begin``, ``prompt_chunks``, ``chunk_read``, ``check``,
    ``accept``, ``end``): they are :class:`~streamlab.model.lifecycle.Lifecycle`'s,
    plus the hand-over of what they release, so the two cannot differ in what
    a reader gets. ``phase`` says where it stands.

    ``observers``: callables given each :class:`Piece` as it is handed over,
    on the driver's thread, before any wait for the reader (to time pieces
    from the inside, as ``streamlab.lab.experiments.overhead`` does). They must be quick:
    the model waits for them.
    """

    def __init__(
        self,
        lm: Any,
        prompt: str | None = None,
        *,
        prompt_ids: Sequence[int] | None = None,
        max_tokens: int = 100,
        seed: int = 0,
        top_p: float = 0.9,
        temperature: float = 0.7,
        repetition_penalty: float = 1.1,
        chat: bool = True,
        ignore_eos: bool = False,
        naive_detokenizer: bool = False,
        pauses: dict[int, float] | None = None,
        fail_after: int | None = None,
        token_delay: float = 0.0,
        on_token: Callable[[int], None] | None = None,
        prefill_chunk: int | None = PREFILL_CHUNK,
        stop_sequences: Sequence[str] = (),
        scheduler: Any = None,
    ) -> None:
        if prompt_ids is None:
            if prompt is None:
                raise ValueError("give a prompt or prompt_ids")
            prompt_ids = encode_prompt(lm.tokenizer, prompt, chat=chat)
        self.lm = lm
        self.lifecycle = Lifecycle(
            lm.tokenizer,
            prompt_ids,
            max_tokens=max_tokens,
            eos_ids=() if ignore_eos else lm.eos_token_ids,
            fail_after=fail_after,
            prefill_chunk=prefill_chunk,
            stop_sequences=stop_sequences,
            naive_detokenizer=naive_detokenizer,
        )
        self.sampler = Sampler(seed=seed, top_p=top_p, temperature=temperature, repetition_penalty=repetition_penalty)
        self.pauses = dict(pauses or {})
        self.token_delay = token_delay
        self.on_token = on_token
        self.observers: list[Callable[[Piece], None]] = []
        self.stopped_by: str | None = None
        self.result: GenerationResult | None = None
        self._queue: PieceQueue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.done: asyncio.Event | None = None
        self.scheduler = scheduler
        self._reader_cue: threading.Event | None = None  # set while a handed-over piece awaits its waiting reader

    # What the lifecycle counts, read by the server, the drivers and the tests.
    phase = property(lambda self: self.lifecycle.phase)
    prompt_ids = property(lambda self: self.lifecycle.prompt_ids)
    prefill_chunk = property(lambda self: self.lifecycle.prefill_chunk)
    max_tokens = property(lambda self: self.lifecycle.max_tokens)
    prompt_tokens_read = property(lambda self: self.lifecycle.prompt_tokens_read)
    tokens = property(lambda self: self.lifecycle.tokens)
    token_ids = property(lambda self: self.lifecycle.token_ids)

    # -- control -------------------------------------------------------------
    def stop(self, source: str = STOPPED) -> None:
        """Ask the driver to stop before its next token or prompt chunk (safe from any thread)."""
        if self.stopped_by is None:
            self.stopped_by = source
        self.lifecycle.stop()
        self.backlog.wake()  # a hand-over waiting for room sees the flag now

    @property
    def stopping(self) -> bool:
        return self.lifecycle.stop_requested

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> "Generation":
        if self.done is not None:
            return self
        self._loop = loop or asyncio.get_running_loop()
        self._queue = PieceQueue()
        self.done = asyncio.Event()
        if self.scheduler is not None:
            self.scheduler.submit(self)  # its loop makes the moves below
            return self
        release_idle_team()  # this thread's idle OpenMP workers would slow the model's (model.openmp)
        self._thread = threading.Thread(target=self._run, name="streamlab-generation", daemon=True)
        self._thread.start()
        return self

    def _after_end(self) -> None:
        if self._thread is not None:
            self._thread.join()  # it has handed everything over and is returning

    # -- the drivers' moves: this thread's loop below, and streamlab.model.batching ------
    def begin(self) -> None:
        """Start the clock (``result.started``), before the driver's first forward pass."""
        self.lifecycle.begin()

    def prompt_chunks(self) -> list[list[int]]:
        """The prompt still to read, a list of ids per forward pass (ValueError for an empty prompt)."""
        return self.lifecycle.prompt_chunks()

    def chunk_read(self, tokens: int) -> None:
        """Count a prompt chunk read, once its forward pass is done."""
        self.lifecycle.chunk_read(tokens)

    def check(self) -> str | None:
        """Before each forward pass: why to end now (max_tokens, stopped), or None; raises the injected fault."""
        return self.lifecycle.check()

    def accept(self, token: int) -> str | None:
        """One sampled token, its text handed over if any is released: why the answer ends here, or None."""
        accepted = self.lifecycle.accept(token)
        if accepted.ending == EOS:
            return EOS
        if self.on_token is not None:
            self.on_token(self.lifecycle.tokens)
        if accepted.piece is not None:
            self._hand_over(accepted.piece)
        return accepted.ending

    def end(self, reason: str, error: str | None = None) -> GenerationResult:
        """The last text, the result, the end of the pieces, ``done``: once, whichever driver ran the model."""
        tail, self.result = self.lifecycle.end(reason, error)
        if tail is not None:
            self._hand_over(tail)
        self._hand_over(None)
        self._finish()
        return self.result

    # -- to the event loop ---------------------------------------------------
    def _hand_over(self, item: Piece | None) -> None:
        assert self._loop is not None and self._queue is not None
        if item is not None:
            for observer in self.observers:
                observer(item)
            if threading.current_thread() is self._thread:
                # Backpressure: the model's own thread waits (after the forward pass, not holding
                # lm.lock) while the reader is max_queued pieces behind. An engine stepping many
                # answers never waits here: it asks has_room() before stepping this one.
                self._wait_for_room()
            self.backlog.put()
            queue = self._queue
            if queue.reader_waiting():
                cue = queue.caught_up()
                cue.clear()  # before the loop can see the piece: its reader sets it again once it took it
                self._reader_cue = cue
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is left to read
            self._reader_cue = None

    def await_reader(self, timeout: float | None = None) -> None:
        """After a hand-over, let the event loop write the piece before the model goes on: at most ``timeout`` s.

        Why a driver waits: the loop's writing and the model's next forward
        pass need the same interpreter lock, and torch lets go of it and
        takes it back around every operation. Racing the forward pass, the
        loop needs the lock back after each of its own system calls (the
        wake-up's read, the poll, the write) and gets it when the model
        happens to let go; the model waits for the loop too (profiled on the
        2-core machine under load, its wake-up of the loop, a socket send,
        took 1.3-2.3 ms a piece). Parked here, the lock released, the model
        lets the loop write at once, for the loop's own 0.1-0.8 ms. Measured
        side by side in one run under load (``HANDOVER_WAIT`` 0 against
        2 ms), the piece-to-reader median went from 1.20 to 0.63 ms on
        ``/stream`` and from 0.94 to 0.67 ms on ``/ws``.

        It waits only when a reader was already waiting for this piece (a
        reader that is busy, or absent, is not waited for), and never past
        ``timeout`` (None: :data:`HANDOVER_WAIT`). A driver that handed several
        pieces over waits for each, on one deadline.
        """
        cue, self._reader_cue = self._reader_cue, None
        if timeout is None:
            timeout = HANDOVER_WAIT
        if cue is not None and timeout > 0:
            cue.wait(timeout)

    def _finish(self) -> None:
        assert self._loop is not None and self.done is not None
        try:
            self._loop.call_soon_threadsafe(self.done.set)
        except RuntimeError:
            pass

    # -- the thread ----------------------------------------------------------
    def _run(self) -> None:
        import torch

        lm = self.lm
        self.begin()
        # transformers 5 renamed the KV cache argument from past_key_values to cache.
        params = inspect.signature(lm.model.forward).parameters
        cache_arg = "cache" if "cache" in params else "past_key_values"
        # Only the last position's logits are needed (and only the last chunk's): skip projecting the rest.
        extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        past = None

        def forward(ids: list[int], prompt: bool = False) -> Any:
            """One forward pass, one turn with the (fair) lock; returns the last position's logits.

            A prompt chunk is counted read (``prompt_tokens_read``) before the lock is let go, so whoever
            takes the model next sees how much of this prompt it waited for.
            """
            nonlocal past
            inputs = torch.tensor([ids], dtype=torch.long, device=lm.device)
            with lm.lock, torch.inference_mode():
                out = lm.model(input_ids=inputs, use_cache=True, **{cache_arg: past}, **extra)
                if prompt:
                    self.chunk_read(len(ids))
            past = out[cache_arg] if cache_arg in out else out.past_key_values
            return out.logits[0, -1]

        error = None
        token: int | None = None  # the last token made, fed back in; None until the prompt is read
        try:
            while (reason := self.check()) is None:
                if token is None:
                    for chunk in self.prompt_chunks():
                        logits = forward(chunk, prompt=True)
                        if (reason := self.check()) is not None:  # before the next chunk, and before the first token
                            break
                    if reason is not None:  # stopped during the prompt, or just after: no token for a departed reader
                        break
                else:
                    logits = forward([token])
                if self.token_delay:
                    time.sleep(self.token_delay)  # a slower model: once per pass, as the batched engine sleeps
                token = self.sampler(logits, self.token_ids)
                reason = self.accept(token)
                if reason is not None:
                    break
                self.await_reader()
                pause = self.pauses.get(self.tokens)
                if pause:
                    self.lifecycle.wait_for_stop(pause)
        except Exception as exc:  # noqa: BLE001 - any failure ends the stream with a reason
            reason, error = ERROR, f"{type(exc).__name__}: {exc}"
        past = None  # the KV cache can be large: let it go before the result is read
        self.end(reason, error)


def generate_text(lm: Any, prompt: str | None = None, **kwargs: Any) -> GenerationResult:
    """Generate a whole answer synchronously (scripts, notebooks, tests); ``prompt_ids=`` works too."""

    async def main() -> GenerationResult:
        gen = Generation(lm, prompt, **kwargs)
        async for _ in gen:
            pass
        return await gen.wait()

    return run_sync(main())
