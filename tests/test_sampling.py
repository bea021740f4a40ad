"""Seeded nucleus sampling: reproducible, truncated where it should be, penalising repeats."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from streamlab.model.sampling import Sampler


def draws(sampler: Sampler, logits: torch.Tensor, n: int, previous=()) -> Counter:
    return Counter(sampler(logits, previous) for _ in range(n))


def test_same_seed_same_tokens():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    s1, s2, other = Sampler(seed=7, temperature=1.0), Sampler(seed=7, temperature=1.0), Sampler(seed=8, temperature=1.0)
    first = [s1(logits) for _ in range(50)]
    assert first == [s2(logits) for _ in range(50)]
    assert first != [other(logits) for _ in range(50)]


def test_top_p_keeps_the_nucleus_only():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    seen = draws(Sampler(seed=0, top_p=0.7, temperature=1.0, repetition_penalty=1.0), logits, 2000)
    assert set(seen) == {0, 1}
    everything = draws(Sampler(seed=0, top_p=1.0, temperature=1.0, repetition_penalty=1.0), logits, 4000)
    assert set(everything) == {0, 1, 2, 3}


def test_first_token_always_survives():
    logits = torch.tensor([5.0, 0.0, 0.0])
    seen = draws(Sampler(seed=0, top_p=0.01, temperature=1.0), logits, 200)
    assert set(seen) == {0}


def test_temperature_zero_is_greedy():
    logits = torch.tensor([0.1, 2.0, 1.9])
    assert {Sampler(seed=s, temperature=0)(logits) for s in range(20)} == {1}


def test_repetition_penalty_discourages_recent_tokens():
    logits = torch.tensor([2.0, 2.0])
    plain = draws(Sampler(seed=0, temperature=1.0, top_p=1.0, repetition_penalty=1.0), logits, 2000, previous=[0])
    penalised = draws(Sampler(seed=0, temperature=1.0, top_p=1.0, repetition_penalty=1.5), logits, 2000, previous=[0])
    assert penalised[0] < plain[0] - 200
    # Negative logits are pushed further down, never up.
    neg = torch.tensor([-1.0, -1.0])
    penalised_neg = draws(Sampler(seed=0, temperature=1.0, top_p=1.0, repetition_penalty=1.5), neg, 2000, previous=[0])
    assert penalised_neg[0] < 900


@pytest.mark.parametrize("kwargs", [{"top_p": 0}, {"top_p": 1.5}, {"temperature": -1}])
def test_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        Sampler(**kwargs)
