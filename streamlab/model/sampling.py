"""Choose the next token: seeded nucleus (top-p) sampling with a light repetition penalty.

Seeded, so that the same prompt gives the same tokens whichever endpoint asks
for them: chapter 2 compares /complete, /stream and /ws and expects the very
same text all three ways. The repetition penalty keeps a 135M-parameter model
from looping on one phrase, which greedy decoding of so small a model does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:  # torch loads when a sampler is made: a server with no model (--scripted-rate) starts without it
    import torch


@dataclass
class Sampler:
    """Pick a token id from one step's logits.

    temperature 0 means greedy. ``window`` bounds how far back the repetition
    penalty looks, so a long answer may reuse common words.
    """

    seed: int = 0
    top_p: float = 0.9
    temperature: float = 0.7
    repetition_penalty: float = 1.1
    window: int = 64
    generator: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        import torch

        self.generator = torch.Generator(device="cpu").manual_seed(int(self.seed))

    def __call__(self, logits: torch.Tensor, previous: Sequence[int] = ()) -> int:
        # The vocabulary-wide steps (penalty, temperature, softmax) run in numpy, on this thread:
        # torch splits any op over 32k elements across its OpenMP threads, and waking them costs
        # more than the arithmetic (ms per op on a busy 2-core machine, measured in
        # benchmarks/overhead.py). The nucleus step works on a few dozen values, in torch.
        x = logits.detach().float().reshape(-1).cpu().numpy().astype(np.float32, copy=True)
        if self.repetition_penalty != 1.0 and previous:
            recent = np.fromiter(sorted(set(previous[-self.window :])), dtype=np.int64)
            scores = x[recent]
            # CTRL-style: shrink a positive logit, push a negative one further down.
            x[recent] = np.where(scores > 0, scores / self.repetition_penalty, scores * self.repetition_penalty)
        if self.temperature == 0:
            return int(np.argmax(x))
        scaled = x / np.float32(self.temperature)
        weights = np.exp(scaled - scaled.max())
        total = weights.sum()
        token = _nucleus_of_candidates(weights, total, self.top_p, self.generator)
        if token is not None:
            return token
        import torch

        return nucleus_choice(torch.from_numpy(weights / total), self.top_p, self.generator)


# How many of the most likely tokens nucleus sampling sorts first. Sorting all
# 49,152 logits of the vocabulary every token cost ~1-2 ms here, a few percent
# of a forward pass; the top 64 almost always hold top_p of the mass (a small
# model's next token is rarely that uncertain), and when they do not the
# window widens until they do.
NUCLEUS_WINDOW = 64


def nucleus_choice(probs: torch.Tensor, top_p: float, generator: torch.Generator) -> int:
    """Sample from the smallest set of tokens whose probability reaches ``top_p``."""
    import torch

    size = probs.numel()
    k = min(NUCLEUS_WINDOW, size)
    while True:
        sorted_probs, order = torch.topk(probs, k)  # the k most likely, most likely first
        if k == size or float(sorted_probs.sum()) >= top_p:
            break
        k = min(k * 8, size)
    return int(order[_draw(sorted_probs, top_p, generator)])


def _draw(sorted_probs: torch.Tensor, top_p: float, generator: torch.Generator) -> int:
    """The position drawn among probabilities sorted most likely first, cut where they reach ``top_p``."""
    import torch

    cumulative = torch.cumsum(sorted_probs, dim=-1)
    # Keep a token if the mass *before* it is still short of top_p: the first
    # token always survives, and the set stops right after crossing top_p.
    keep = (cumulative - sorted_probs) < top_p
    kept = sorted_probs * keep
    # One uniform draw against the kept mass (with replacement, one sample):
    # the choice does not depend on how many zeros follow the kept tokens.
    return int(torch.multinomial(kept / kept.sum(), 1, replacement=True, generator=generator))


# Cuts tried, largest first, to find the NUCLEUS_WINDOW most likely tokens without sorting the
# vocabulary: the weights are exp(logit - max logit), so the most likely token weighs 1.
CANDIDATE_CUTS = (1e-5, 1e-7, 1e-9)


def _nucleus_of_candidates(weights: np.ndarray, total: Any, top_p: float, generator: torch.Generator) -> int | None:
    """``nucleus_choice`` over the tokens above a cut: the same token, for a fraction of the time; None if unsure.

    ``torch.topk`` over the whole vocabulary was most of the sampler's time
    (0.30 of 0.78 ms a token, measured on the 2-core machine with the real
    model's logits). One comparison over the vocabulary finds the tokens
    above a cut; once they are at least NUCLEUS_WINDOW, the most likely
    NUCLEUS_WINDOW of them are the vocabulary's, with the very probabilities
    (the same division by the same total), so the draw is the one
    ``nucleus_choice`` makes. Where that window holds less than ``top_p``
    (an unsure model: the nucleus is wider) or no cut keeps enough tokens,
    None: the caller takes the whole-vocabulary way. (Tokens of exactly
    equal probability may come out in another order than the full sort's.)
    """
    import torch

    k = NUCLEUS_WINDOW
    if weights.size <= k:
        return None
    for cut in CANDIDATE_CUTS:
        candidates = np.flatnonzero(weights >= cut)
        if candidates.size >= k:
            break
    else:
        return None
    probs = torch.from_numpy(weights[candidates] / total)
    sorted_probs, order = torch.topk(probs, k)
    if float(sorted_probs.sum()) < top_p:
        return None
    return int(candidates[int(order[_draw(sorted_probs, top_p, generator)])])
