"""Where one token's time goes (chapter 11, issue 34): the model step, sampling, the detokenizer, the hand-over.

A real :class:`~streamlab.model.generation.Generation` over the real model,
one reader, with its parts timed where they run, in its own thread:

- **model step**: the forward pass of one token (``lm.model`` called with
  one position; the prompt's passes are the first token's, not counted);
- **sampling**: the sampler choosing the token from the logits;
- **detokenizer and stop checks**: ``Lifecycle.accept``, which releases the
  text the token completes (chapter 1) and looks for stop sequences;
- **hand-over**: giving the piece to the event loop and the short wait that
  lets it write (``Generation._hand_over``, ``await_reader``);
- **the rest**: the loop around them (the stop flag, building the next
  input), the step's time less the parts above.

The parts are means over the decode steps, so they add up to the mean step,
``1 / tokens per second``. What the event loop then does with the piece,
up to the reader's socket, runs beside the next model step;
:func:`~streamlab.lab.experiments.overhead.server_overhead` measures it, and
``socket_ms`` puts it in the same table. Where ``make engine`` built
llama.cpp's own server, :func:`llama_cpp_token_ms` times its step on the same
GGUF, as a yardstick.

    from streamlab.lab.experiments.budget import token_budget
    rows = token_budget(lm, tokens=48)["rows"]    # a row per part, ms a token and share of the step
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable

__all__ = ["PARTS", "llama_cpp_token_ms", "token_budget"]

MODEL, SAMPLING, DETOKENIZER, HAND_OVER, REST = (
    "model step", "sampling", "detokenizer and stop checks", "hand-over to the event loop", "the rest")
PARTS = (MODEL, SAMPLING, DETOKENIZER, HAND_OVER, REST)
PROMPT = "Explain in a few sentences why the sky is blue, for a curious child."


class _TimedModel:
    """``lm.model`` with each one-position call timed (the decode steps); everything else passed through."""

    def __init__(self, model: Any, spent: list[float]) -> None:
        self._model = model
        self._spent = spent
        self.forward = model.forward  # the drivers read its signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = self._model(*args, **kwargs)
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[-1] == 1:
            self._spent.append(time.perf_counter() - started)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _timed(function: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    return timed


def token_budget(lm: Any, *, tokens: int = 48, prompt: str = PROMPT, socket_ms: float | None = None,
                 llama_cpp_ms: float | None = None) -> dict[str, Any]:
    """One ``Generation`` of ``tokens`` tokens (EOS ignored), its step taken apart: a row per part.

    ``rows``: part, ms a token, share of the step; ``step_ms`` the mean step;
    ``tokens_per_s``. ``socket_ms`` (the piece's way from the hand-over to the
    reader's socket, measured elsewhere) and ``llama_cpp_ms`` (llama.cpp's
    step) are shown beside the parts, not in their sum.
    """
    from streamlab.model.generation import Generation, encode_prompt
    from streamlab.net.aio import run_sync

    spent: dict[str, list[float]] = {part: [] for part in PARTS if part != REST}
    timed_lm = copy.copy(lm)
    timed_lm.model = _TimedModel(lm.model, spent[MODEL])

    async def main() -> Any:
        gen = Generation(timed_lm, prompt_ids=encode_prompt(lm.tokenizer, prompt), max_tokens=tokens,
                         ignore_eos=True)
        gen.sampler = _timed(gen.sampler, spent[SAMPLING])
        gen.lifecycle.accept = _timed(gen.lifecycle.accept, spent[DETOKENIZER])
        hand_over: list[float] = []
        gen._hand_over = _timed(gen._hand_over, hand_over)
        gen.await_reader = _timed(gen.await_reader, hand_over)
        async for _ in gen:
            pass
        spent[HAND_OVER] = hand_over
        return await gen.wait()

    result = run_sync(main())
    times = result.token_times
    steps = len(times) - 1
    if steps < 1:
        raise ValueError(f"{len(times)} token(s) made: a step needs two")
    step = (times[-1] - times[0]) / steps
    # The decode steps' parts: the last ``steps`` of each (the first sample and accept are the first token's).
    means = {part: sum(values[-steps:]) / min(steps, len(values)) if values else 0.0 for part, values in spent.items()
             if part != HAND_OVER}
    # The hand-overs (a piece each, the end's tail and its None) and the waits, spread over every token.
    means[HAND_OVER] = sum(spent[HAND_OVER]) / len(times)
    means = {part: means[part] for part in PARTS if part != REST}
    means[REST] = max(0.0, step - sum(means.values()))
    rows = [{"part": part, "ms a token": means[part] * 1e3, "share of the step": means[part] / step}
            for part in PARTS]
    beside = []
    if socket_ms is not None:
        beside.append({"part": "then, beside the next step: event loop to the reader's socket",
                       "ms a token": socket_ms, "share of the step": socket_ms / 1e3 / step})
    if llama_cpp_ms is not None:
        beside.append({"part": "llama.cpp's whole step, the same GGUF", "ms a token": llama_cpp_ms,
                       "share of the step": llama_cpp_ms / 1e3 / step})
    return {"rows": rows, "beside": beside, "step_ms": step * 1e3, "tokens_per_s": 1 / step, "tokens": len(times)}


def llama_cpp_token_ms(tokens: int = 48, prompt: str = PROMPT) -> tuple[float | None, str]:
    """llama.cpp's own server's time a token on the embedded GGUF (its stream's pieces), or None and why not."""
    from streamlab.lab.outside.llamacpp import LlamaCppServer, chat_stream_timing, cores, native_unavailable_reason

    reason = native_unavailable_reason()
    if reason:
        return None, reason
    threads = cores()
    with LlamaCppServer(threads=threads) as engine:
        chat_stream_timing(engine.port, prompt, 2, extra={"ignore_eos": True})  # its first request warms it up
        _, rate, _ = chat_stream_timing(engine.port, prompt, tokens, extra={"ignore_eos": True})
    return 1e3 / rate, f"llama.cpp's server, {threads} threads"
