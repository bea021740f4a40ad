"""One loop steps every generation together: continuous batching on one model.

With a thread per generation (:class:`streamlab.model.generation.Generation`'s own
way), N readers take turns on the model lock, one forward pass of one token
each: N passes per round, each reading every weight of the model once. On a
CPU (or a GPU) a decode step is bound by reading the weights, not by
arithmetic, so a pass over 8 rows costs little more than a pass over one.
:class:`BatchedEngine` runs one loop for all of them. Each turn of the loop:

1. newcomers are taken in; every stop flag is checked (a reader who left
   costs at most the step already under way);
2. if some generation is still reading its prompt, **one chunk** of it
   (``prefill_chunk`` tokens, batch 1, its own KV cache), round-robin among
   them: a long prompt delays the others by one chunk per turn, never by all
   of it (short prompts share the turn, up to one chunk's worth of tokens);
3. **one decode step** for every generation that is decoding, together:
   ``input_ids`` ``[B, 1]``, one left-padded KV cache for the batch, a 2D
   attention mask with 0 for the padding, each row's own ``position_ids``
   (while the batch is *dense*, no padding and no holes, as a batch of one
   nearly always is, neither: the step is then a bare loop's);
   each row sampled with its generation's own :class:`Sampler` (so an answer
   is the one its seed gives alone: exactly in float32; in a narrow decode
   format, whose products cast their input to bfloat16, up to a near-tie
   that a batch's round-off tips the other way now and then) and handed to
   ``Generation.accept``, the very move the thread makes for each token.

The loop moves each generation only through its public lifecycle
(``begin``, ``prompt_chunks``, ``chunk_read``, ``check``, ``accept``, ``end``:
see :mod:`streamlab.model.lifecycle`), as the generation's own thread does:
what a reader gets cannot depend on which of the two ran the model.

The batch's cache is rebuilt only when its membership changes (a prompt read,
an answer ended): each row's cache is taken out, stripped of its padding and
padded again to the new longest row. Otherwise it grows by one column a step.
A row that should not get a token this step (its reader is not keeping up:
``has_room()`` is False; or it sits in a ``pauses`` silence) rides along as a
masked hole rather than forcing a rebuild; after :data:`MAX_HOLES` holes in a
row it is parked out of the batch, and rejoins when it may go on.

The engine holds ``lm.lock`` for each forward pass, so generations run by
threads on the same model and this loop never use the model at once. Its
thread exits after :data:`IDLE_EXIT` seconds with nothing to do and is
started again by the next ``submit``.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from streamlab.model.generation import HANDOVER_WAIT
from streamlab.model.openmp import release_idle_team
from streamlab.protocol.endings import ERROR

# A row that misses this many steps in a row (its reader is behind, or it is
# pausing) leaves the batch until it can go on: holes cost a row of compute each.
MAX_HOLES = 8
IDLE_EXIT = 5.0  # seconds with no generation before the loop's thread ends (the next submit starts one)
POLL = 0.005  # seconds between looks when every generation is waiting (for its reader, or a pause)


def can_batch(lm: Any) -> bool:
    """True for a transformers model (its forward takes a padded batch and a ``DynamicCache``).

    A stand-in model (the tests' scripted ``FakeLM``) cannot be batched: a
    server over one runs each generation in its thread whatever it is asked.
    """
    transformers = sys.modules.get("transformers")
    if transformers is None:  # not imported: no transformers model exists in this process (and asking costs seconds)
        return False
    return isinstance(getattr(lm, "model", None), transformers.PreTrainedModel)


@dataclass(eq=False)
class _Slot:
    """One generation in the engine: where its prompt reading stands, its cache while outside the batch."""

    gen: Any
    chunks: deque = field(default_factory=deque)  # prompt chunks still to read
    cache: Any = None  # its own DynamicCache while reading the prompt
    kv: list | None = None  # per layer (keys, values) [heads, length, dim], while ready to join or parked
    row: int | None = None  # its row in the batch
    position: int = 0  # tokens in its context: the position the next token fed takes
    next_token: int = 0  # the token sampled last, fed in at the next step
    resume_at: float = 0.0  # in a pause until then
    holes: int = 0  # steps in a row it sat out
    ended: bool = False


@dataclass
class EngineStats:
    """What the loop did (for benchmarks and tests): read by other threads, written by the loop only."""

    steps: int = 0  # decode steps
    rows: int = 0  # rows over all decode steps (rows / steps: the mean batch)
    holes: int = 0  # rows that sat out a step
    max_batch: int = 0
    chunks: int = 0  # prompt chunks read
    rebuilds: int = 0  # times the batch cache was rebuilt
    rebuild_seconds: float = 0.0
    step_seconds: float = 0.0  # in decode forward passes
    longest_step: float = 0.0
    chunk_seconds: float = 0.0  # in prompt forward passes
    longest_chunk: float = 0.0
    generations: int = 0


class BatchedEngine:
    """Runs the model for every generation submitted to it, in one loop, decoding them as one batch.

    ``Generation(lm, ..., scheduler=engine)`` (or ``engine.submit(gen)`` from
    ``gen.start``) hands a generation over instead of starting its thread.
    ``handover_wait``: the longest one step waits for the event loop to write
    what it handed over (0: never), see ``Generation.await_reader``.
    """

    handover_wait = HANDOVER_WAIT

    def __init__(self, lm: Any) -> None:
        self.lm = lm
        self.stats = EngineStats()
        self._cond = threading.Condition()
        self._inbox: deque[Any] = deque()
        self._thread: threading.Thread | None = None
        forward = inspect.signature(lm.model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"  # renamed in transformers 5
        self._extra = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
        pad = getattr(lm.tokenizer, "pad_token_id", None)
        self._pad_id = int(pad) if isinstance(pad, int) else 0
        # The loop's state, touched by its thread only.
        self._reading: deque[_Slot] = deque()  # still reading their prompts, round-robin
        self._batch: list[_Slot] = []  # rows of the batch cache, in order
        self._outside: list[_Slot] = []  # ready to decode but not in the batch (new, or parked)
        self._cache: Any = None
        self._mask: Any = None  # [B, T] 1 for a real position, 0 for padding or a hole
        self._dense = False  # the mask has no 0: no padding, no holes (each row's position is the cache's length)

    def __repr__(self) -> str:
        return f"<BatchedEngine {self.lm.name if hasattr(self.lm, 'name') else ''} batch={len(self._batch)}>"

    # -- from any thread -----------------------------------------------------------

    def submit(self, gen: Any) -> None:
        """Take a started generation (its queue and loop set): it is read and decoded from the next turn on."""
        gen.begin()  # its clock starts now: the wait for the loop's next turn is part of its time
        with self._cond:
            self._inbox.append(gen)
            if self._thread is None:
                release_idle_team()  # the loop's thread gets the CPU's OpenMP threads to itself (model.openmp)
                self._thread = threading.Thread(target=self._loop, name="streamlab-batched", daemon=True)
                self._thread.start()
            self._cond.notify()

    @property
    def active(self) -> int:
        """Generations in the engine (reading, decoding or waiting)."""
        return len(self._inbox) + len(self._reading) + len(self._batch) + len(self._outside)

    # -- the loop ------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._turns()
        except BaseException as exc:  # the loop itself broke: nobody may be left waiting on it
            with self._cond:
                self._thread = None
                stranded = list(self._inbox)
                self._inbox.clear()
            self._fail_all(f"{type(exc).__name__} in the batched engine: {exc}")
            for gen in stranded:
                self._end(_Slot(gen), ERROR, f"{type(exc).__name__} in the batched engine: {exc}")
            raise

    def _turns(self) -> None:
        import torch

        with torch.inference_mode():
            while self._take_in():
                try:
                    self._sweep()
                    worked = self._read_prompts()
                    self._sweep()
                    worked |= self._decode_step()
                except Exception as exc:  # noqa: BLE001 - a bug here must not leave readers waiting forever
                    self._fail_all(f"{type(exc).__name__} in the batched engine: {exc}")
                    continue
                if not worked:
                    with self._cond:
                        if not self._inbox:
                            self._cond.wait(POLL)

    def _fail_all(self, error: str) -> None:
        """End every generation held with ``error``, and start again from an empty batch."""
        for slot in [*self._reading, *self._batch, *self._outside]:
            self._end(slot, ERROR, error)
        self._reading.clear()
        self._batch, self._outside, self._cache, self._mask = [], [], None, None

    def _take_in(self) -> bool:
        """Move submitted generations in; False (and the thread ends) after IDLE_EXIT seconds with none."""
        with self._cond:
            if not self._inbox and not (self._reading or self._batch or self._outside):
                # Idle: its OpenMP workers would slow whichever thread runs the model meanwhile (model.openmp).
                release_idle_team()
                self._cond.wait_for(lambda: bool(self._inbox), IDLE_EXIT)
                if not self._inbox:
                    self._thread = None
                    self._cache = self._mask = None
                    return False
            arrived = list(self._inbox)
            self._inbox.clear()
        for gen in arrived:
            self.stats.generations += 1
            slot = _Slot(gen)
            try:
                slot.chunks.extend(gen.prompt_chunks())
            except Exception as exc:  # noqa: BLE001 - an empty prompt: an error, not a hang
                self._end(slot, ERROR, f"{type(exc).__name__}: {exc}")
                continue
            self._reading.append(slot)
        return True

    def _end(self, slot: _Slot, reason: str, error: str | None = None) -> None:
        """The generation ends (its row leaves the batch at the next step)."""
        if slot.ended:
            return
        slot.ended = True
        slot.cache = slot.kv = None
        if slot in self._reading:
            self._reading.remove(slot)
        if slot in self._outside:
            self._outside.remove(slot)
        try:
            slot.gen.end(reason, error)
        except Exception:  # noqa: BLE001 - one generation's failure must not stop the others
            pass

    def _check(self, slot: _Slot) -> bool:
        """Ask the generation whether to go on (stop flag, max_tokens, fault); end it if not."""
        try:
            reason = slot.gen.check()
        except Exception as exc:  # noqa: BLE001 - the injected fault, or any other
            self._end(slot, ERROR, f"{type(exc).__name__}: {exc}")
            return False
        if reason is not None:
            self._end(slot, reason)
            return False
        return True

    def _sweep(self) -> None:
        """Every stop flag, every step: a reader who left costs at most the step under way."""
        for slot in [*self._reading, *self._batch, *self._outside]:
            if not slot.ended:
                self._check(slot)

    def _forward(self, ids: Any, cache: Any, **kwargs: Any) -> Any:
        """One forward pass, one turn with the model's (fair) lock; the last position's logits."""
        lm = self.lm
        with lm.lock:
            out = lm.model(input_ids=ids, use_cache=True, **{self._cache_arg: cache}, **self._extra, **kwargs)
        return out.logits[:, -1]

    def _read_prompts(self) -> bool:
        """Prompt chunks, round-robin, up to one chunk's worth of tokens in all this turn.

        One long prompt gets one chunk a turn; several short ones (a burst of
        chat requests) are all read in the same turn, so none of them waits
        for decode steps of the others before its first token.
        """
        budget: int | None = None
        worked = False
        while self._reading:
            slot = self._reading[0]
            size = len(slot.chunks[0])
            if budget is None:
                budget = max(slot.gen.prefill_chunk, size)
            elif size > budget:
                break
            budget -= size
            self._reading.rotate(-1)
            self._read_chunk(slot)
            worked = True
            if budget <= 0:
                break
        return worked

    def _read_chunk(self, slot: _Slot) -> None:
        """One prompt chunk through the model (batch 1, its own cache); after the last, its first token."""
        import torch
        from transformers import DynamicCache

        gen = slot.gen
        chunk = slot.chunks.popleft()
        if slot.cache is None:
            slot.cache = DynamicCache(config=self.lm.model.config)
        started = time.perf_counter()
        try:
            ids = torch.tensor([chunk], dtype=torch.long, device=self.lm.device)
            logits = self._forward(ids, slot.cache)
        except Exception as exc:  # noqa: BLE001
            self._end(slot, ERROR, f"{type(exc).__name__}: {exc}")
            return
        took = time.perf_counter() - started
        stats = self.stats
        stats.chunks += 1
        stats.chunk_seconds += took
        stats.longest_chunk = max(stats.longest_chunk, took)
        try:
            gen.chunk_read(len(chunk))
        except Exception as exc:  # noqa: BLE001
            self._end(slot, ERROR, f"{type(exc).__name__}: {exc}")
            return
        if slot.chunks:
            return
        self._reading.remove(slot)
        if not self._check(slot):  # just after the prompt: no token for a departed reader (as the thread does)
            return
        slot.position = len(gen.prompt_ids)
        slot.kv = [(layer.keys[0], layer.values[0]) for layer in slot.cache.layers]
        slot.cache = None
        self._outside.append(slot)
        self._sample([slot], logits)

    def _sample(self, slots: list[_Slot], logits: Any) -> None:
        """Each row's token from its own sampler, accepted as the thread accepts it."""
        delay = max((s.gen.token_delay for s in slots), default=0.0)
        if delay:
            time.sleep(delay)  # a slower model: once per step, whatever the batch
        now = time.perf_counter()
        for slot, row in zip(slots, logits):
            gen = slot.gen
            try:
                token = gen.sampler(row, gen.token_ids)
                reason = gen.accept(token)
            except Exception as exc:  # noqa: BLE001
                self._end(slot, ERROR, f"{type(exc).__name__}: {exc}")
                continue
            if reason is not None:
                self._end(slot, reason)
                continue
            slot.next_token = token
            pause = gen.pauses.get(gen.tokens)
            if pause:
                slot.resume_at = now + pause
        # Let the event loop write what was just handed over before the next forward pass (see
        # Generation.await_reader): one deadline for the whole step, however many rows it had.
        deadline = time.perf_counter() + self.handover_wait
        for slot in slots:
            if not slot.ended:
                slot.gen.await_reader(deadline - time.perf_counter())

    @staticmethod
    def _may_step(slot: _Slot, now: float) -> bool:
        if slot.resume_at > now:
            return False
        return bool(getattr(slot.gen, "has_room", lambda: True)())

    def _decode_step(self) -> bool:
        """One token for every decoding generation that may have one, in one forward pass."""
        import torch

        now = time.perf_counter()
        live = [s for s in self._batch if not s.ended]
        stepping = {s for s in [*live, *self._outside] if self._may_step(s, now)}
        if not stepping:
            if live != self._batch:
                self._rebuild(live)  # let the ended rows' caches go
            return False
        for slot in live:
            slot.holes = 0 if slot in stepping else slot.holes + 1
        # The batch for this step: the rows still going (one that sat out MAX_HOLES steps is parked),
        # and whoever outside may go on now (a prompt just read, a parked row whose reader caught up).
        members = [s for s in live if s.holes < MAX_HOLES] + [s for s in self._outside if s in stepping]
        if members != self._batch:
            self._rebuild(members)
        batch = self._batch
        device = self.lm.device
        # Dense (no padding, no holes so far, every row stepping now): each row's position is the cache's
        # length and every position is attended, which is what the model assumes given neither a mask
        # nor positions. A batch of one is nearly always dense: its step is then the bare loop's.
        dense = self._dense = self._dense and len(stepping) == len(batch)
        if dense:
            step = torch.ones(len(batch), 1, dtype=self._mask.dtype)
            ids = torch.tensor([[s.next_token] for s in batch], dtype=torch.long, device=device)
            extra: dict[str, Any] = {}
        else:
            step = torch.tensor([[1 if s in stepping else 0] for s in batch], dtype=self._mask.dtype)
            ids = torch.tensor([[s.next_token if s in stepping else self._pad_id] for s in batch], dtype=torch.long)
            positions = torch.tensor([[s.position] for s in batch], dtype=torch.long)
            ids = ids.to(device)
            extra = {"position_ids": positions.to(device)}
        mask = torch.cat([self._mask, step], dim=1)
        if not dense:
            extra["attention_mask"] = mask.to(device)
        started = time.perf_counter()
        try:
            logits = self._forward(ids, self._cache, **extra)
        except Exception as exc:  # noqa: BLE001 - the whole batch fails together
            for slot in batch:
                self._end(slot, ERROR, f"{type(exc).__name__}: {exc}")
            self._batch, self._cache, self._mask = [], None, None
            return True
        took = time.perf_counter() - started
        stats = self.stats
        stats.step_seconds += took
        stats.longest_step = max(stats.longest_step, took)
        stats.steps += 1
        stats.rows += len(stepping)
        stats.holes += len(batch) - len(stepping)
        stats.max_batch = max(stats.max_batch, len(stepping))
        self._mask = mask
        if dense:  # every row stepped: the logits are in the batch's order already
            for slot in batch:
                slot.position += 1
            self._sample(batch, logits)
            return True
        rows = [i for i, s in enumerate(batch) if s in stepping]
        for i in rows:
            batch[i].position += 1
        self._sample([batch[i] for i in rows], logits[rows])
        return True

    def _rebuild(self, members: list[_Slot]) -> None:
        """A new batch cache for ``members``: the rows that stay first, in their order, then the newcomers.

        The rows that stay are taken in one gather per layer, cut of the
        columns where every one of them is padding; each newcomer's own cache
        is copied in, left-padded to the batch's length. A row parked out of
        the batch leaves with its own cache, stripped of padding and holes.
        """
        import torch

        started = time.perf_counter()
        old, old_mask = self._cache, self._mask
        for slot in self._batch:
            if slot not in members and not slot.ended:  # parked: it keeps its cache for later
                slot.kv = self._row_kv(old, old_mask, slot.row)
                slot.holes = 0
                self._outside.append(slot)
        if not members:
            for slot in self._batch:
                slot.row = None
            self._batch, self._cache, self._mask = [], None, None
            return
        staying = [s for s in members if s.row is not None]
        joining = [s for s in members if s.row is None]
        assert members == staying + joining
        width, trim, index = 0, 0, None
        if staying:
            index = torch.tensor([s.row for s in staying], dtype=torch.long)
            kept_mask = old_mask.index_select(0, index)
            used = kept_mask.any(dim=0).nonzero()
            trim = int(used[0]) if len(used) else kept_mask.shape[1]
            width = kept_mask.shape[1] - trim
        for slot in self._batch:
            slot.row = None
        lengths = [s.kv[0][0].shape[-2] for s in joining]
        length = max([width, *lengths])
        mask = torch.zeros(len(members), length, dtype=torch.long)
        if staying:
            mask[: len(staying), length - width :] = kept_mask[:, trim:]
        for i, n in enumerate(lengths, start=len(staying)):
            mask[i, length - n :] = 1
        layers = []
        for layer in range(self._layers(old, joining)):
            kv = []
            for part in (0, 1):  # keys, then values
                kept = None
                if staying:
                    source = old.layers[layer].keys if part == 0 else old.layers[layer].values
                    kept = source.index_select(0, index.to(source.device))[:, :, trim:]
                if not joining and kept is not None:
                    kv.append(kept)
                    continue
                sample = kept if kept is not None else joining[0].kv[layer][part]
                heads, dim = sample.shape[-3], sample.shape[-1]
                full = sample.new_zeros(len(members), heads, length, dim)
                if kept is not None:
                    full[: len(staying), :, length - width :] = kept
                for i, (slot, n) in enumerate(zip(joining, lengths), start=len(staying)):
                    full[i, :, length - n :] = slot.kv[layer][part]
                kv.append(full)
            layers.append(tuple(kv))
        for slot in joining:
            slot.kv = None
            if slot in self._outside:
                self._outside.remove(slot)
        for i, slot in enumerate(members):
            slot.row = i
        self._batch = list(members)
        self._cache = self._new_cache(layers)
        self._mask = mask
        self._dense = bool(mask.all())
        self.stats.rebuilds += 1
        self.stats.rebuild_seconds += time.perf_counter() - started

    @staticmethod
    def _layers(cache: Any, joining: list[_Slot]) -> int:
        if cache is not None:
            return len(cache.layers)
        return len(joining[0].kv) if joining else 0

    def _new_cache(self, layers: list[tuple[Any, Any]]) -> Any:
        """A ``DynamicCache`` holding these tensors as they are (building it with data would copy them once more)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.lm.model.config)
        try:
            for layer, (keys, values) in zip(cache.layers, layers, strict=True):
                layer.lazy_initialization(keys, values)
                layer.keys, layer.values = keys, values
        except (TypeError, AttributeError, ValueError):  # another transformers: its own way, at the price of a copy
            cache = DynamicCache(layers, config=self.lm.model.config)
        return cache

    @staticmethod
    def _row_kv(cache: Any, mask: Any, row: int) -> list:
        """One row of the batch cache, as its own: only the positions its mask keeps (no padding, no holes)."""
        keep = mask[row].bool()
        n = int(keep.sum())
        if bool(keep[keep.shape[0] - n :].all()):  # no holes: the row's tail, a view
            return [(layer.keys[row][:, -n:], layer.values[row][:, -n:]) for layer in cache.layers]
        keep = keep.to(cache.layers[0].keys.device)
        return [(layer.keys[row][:, keep], layer.values[row][:, keep]) for layer in cache.layers]
