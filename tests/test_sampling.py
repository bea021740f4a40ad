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


def _whole_vocabulary(sampler: Sampler, logits: torch.Tensor, previous) -> int:
    """The sampler as it was before the candidates' way: every probability, then ``nucleus_choice``."""
    import numpy as np

    from streamlab.model.sampling import nucleus_choice

    x = logits.float().numpy().astype(np.float32, copy=True)
    recent = np.fromiter(sorted(set(previous[-sampler.window:])), dtype=np.int64)
    scores = x[recent]
    x[recent] = np.where(scores > 0, scores / sampler.repetition_penalty, scores * sampler.repetition_penalty)
    scaled = x / np.float32(sampler.temperature)
    weights = np.exp(scaled - scaled.max())
    return nucleus_choice(torch.from_numpy(weights / weights.sum()), sampler.top_p, sampler.generator)


def test_the_likeliest_candidates_draw_what_the_whole_vocabulary_draws(monkeypatch):
    from streamlab.model import sampling

    taken = []
    candidates = sampling._nucleus_of_candidates
    monkeypatch.setattr(sampling, "_nucleus_of_candidates", lambda *a: taken.append(candidates(*a)) or taken[-1])
    g = torch.Generator().manual_seed(5)
    for trial in range(60):
        # From flat (the whole vocabulary's way is taken) to as sure as a small model usually is.
        logits = torch.randn(49152, generator=g) * (1, 5, 10, 20)[trial % 4]
        top_p = (0.9, 0.5, 0.99)[trial % 3]
        fast, whole = Sampler(seed=trial, top_p=top_p), Sampler(seed=trial, top_p=top_p)
        previous = list(range(trial, trial + 40))
        assert [fast(logits, previous) for _ in range(4)] == [_whole_vocabulary(whole, logits, previous) for _ in range(4)]
    assert any(t is not None for t in taken) and any(t is None for t in taken)  # both ways were taken
