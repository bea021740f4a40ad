"""Per-token cost of the detokenizers at 128, 1,024 and 4,096 tokens, side by side in one run.

    python benchmarks/detokenizer.py [--sizes 128,1024,4096] [--repeats 7] [--tiny]

The same ids through each way of turning them into text: ``tokenizers``'
``DecodeStream`` (Rust, the reference), streamlab's :class:`Detokenizer` (the
prefix/read window decoded through the Rust backend, one decode per token on a
byte-level tokenizer), the same with both windows decoded every token, a full
re-decode of everything every token (O(n) per token), and the naive decode of
each token alone. Each figure is the best of ``--repeats`` passes (the least
disturbed by the machine's other work). Targets: flat (the window's cost at
4,096 tokens within 1.5x of its cost at 128) and within 2x of DecodeStream.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

from tokenizers.decoders import DecodeStream

from streamlab.lab.results.measures import Report
from streamlab.model.detokenizer import Detokenizer, FullDecodeDetokenizer, NaiveDetokenizer
from streamlab.model.loading import load_tokenizer

TEXT = (
    "Con vẹt 🦜 nói: mô hình sinh văn bản từng token một 🫠. The keeper climbed the stairs "
    "模型一次生成一个词元 and wrote in the log, भाषा मॉडल, 👨‍👩‍👧‍👦 then slept. "
)


class DecodeStreamAdapter:
    """tokenizers' own incremental decoder, behind the same ``push`` as ours."""

    def __init__(self, tokenizer) -> None:
        self.backend, self.stream = tokenizer.backend_tokenizer, DecodeStream(skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        return self.stream.step(self.backend, token_id) or ""


def passes_us(factory: Callable[[], object], ids: list[int], repeats: int) -> list[float]:
    """Each of ``repeats`` passes over ``ids``, in microseconds per token (the figures are the best of them)."""
    passes = []
    for _ in range(repeats):
        detok = factory()
        push = detok.push
        start = time.perf_counter()
        for t in ids:
            push(t)
        passes.append((time.perf_counter() - start) / len(ids) * 1e6)
    return passes


def paired(a: list[float], b: list[float]) -> list[float]:
    """Pass by pass, ``a``'s over ``b``'s: the rounds a ratio's verdict reads."""
    return [x / y for x, y in zip(a, b)]


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,1024,4096")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tiny", action="store_true", help="a quick run for the test (64,256 tokens, 2 repeats)")
    args = parser.parse_args(argv)
    sizes = [64, 256] if args.tiny else [int(s) for s in args.sizes.split(",")]
    repeats = 2 if args.tiny else args.repeats
    report = Report("detokenizer", params={"sizes": sizes, "repeats": repeats})
    tok = load_tokenizer()
    base = tok(TEXT, add_special_tokens=False)["input_ids"]
    ways: dict[str, Callable[[], object]] = {
        "DecodeStream": lambda: DecodeStreamAdapter(tok),
        "streamlab window": lambda: Detokenizer(tok),
        "window, two decodes": lambda: Detokenizer(tok, reuse_text=False),
        "naive (each alone)": lambda: NaiveDetokenizer(tok),
        "full re-decode": lambda: FullDecodeDetokenizer(tok),
    }
    costs: dict[tuple[str, int], float] = {}
    passes: dict[tuple[str, int], list[float]] = {}
    for n in sizes:
        ids = (base * (n // len(base) + 1))[:n]
        for name, factory in ways.items():
            # The full re-decode is O(n^2) in all: fewer passes keep the run short.
            passes[name, n] = passes_us(factory, ids, 1 if name == "full re-decode" and n > 1024 else repeats)
            costs[name, n] = min(passes[name, n])
    rows = []
    for name in ways:
        row = {"way": name}
        for n in sizes:
            row[f"µs/token at {n}"] = costs[name, n]
        row[f"vs DecodeStream at {sizes[-1]}"] = costs[name, sizes[-1]] / costs["DecodeStream", sizes[-1]]
        rows.append(row)
    report.table("per-token cost (best of the passes)", rows)
    small, large = sizes[0], sizes[-1]
    for name, key in (("DecodeStream", "decodestream"), ("streamlab window", "window")):
        report.figure(f"{key}_us_at_{large}", costs[name, large], "µs/token")
    report.figure(f"full_redecode_us_at_{large}", costs["full re-decode", large], "µs/token")
    window = passes["streamlab window", large]
    report.ratio(f"window_{large}_vs_{small}", costs["streamlab window", large] / costs["streamlab window", small],
                 target=1.5, rounds=paired(window, passes["streamlab window", small]))
    report.ratio("window_vs_decodestream", costs["streamlab window", large] / costs["DecodeStream", large], target=2.0,
                 rounds=paired(window, passes["DecodeStream", large]))
    report.ratio("two_decodes_vs_one", costs["window, two decodes", large] / costs["streamlab window", large])
    report.ratio(f"full_redecode_{large}_vs_{small}", costs["full re-decode", large] / costs["full re-decode", small])
    report.save()
    return report


if __name__ == "__main__":
    main()
