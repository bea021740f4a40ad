"""The generation thread: stop flag, stop reasons, hand-off to asyncio, never blocking the loop."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from streamlab.aio import run_sync
from streamlab.generation import EOS, ERROR, MAX_TOKENS, STOPPED, Generation, generate_text
from streamlab.model import LoadedModel, load_tokenizer


class FakeOutput(dict):
    """Looks enough like a transformers ModelOutput: item and attribute access."""

    __getattr__ = dict.__getitem__


class FakeModel:
    """Emits a fixed script of tokens (then EOS), sleeping per step like a slow model."""

    class generation_config:  # noqa: N801 - mimics the transformers attribute
        eos_token_id = 2

    def __init__(self, script: list[int], vocab: int, step_seconds: float = 0.0) -> None:
        self.script, self.vocab, self.step_seconds, self.calls = script, vocab, step_seconds, 0

    def forward(self, input_ids, use_cache=True, cache=None):
        time.sleep(self.step_seconds)
        token = self.script[self.calls] if self.calls < len(self.script) else 2
        self.calls += 1
        logits = torch.full((1, input_ids.shape[1], self.vocab), -1e4)
        logits[0, -1, token] = 1e4
        return FakeOutput(logits=logits, cache=(cache or 0) + 1)

    __call__ = forward


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def fake_lm(tok, text: str, step_seconds: float = 0.0) -> LoadedModel:
    script = tok(text, add_special_tokens=False)["input_ids"]
    model = FakeModel(script, len(tok), step_seconds)
    return LoadedModel("fake", tok, model, torch.device("cpu"), 0.0, "fake")


def run(gen: Generation) -> tuple[list, object]:
    async def main():
        pieces = [p async for p in gen]
        return pieces, await gen.wait()

    return run_sync(main())


def test_eos_and_pieces_with_times(tok):
    lm = fake_lm(tok, "Hello 🦜 world")
    pieces, result = run(Generation(lm, "hi", chat=False))
    assert result.stop_reason == EOS
    assert "".join(p.text for p in pieces) == "Hello 🦜 world" == result.text
    assert all("\ufffd" not in p.text for p in pieces)
    times = [p.time for p in pieces]
    assert times == sorted(times)
    assert result.tokens == len(tok("Hello 🦜 world", add_special_tokens=False)["input_ids"])


def test_max_tokens(tok):
    lm = fake_lm(tok, "one two three four five six seven")
    _, result = run(Generation(lm, "hi", chat=False, max_tokens=3))
    assert (result.stop_reason, result.tokens) == (MAX_TOKENS, 3)


def test_ignore_eos_runs_to_max_tokens(tok):
    lm = fake_lm(tok, "one")
    _, result = run(Generation(lm, "hi", chat=False, max_tokens=5, ignore_eos=True))
    assert (result.stop_reason, result.tokens) == (MAX_TOKENS, 5)


def test_stop_flag_checked_before_every_token(tok):
    lm = fake_lm(tok, " a" * 50, step_seconds=0.01)
    gen = Generation(lm, "hi", chat=False, max_tokens=50)

    async def main():
        got = 0
        async for _ in gen:
            got += 1
            if got == 5:
                gen.stop("client_left")
        return await gen.wait()

    result = run_sync(main())
    assert result.stop_reason == STOPPED
    assert 5 <= result.tokens <= 6
    assert gen.stop_source == "client_left"


def test_fault_after_n_tokens(tok):
    lm = fake_lm(tok, " a" * 20)
    pieces, result = run(Generation(lm, "hi", chat=False, max_tokens=20, fail_after=4))
    assert result.stop_reason == ERROR
    assert result.tokens == 4 and len(pieces) == 4
    assert "injected fault" in result.error


def test_pause_is_cut_short_by_stop(tok):
    lm = fake_lm(tok, " a" * 10)
    gen = Generation(lm, "hi", chat=False, max_tokens=10, pauses={2: 30.0})

    async def main():
        async for piece in gen:
            if piece.tokens == 2:
                asyncio.get_running_loop().call_later(0.2, gen.stop)
        return await gen.wait()

    started = time.perf_counter()
    result = run_sync(main())
    assert result.stop_reason == STOPPED and result.tokens == 2
    assert time.perf_counter() - started < 10


def test_event_loop_keeps_running_while_the_model_computes(tok):
    """Each fake step takes 0.3 s of blocking work; a ticker on the loop must not notice."""
    lm = fake_lm(tok, " a b c d", step_seconds=0.3)
    gaps: list[float] = []

    async def ticker(stop: asyncio.Event):
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def main():
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        result = await Generation(lm, "hi", chat=False).wait()
        stop.set()
        await tick
        return result

    result = run_sync(main())
    assert result.tokens == 4
    assert max(gaps) < 0.2, "the event loop was blocked by the model"


def test_real_model_is_reproducible():
    from streamlab import load_model

    lm = load_model()
    a = generate_text(lm, "The lighthouse keeper", max_tokens=12, chat=False, ignore_eos=True)
    b = generate_text(lm, "The lighthouse keeper", max_tokens=12, chat=False, ignore_eos=True)
    assert a.text == b.text and a.tokens == 12
    c = generate_text(lm, "The lighthouse keeper", max_tokens=12, chat=False, ignore_eos=True, seed=1)
    assert c.text != a.text
