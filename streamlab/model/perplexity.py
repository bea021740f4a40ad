"""How much a decode format costs in quality: perplexity on human-written text, teacher-forced.

A faster format is only worth adopting if the model still predicts real text
as well as before. Perplexity measures exactly that, without sampling noise:
feed a human continuation token by token (all at once, teacher-forced) and
average how surprised the model was by each actual next token. Every format is
scored on the same token ids, so the figures compare.

The context (a prompt) is read with the format's prefill weights and the
continuation scored with its decode weights, as a reader's tokens are made: a
split format is judged by the weights that write its text, not by the float32
copy that reads the prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from streamlab.model.precision import DecodeRunner


@dataclass(frozen=True)
class Perplexity:
    value: float  # exp of the mean negative log-likelihood per token
    tokens: int  # tokens scored, over every text
    nll: float  # total negative log-likelihood (nats)


def encode_pairs(tokenizer: Any, texts: Sequence[str | tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """Each text as (context ids, continuation ids), tokenized apart so every format scores the same ids.

    A pair is ``(context, continuation)``; a plain string is scored from its
    second token on (its first is the context).
    """
    pairs = []
    for text in texts:
        if isinstance(text, str):
            ids = tokenizer(text)["input_ids"]
            context, continuation = ids[:1], ids[1:]
        else:
            context = tokenizer(text[0])["input_ids"]
            continuation = tokenizer(text[1], add_special_tokens=False)["input_ids"]
        if not context or not continuation:
            raise ValueError(f"nothing to score in {text!r}")
        pairs.append((context, continuation))
    return pairs


def perplexity(runner: DecodeRunner, pairs: Sequence[tuple[list[int], list[int]]]) -> Perplexity:
    """Perplexity of ``runner``'s format on encoded ``(context, continuation)`` pairs (see :func:`encode_pairs`).

    Two forward passes per text: the context through ``prefill`` (its last
    position predicts the continuation's first token), then every continuation
    token but the last through ``decode`` at once, each position predicting the
    next. Log-probabilities are taken in float32 whatever the format.
    """
    nll, count = 0.0, 0
    for context, continuation in pairs:
        cache = runner.new_cache()
        first = runner.prefill(context, cache, logits_to_keep=1).logits[0, -1:]
        rest = runner.decode(continuation[:-1], cache).logits[0] if len(continuation) > 1 else first[:0]
        logits = torch.cat([first, rest]).float()
        targets = torch.tensor(continuation, dtype=torch.long, device=logits.device)
        nll += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += len(continuation)
    return Perplexity(math.exp(nll / count), count, nll)
