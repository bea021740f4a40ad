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
        import torch

        probs = torch.from_numpy(weights / weights.sum())
        return nucleus_choice(probs, self.top_p, self.generator)


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
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    # Keep a token if the mass *before* it is still short of top_p: the first
    # token always survives, and the set stops right after crossing top_p.
    keep = (cumulative - sorted_probs) < top_p
    kept = sorted_probs * keep
    # One uniform draw against the kept mass (with replacement, one sample):
    # the choice does not depend on how many zeros follow the kept tokens.
    choice = torch.multinomial(kept / kept.sum(), 1, replacement=True, generator=generator)
    return int(order[choice])
