"""Per-token cost of the detokenizers, side by side in one run, as ratios to DecodeStream.

    python benchmarks/detokenizer.py [--tokens 4096]

The numbers that matter are the ratios: this machine is shared and its absolute
timings move from run to run.
"""

from __future__ import annotations

import argparse
import time

from tokenizers.decoders import DecodeStream

from streamlab.detokenizer import Detokenizer, FullDecodeDetokenizer, NaiveDetokenizer
from streamlab.model import load_tokenizer

TEXT = (
    "Con vẹt 🦜 nói: mô hình sinh văn bản từng token một 🫠. The keeper climbed the stairs "
    "模型一次生成一个词元 and wrote in the log, भाषा मॉडल, 👨‍👩‍👧‍👦 then slept. "
)


class DecodeStreamAdapter:
    def __init__(self, tokenizer):
        self.backend, self.stream = tokenizer.backend_tokenizer, DecodeStream(skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        return self.stream.step(self.backend, token_id) or ""


def per_token_us(factory, ids: list[int]) -> float:
    detok = factory()
    start = time.perf_counter()
    for t in ids:
        detok.push(t)
    return (time.perf_counter() - start) / len(ids) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args()
    tok = load_tokenizer()
    base = tok(TEXT, add_special_tokens=False)["input_ids"]
    ids = (base * (args.tokens // len(base) + 1))[: args.tokens]
    rows = {
        "tokenizers DecodeStream.step": lambda: DecodeStreamAdapter(tok),
        "streamlab Detokenizer (window)": lambda: Detokenizer(tok),
        "naive (each token alone)": lambda: NaiveDetokenizer(tok),
        "full re-decode every step": lambda: FullDecodeDetokenizer(tok),
    }
    results = {name: per_token_us(f, ids) for name, f in rows.items()}
    ref = results["tokenizers DecodeStream.step"]
    print(f"per-token cost over {args.tokens} tokens (ratio to DecodeStream)")
    for name, us in results.items():
        print(f"  {name:<34} {us:9.1f} µs  {us / ref:7.1f}x")


if __name__ == "__main__":
    main()
