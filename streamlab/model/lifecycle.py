"""One generation's lifecycle, written down in one place: its phases, the moves between them, what each token becomes.

Two drivers run the model for a :class:`streamlab.model.generation.Generation`:
its own thread, and :class:`streamlab.model.batching.BatchedEngine`, whose one
loop steps many generations together. They differ in how the forward passes
are made, and must not differ in anything a reader can see: when the clock
starts, which token ends the answer, what text each token releases, what the
result says. So everything that decides those lives here, and both drivers
move a generation only through the public methods below. Like h11's state
machine, a :class:`Lifecycle` knows nothing of sockets, threads, models or
event loops: the driver tells it what happened, it answers with what follows.

The phases (:class:`Phase`), and the moves that change them::

    CREATED --begin()--> READING --accept(token)--> DECODING --accept(token)--> DECODING
                          |                            |
                          |  check() or accept() finds a reason to end: ENDING
                          v                            v
    (any phase but ENDED) --end(reason)--> ENDED

- ``begin()`` starts the clock; ``prompt_chunks()`` and ``chunk_read(n)``
  are the prompt's reading, and the first ``accept`` is only allowed once all
  of it is read;
- ``check()``, before each forward pass (prompt chunk or decode step), turns a
  stop request, ``max_tokens`` or the injected fault into the reason to end;
- ``accept(token)`` turns one sampled token into the text to hand over, or
  into nothing yet (the detokenizer holds half a character, a stop sequence
  may be starting), and says whether the answer ends there;
- ``end(reason)`` flushes what was held and writes the result, once.

A move the phase does not allow raises :class:`LifecycleError`: a driver's
bug said where it happens, not found later as a garbled or doubled answer.
``stop()`` is the one call from any thread; it moves nothing, it is a request
that the driver's next ``check()`` turns into ``stopped``.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from streamlab.model.detokenizer import Detokenizer, NaiveDetokenizer
from streamlab.model.stop_sequences import StopSequences
from streamlab.protocol.endings import EOS, ERROR, MAX_TOKENS, STOP_SEQUENCE, STOPPED

# The reasons a generation itself can give for its end (the server layer adds its own signals).
GENERATION_ENDINGS = frozenset({EOS, MAX_TOKENS, STOPPED, ERROR, STOP_SEQUENCE})


class Phase(enum.Enum):
    CREATED = "created"  # made, not begun: no clock yet
    READING = "reading"  # reading the prompt, a chunk per forward pass
    DECODING = "decoding"  # a token per forward pass
    ENDING = "ending"  # a reason to end is known: end() is the only move left
    ENDED = "ended"  # the result is written; nothing more happens


class LifecycleError(RuntimeError):
    """A driver asked for a move the generation's phase does not allow."""


class InjectedFault(RuntimeError):
    """Raised on purpose by ``fail_after`` so tests can watch a stream fail mid-way."""


@dataclass(frozen=True)
class Piece:
    """Text safe to send, with the clock time it was made and the token count so far."""

    text: str
    time: float
    tokens: int


@dataclass
class GenerationResult:
    tokens: int
    stop_reason: str
    text: str
    error: str | None = None
    prompt_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    stop_sequence: str | None = None  # the one that ended it, when stop_reason is "stop_sequence"


@dataclass(frozen=True)
class Accepted:
    """What one token became: a piece to hand over (None while text is held back), and why it ends, if it does."""

    piece: Piece | None
    ending: str | None


