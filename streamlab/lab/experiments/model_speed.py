"""``python -m streamlab info``: is the model here, how fast does it load, how fast does it speak?

The first thing to run on a new machine: it loads the model (converting the
embedded one on the first run), then continues the first prompt of
``data/prompts.json`` and prints time to first token and tokens per second,
the two numbers every later chapter depends on.
"""

from __future__ import annotations

import time

from streamlab.model.generation import Generation
from streamlab.model import cpu_kinds
from streamlab.model.loading import DEFAULT_MODEL, cpu_default, default_cache_dir, load_model
from streamlab.lab.results.records import load_prompts
from streamlab.net.errors import ArgumentParser

def first_prompt() -> str:
    return load_prompts()[0]["prompt"]


async def _measure(lm: object, prompt: str, tokens: int) -> tuple[float, float, int, str]:
    """(seconds to the first token, seconds in all, tokens, text), timed from the start of the request."""
    started = time.perf_counter()
    generation = Generation(lm, prompt, max_tokens=tokens, chat=False)
    async for _ in generation:
        pass
    result = await generation.wait()
    if result.error:
        raise RuntimeError(result.error)
    first_token = result.token_times[0] - started if result.token_times else float("nan")
    return first_token, result.ended - started, result.tokens, result.text


def main(argv: list[str] | None = None) -> int:
    """Print load time, cache folder, device, dtype, then TTFT and tokens/second."""
    from streamlab.net.aio import run_sync

    parser = ArgumentParser(prog="python -m streamlab info",
                            description="Is the model here, how fast does it load, how fast does it speak?")
    parser.add_argument(
        "--model", default=None, help="Hugging Face id or folder (default: STREAMLAB_MODEL or embedded)"
    )
    parser.add_argument("--precision", default=None, metavar="FORMAT",
                        help="the decode format (default: STREAMLAB_DTYPE, else the measured default; see docs/model.md)")
    parser.add_argument("--tokens", type=int, default=100, help="how many tokens to generate, at least 1 (default: 100 tokens)")
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error(f"--tokens {args.tokens}: give at least 1")

    started = time.perf_counter()
    import transformers  # noqa: F401 - timed apart: a fixed cost per process, whatever the model

    imports = time.perf_counter() - started
    lm = load_model(args.model, precision=args.precision)
    print(f"model:        {lm.name}")
    print(f"loaded from:  {lm.source}")
    print(f"cache folder: {default_cache_dir()}")
    print(f"device:       {lm.device}, decode format {lm.precision} (--precision or STREAMLAB_DTYPE picks another)")
    if lm.device.type == "cpu":
        choice = cpu_default()
        print(f"cpu:          {cpu_kinds.features_line()}")
        print(f"default here: {choice.format}, {choice.why}"
              + ("" if lm.name == DEFAULT_MODEL else f" (for the embedded model; {lm.name} keeps float32 until measured)"))
    print(f"imports:      {imports:.2f} s (transformers, once per process)")
    print(f"load time:    {lm.load_seconds:.2f} s (tokenizer + weights{' from the cache' if lm.name == DEFAULT_MODEL else ''})")

    prompt = first_prompt()
    first_token, total, tokens, text = run_sync(_measure(lm, prompt, args.tokens))
    rate = (tokens - 1) / (total - first_token) if tokens > 1 and total > first_token else float("nan")
    print(f"prompt:       {prompt[:60]}...")
    print(f"first token:  {first_token:.3f} s")
    print(f"generated:    {tokens} tokens in {total:.2f} s ({rate:.1f} tokens/s after the first)")
    print(f"text:         {text[:200]!r}")
    return 0
