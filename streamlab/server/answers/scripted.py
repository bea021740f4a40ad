"""A scripted token source: a fixed text at a fixed token rate, no model. For measuring the server alone.

``python -m streamlab serve --scripted-rate 20`` answers every request with the
same words, one every 50 ms, and loads no model. Everything else is the real
server: admission, the user's turn and the answer in the store, ``/log``, the
disconnect watch, every wire format. So a load test against it measures what
the server costs per stream and per event, not what a model costs per token
(which, on a CPU, would drown it). Its model name says so wherever it shows
(``/health``, ``/v1/models``, OpenAI's ``model`` field): ``scripted-20-tok/s``.

Each answer is a :class:`ScriptedGeneration`: the i-th piece is due at
``start + i / rate`` (absolute deadlines: a late tick does not push the later
ones back, so the schedule never drifts). It runs on the event loop as one
timer callback per stream (``loop.call_at``), no task and no thread: 5,000
streams are 5,000 entries in the loop's timer heap. The rivals in
:mod:`streamlab.lab.outside.rivals` serve this very class, so every server in the
benchmark streams the same words on the same schedule.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from streamlab.model.lifecycle import GenerationResult, Piece
from streamlab.model.generation import PieceQueue, PieceStream
from streamlab.model.stop_sequences import StopSequences
from streamlab.protocol.endings import MAX_TOKENS, STOP_SEQUENCE, STOPPED

if TYPE_CHECKING:
    from streamlab.server.config import ServerConfig
    from streamlab.server.answers.requests import GenerationRequest

DEFAULT_RATE = 20.0  # tokens per second: a laptop running a 1.5B model (see DESIGN.md)

# The script: short word-pieces, as a tokenizer makes them (a leading space, 1-9 characters), cycled.
SCRIPT = tuple(
    (
        "The keeper of the lighthouse wrote in his log every evening: the weather, the ships that"
        " passed, the state of the lamp and the oil, and now and then a line about the gulls."
    ).replace(" ", "\x00 ").split("\x00")
)


def script_piece(index: int) -> str:
    """The ``index``-th piece of the script (from 0), cycling through it for as long as asked."""
    return SCRIPT[index % len(SCRIPT)]


def script_text(tokens: int) -> str:
    """The whole text of an answer ``tokens`` pieces long (what every scripted answer of that length says)."""
    return "".join(script_piece(i) for i in range(tokens))


def scripted_name(rate: float) -> str:
    return f"scripted-{rate:g}-tok/s"


class ScriptedGeneration(PieceStream):
    """One scripted answer: ``max_tokens`` pieces, one every ``1/rate`` s on absolute deadlines.

    The interface of :class:`streamlab.model.generation.Generation` (``start``,
    ``pieces``, ``wait``, ``stop``, ``stopping``, ``tokens``, ``result``):
    ``stop()`` ends it at once with ``stopped`` (there is no thread to wait
    for); reaching ``max_tokens`` ends it with ``max_tokens``; a stop
    sequence of the request ends it with ``stop_sequence``, as a model's
    would. The first piece comes one period after ``start``, like a model's
    first token after reading a short prompt.
    """

    def __init__(
        self,
        rate: float = DEFAULT_RATE,
        max_tokens: int = 100,
        *,
        on_token: Callable[[int], None] | None = None,
        prompt_tokens: int = 0,
        stop_sequences: Sequence[str] = (),
    ) -> None:
        if rate <= 0:
            raise ValueError("the rate must be a positive number of tokens per second")
        self.rate = float(rate)
        self.period = 1.0 / self.rate
        self.max_tokens = int(max_tokens)
        self.on_token = on_token
        self.prompt_tokens = self.prompt_tokens_read = int(prompt_tokens)
        self.stops = StopSequences(stop_sequences)
        self.tokens = 0
        self.stopped_by: str | None = None
        self.result: GenerationResult | None = None
        self.done: asyncio.Event | None = None
        self._queue: PieceQueue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stopping = False
        self._t0 = 0.0  # loop.time() at start: piece i is due at _t0 + i * period
        self._started = 0.0
        self._texts: list[str] = []
        self._times: list[float] = []

    # -- control ---------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> "ScriptedGeneration":
        if self._loop is not None:
            return self
        self._loop = loop or asyncio.get_running_loop()
        self._queue, self.done = PieceQueue(), asyncio.Event()
        self._started, self._t0 = time.perf_counter(), self._loop.time()
        if self._stopping:  # stopped before it started
            self._finish(STOPPED)
        elif self.max_tokens <= 0:
            self._finish(MAX_TOKENS)
        else:
            self._timer = self._loop.call_at(self._t0 + self.period, self._tick)
        return self

    def stop(self, source: str = "stopped") -> None:
        """End now (safe to repeat, and from any thread): the reader is gone or said stop."""
        self._stop_on_loop(source, self._halt)  # not started yet: start() sees the flag

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- the timer ---------------------------------------------------------------
    def _halt(self) -> None:
        if self.result is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._finish(STOPPED)

    def _tick(self) -> None:
        """Piece number ``tokens + 1`` is due: hand it over, then book the next on the absolute schedule."""
        self._timer = None
        if self.result is not None:
            return
        assert self._loop is not None and self._queue is not None
        if not self.has_room():
            # The reader is max_queued pieces behind: make nothing, look again a period later.
            # The schedule slips with the wait, as a model that waited would.
            self._t0 += self.period
            self._timer = self._loop.call_at(self._t0 + (self.tokens + 1) * self.period, self._tick)
            return
        if self.result is not None:  # has_room() stopped it (slow_reader): it has ended
            return
        self.tokens += 1
        now = time.perf_counter()
        self._times.append(now)
        if self.on_token is not None:
            self.on_token(self.tokens)
        text = script_piece(self.tokens - 1)
        if self.stops:
            text = self.stops.feed(text)
        if text:
            self._texts.append(text)
            self.backlog.put()
            self._queue.put_nowait(Piece(text, now, self.tokens))
        if self.stops.matched is not None:
            self._finish(STOP_SEQUENCE)
        elif self.tokens >= self.max_tokens:
            self._finish(MAX_TOKENS)
        else:
            self._timer = self._loop.call_at(self._t0 + (self.tokens + 1) * self.period, self._tick)

    def _finish(self, reason: str) -> None:
        assert self._queue is not None and self.done is not None
        if self.stops:
            tail = self.stops.flush()
            if tail:
                self._texts.append(tail)
                self.backlog.put()
                self._queue.put_nowait(Piece(tail, time.perf_counter(), self.tokens))
        self.result = GenerationResult(
            tokens=self.tokens,
            stop_reason=reason,
            text="".join(self._texts),
            prompt_tokens=self.prompt_tokens,
            token_times=self._times,
            started=self._started,
            ended=time.perf_counter(),
            stop_sequence=self.stops.matched,
        )
        self._queue.put_nowait(None)
        self.done.set()


class ScriptedEngine:
    """An engine with no model: every generation is a :class:`ScriptedGeneration` at ``rate`` tokens/s.

    A prompt's tokens are counted as its words (there is no tokenizer), for
    ``/log``. Seed, temperature and top_p change nothing: the script is the
    same for every request; ``max_tokens`` and ``stop`` are honoured.
    """

    kind = "scripted"
    context_length = None

    def __init__(self, rate: float = DEFAULT_RATE) -> None:
        if rate <= 0:
            raise ValueError("--scripted-rate must be a positive number of tokens per second")
        self.rate = float(rate)

    @property
    def name(self) -> str:
        return scripted_name(self.rate)

    async def start(self) -> None:
        """Nothing to load."""

    async def health(self) -> None:
        return None  # a script in this process

    def prompt_ids(self, messages: Sequence[dict[str, str]], *, chat: bool) -> list[int]:
        """One stand-in id per word of the conversation (nothing reads them; ``/log`` counts them)."""
        words = sum(len(m["content"].split()) for m in messages)
        return [0] * max(words, 1)

    def generation(self, req: GenerationRequest, prompt_ids: list[int], messages: Any,
                   config: ServerConfig, on_token: Callable[[int], None]) -> ScriptedGeneration:
        return ScriptedGeneration(self.rate, req.max_tokens, on_token=on_token, prompt_tokens=len(prompt_ids),
                                  stop_sequences=req.stop)