class Lifecycle:
    """The state of one generation, and the only code that changes it.

    ``eos_ids``: the tokens that end the answer (none, to ignore end-of-sequence).
    ``prefill_chunk``: prompt tokens per forward pass (0 or None: all in one).
    ``fail_after``: raise :class:`InjectedFault` from ``check()`` once that
    many tokens are out. ``stop_sequences``: see :mod:`streamlab.model.stop_sequences`.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int = 100,
        eos_ids: Iterable[int] = (),
        fail_after: int | None = None,
        prefill_chunk: int | None = 0,
        stop_sequences: Sequence[str] = (),
        naive_detokenizer: bool = False,
    ) -> None:
        if prefill_chunk is not None and int(prefill_chunk) < 0:
            raise ValueError("prefill_chunk must be a positive number of tokens, or 0/None for one pass")
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = int(max_tokens)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.fail_after = fail_after
        self.prefill_chunk = int(prefill_chunk or 0)
        self.detokenizer = (NaiveDetokenizer if naive_detokenizer else Detokenizer)(tokenizer, self.prompt_ids)
        self.stops = StopSequences(stop_sequences)
        self.phase = Phase.CREATED
        self.ending: str | None = None  # the reason found, in ENDING and ENDED
        self.prompt_tokens_read = 0
        self.tokens = 0  # tokens counted (an end-of-sequence token is not one)
        self.token_ids: list[int] = []
        self.token_times: list[float] = []
        self.started = 0.0
        self.result: GenerationResult | None = None
        self._texts: list[str] = []
        self._stop = threading.Event()

    def __repr__(self) -> str:
        return f"<Lifecycle {self.phase.value} tokens={self.tokens} prompt={self.prompt_tokens_read}/{len(self.prompt_ids)}>"

    def _expect(self, move: str, *phases: Phase) -> None:
        if self.phase not in phases:
            allowed = " or ".join(p.name for p in phases)
            raise LifecycleError(f"{move} in phase {self.phase.name}: only allowed in {allowed}")

    # -- from any thread -------------------------------------------------------------

    def stop(self) -> None:
        """Ask for the end: the driver's next ``check()`` says ``stopped`` (before a token, or a prompt chunk)."""
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def wait_for_stop(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (a pause between tokens) unless a stop comes first; True if one did."""
        return self._stop.wait(seconds)

    # -- the driver's moves ------------------------------------------------------------

    def begin(self) -> None:
        """The clock starts: the wait for a driver's first forward pass is part of the answer's time."""
        self._expect("begin()", Phase.CREATED)
        self.started = time.perf_counter()
        self.phase = Phase.READING

    def prompt_chunks(self) -> list[list[int]]:
        """The prompt still to read, one list per forward pass; ValueError for a prompt with no tokens.

        An empty prompt would leave nothing for the first token to follow: it
        is an error the driver ends the answer with, not a hang.
        """
        self._expect("prompt_chunks()", Phase.READING)
        if not self.prompt_ids:
            raise ValueError("the prompt has no tokens")
        ids = self.prompt_ids[self.prompt_tokens_read :]
        size = self.prefill_chunk or len(ids)
        return [ids[i : i + size] for i in range(0, len(ids), size)]

    def chunk_read(self, tokens: int) -> None:
        """``tokens`` more of the prompt went through the model (counted after the pass, as readers see it)."""
        self._expect("chunk_read()", Phase.READING)
        if tokens < 0 or self.prompt_tokens_read + tokens > len(self.prompt_ids):
            raise LifecycleError(
                f"chunk_read({tokens}) with {self.prompt_tokens_read} of {len(self.prompt_ids)} prompt tokens read"
            )
        self.prompt_tokens_read += tokens

    def check(self) -> str | None:
        """Before a forward pass: why to end now (``max_tokens``, ``stopped``), or None to go on.

        Raises :class:`InjectedFault` once ``fail_after`` tokens are out, as a
        failing model would raise in the middle of an answer: the driver's own
        error path is what that experiment watches.
        """
        self._expect("check()", Phase.READING, Phase.DECODING)
        if self.tokens >= self.max_tokens:
            return self._ending(MAX_TOKENS)
        if self._stop.is_set():
            return self._ending(STOPPED)
        if self.fail_after is not None and self.tokens >= self.fail_after:
            raise InjectedFault(f"injected fault after {self.tokens} tokens")
        return None

    def accept(self, token: int) -> Accepted:
        """One sampled token: counted, its text released or held back; ``ending`` says if the answer ends here."""
        if self.phase is Phase.READING and self.prompt_tokens_read < len(self.prompt_ids):
            raise LifecycleError(
                f"accept() with {self.prompt_tokens_read} of {len(self.prompt_ids)} prompt tokens read"
            )
        self._expect("accept()", Phase.READING, Phase.DECODING)
        self.phase = Phase.DECODING
        if token in self.eos_ids:
            return Accepted(None, self._ending(EOS))
        self.tokens += 1
        self.token_ids.append(token)
        now = time.perf_counter()
        self.token_times.append(now)
        text = self.stops.feed(self.detokenizer.push(token))
        piece = None
        if text:
            self._texts.append(text)
            piece = Piece(text, now, self.tokens)
        return Accepted(piece, self._ending(STOP_SEQUENCE) if self.stops.matched is not None else None)

    def end(self, reason: str, error: str | None = None) -> tuple[Piece | None, GenerationResult]:
        """The last text held back (None if there is none) and the result: once, in any phase but ENDED.

        ``reason`` is one of :data:`GENERATION_ENDINGS`; when the last
        characters complete a stop sequence, an ``eos`` or ``max_tokens`` end
        becomes ``stop_sequence``, as the text says.
        """
        self._expect("end()", Phase.CREATED, Phase.READING, Phase.DECODING, Phase.ENDING)
        if reason not in GENERATION_ENDINGS:
            raise ValueError(f"unknown generation ending {reason!r}: one of {sorted(GENERATION_ENDINGS)}")
        if self.phase is Phase.CREATED:  # refused before any driver began it: it took no time
            self.started = time.perf_counter()
        tail = self.stops.feed(self.detokenizer.flush())
        if self.stops.matched is not None and reason in (EOS, MAX_TOKENS):
            reason = STOP_SEQUENCE
        tail += self.stops.flush()
        piece = None
        if tail:
            self._texts.append(tail)
            piece = Piece(tail, time.perf_counter(), self.tokens)
        self.phase, self.ending = Phase.ENDED, reason
        self.result = GenerationResult(
            tokens=self.tokens,
            stop_reason=reason,
            text="".join(self._texts),
            error=error,
            prompt_tokens=len(self.prompt_ids),
            token_times=self.token_times,
            started=self.started,
            ended=time.perf_counter(),
            stop_sequence=self.stops.matched,
        )
        return piece, self.result

    def _ending(self, reason: str) -> str:
        self.phase, self.ending = Phase.ENDING, reason
        return reason
