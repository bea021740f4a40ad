"""An answer taken over mid-way, continued: the token ids each piece entry carries, and the generation that goes on.

A worker that dies mid-answer (``kill -9``, or its Redis gone) leaves its
readers the pieces it appended. The worker that takes the job over continues
the answer rather than ending it: every piece entry a worker appends carries
the ids of its tokens (:data:`IDS`, comma-separated, beside the fields
``shared_log.encode_entry`` writes; ``decode_entry`` reads only those, so a
reader's event is the same), and the heir's generation reads the job's prompt
followed by those ids as its prompt, then makes the ``max_tokens`` left into
the same stream. A reader gets one answer, no token twice:

- the first continued piece joins the kept text as the first worker's would
  have: the detokenizer is primed with the context's last tokens (the kept
  ones), as every generation primes it with its prompt's;
- the repetition penalty looks at the kept tokens too (:class:`AfterKept`),
  as the first worker's sampler did;
- text the first worker's stop check held back (it might have been the start
  of a stop sequence) goes to the heir's stop check first (``held``), so a stop
  sequence across the cut is still found, and the held text is not lost.

Greedy decoding (``temperature`` 0) continues with exactly the tokens an
uninterrupted run makes (in float32; in a narrow decode format the kept
tokens are read as a prompt is, in the prompt's format, and a near-tie may tip
the other way). A sampled answer continues with the same seed but from a fresh
random state: the dead worker's generator died with it, and cannot be
reproduced short of sampling every kept token again, so the rest is a valid
sample of the same request, not the one the first worker would have drawn.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from streamlab.model.detokenizer import Detokenizer, detokenize
from streamlab.server.answers.answer import Answer, commit_turn
from streamlab.server.answers.jobs import Jobs, Turn
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.answers.sources import Messages, ModelSource
from streamlab.server.config import ServerConfig
from streamlab.server.resources.shared_log import decode_entry, encode_entry
from streamlab.server.store.conversations import Begun
from streamlab.server.wire.formats import text_data

IDS = "t"  # a piece entry's field: the ids of the tokens it holds, comma-separated


def piece_entry(text: str, tokens: int, ids: Sequence[int] | None) -> dict[str, Any]:
    """A ``message`` entry: what ``encode_entry`` writes (``tokens``: the answer's count so far), and its ids."""
    entry = encode_entry("message", text_data(text), tokens)
    if ids is not None:
        entry[IDS] = ",".join(map(str, ids))
    return entry


def entry_ids(fields: dict[str, str]) -> list[int] | None:
    """The token ids a piece entry carries; None when it carries none (a worker before this field wrote it)."""
    ids = fields.get(IDS)
    if ids is None:
        return None
    return [int(i) for i in ids.split(",")] if ids else []


@dataclasses.dataclass(frozen=True)
class Kept:
    """What a taken-over answer's stream holds: its pieces' text and the ids of their tokens, in order."""

    ids: tuple[int, ...]
    text: str

    @property
    def tokens(self) -> int:
        return len(self.ids)

    @classmethod
    def from_entries(cls, entries: Sequence[dict[str, str]]) -> Kept | None:
        """The pieces of a stream's entries (its fields, in order); None when they cannot be continued exactly.

        That is when a piece carries no ids, or its ids do not add up to the
        token count it says (``n``): then the tokens it holds are unknown.
        """
        ids: list[int] = []
        texts: list[str] = []
        for fields in entries:
            name, data, tokens = decode_entry(fields)
            if name != "message":
                continue
            held = entry_ids(fields)
            if held is None:
                return None
            ids += held
            texts.append(data["text"])
            if tokens != len(ids):
                return None
        return cls(tuple(ids), "".join(texts))


@dataclasses.dataclass(frozen=True)
class Continuation(GenerationRequest):
    """A job's request, continued: ``max_tokens`` is what is left, ``kept_ids`` what was made, ``held`` see above."""

    kept_ids: tuple[int, ...] = ()
    held: str = ""


class AfterKept:
    """A sampler that continues an answer: its repetition penalty sees the kept tokens before this generation's."""

    def __init__(self, sampler: Any, kept: Sequence[int]) -> None:
        self.sampler = sampler
        self.kept = list(kept[-getattr(sampler, "window", len(kept)) :]) if kept else []

    def __call__(self, logits: Any, previous: Sequence[int] = ()) -> int:
        return self.sampler(logits, [*self.kept, *previous] if self.kept else previous)

    def __getattr__(self, name: str) -> Any:  # seed, temperature...: the sampler's own
        return getattr(self.sampler, name)


class WorkerSource(ModelSource):
    """The model, as a server's: and a :class:`Continuation` generates on from where its stream stopped."""

    @property
    def engine(self) -> Any:
        """The batched engine, once a generation needed it (None: none yet, or a model that cannot batch)."""
        return self._batched

    def generation(self, req: GenerationRequest, prompt_ids: list[int], messages: Messages,
                   config: ServerConfig, on_token: Callable[[int], None]) -> Any:
        generation = super().generation(req, prompt_ids, messages, config, on_token)
        if isinstance(req, Continuation):  # before it starts: no token is sampled or checked without these
            generation.sampler = AfterKept(generation.sampler, req.kept_ids)
            if req.held:
                generation.lifecycle.stops.held = req.held
        return generation


def held_back(tokenizer: Any, prompt_ids: Sequence[int], kept: Kept, stop: Sequence[str]) -> str:
    """The kept tokens' text the pieces do not hold: what the first worker's stop check was holding back.

    Its detokenizer released all of it (a piece is written once text is
    released), so the kept tokens decoded as it decoded them are the pieces'
    text followed by whatever its stop check held.
    """
    if not stop or not kept.ids:
        return ""
    whole = "".join(detokenize(Detokenizer(tokenizer, prompt_ids), kept.ids))
    return whole[len(kept.text):] if whole.startswith(kept.text) else ""


def continued_answer(jobs: Jobs, req: GenerationRequest, kept: Kept, generation_id: str, *,
                     through: str | None = None, answer_id: str | None = None) -> Answer:
    """The answer that continues ``req`` after ``kept``: its prompt the job's prompt ids, then the kept ids.

    The job's prompt is measured as it was (a 400 if it no longer fits,
    which cannot happen with the same model); the rest of the answer is
    ``max_tokens`` less the kept tokens (none left: it ends at once,
    ``max_tokens``). ``through``: the user's message the replica committed
    (the turn is that one: nothing new is stored for the user); ``answer_id``:
    the row the dead worker began, taken over from the text its readers had.
    """
    prompt_ids, messages = jobs.measure(req, through)
    fields = {f.name: getattr(req, f.name) for f in dataclasses.fields(GenerationRequest)}
    fields["max_tokens"] = max(0, req.max_tokens - kept.tokens)
    held = held_back(jobs.source.lm.tokenizer, prompt_ids, kept, req.stop)  # type: ignore[attr-defined]
    request = Continuation(**fields, kept_ids=kept.ids, held=held)
    ids = [*prompt_ids, *kept.ids]
    if through is None:  # a job whose replica committed no turn (none to continue in): one of its own
        turn = commit_turn(jobs.store, request, ids, messages)
    else:
        begun = Begun(answer_id, kept.text, kept.tokens) if answer_id else None
        turn = Turn(req.conversation_id, through, ids, messages, begun=begun)  # type: ignore[arg-type]
    return Answer(jobs, "/generations", request, turn=turn, generation_id=generation_id)
