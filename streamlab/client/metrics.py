"""The numbers a streaming chapter reports: first text, gaps, time per token, reading speed.

Everything here is plain arithmetic over times the client recorded, so the
same functions serve the notebooks, the tests and the benchmarks.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Sequence

# Silent reading of English non-fiction, words per minute (Brysbaert 2019 meta-analysis).
READING_WPM = 238.0
# The book's one reading threshold, in seconds: a gap between pieces longer than this is one a reader notices.
# It is the reader's pace per token rounded down: 238 words a minute at this tokenizer's ~1.2-1.4 tokens a word
# is one token every 180-220 ms (chapter 4 measures it). Every chapter, chart and benchmark uses this value.
READING_THRESHOLD = 0.2
_WORD = re.compile(r"\b[\w'’-]+\b")


def text_times(trace: Any) -> list[float]:
    """When each piece of text arrived, in seconds after the request was sent."""
    return [e.t for e in trace.events if e.kind == "text" and e.text]


def gaps(times: Sequence[float]) -> list[float]:
    """The silences between consecutive arrivals."""
    return [b - a for a, b in zip(times, times[1:])]


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default), without numpy."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float], ps: Iterable[float] = (50, 90, 99)) -> dict[str, float]:
    out = {f"p{int(p)}": percentile(values, p) for p in ps}
    out["max"] = max(values) if values else math.nan
    out["mean"] = sum(values) / len(values) if values else math.nan
    return out


def time_per_output_token(first_text: float, last_text: float, tokens: int) -> float:
    """TPOT: the steady pace after the first token, (last - first) / (tokens - 1)."""
    return (last_text - first_text) / (tokens - 1) if tokens > 1 else math.nan


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


def count_tokens(tokenizer: Any, text: str) -> int:
    """Tokens in ``text``, special tokens left out: a transformers tokenizer, or a bare ``tokenizers.Tokenizer``."""
    if callable(tokenizer):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def tokens_per_word(tokenizer: Any, texts: Iterable[str]) -> float:
    """Tokens the model's tokenizer spends per English word, over a body of prose."""
    tokens = words = 0
    for text in texts:
        tokens += count_tokens(tokenizer, text)
        words += count_words(text)
    return tokens / words


def reading_tokens_per_second(tpw: float, wpm: float = READING_WPM) -> float:
    """How many tokens a reader takes in per second."""
    return wpm / 60.0 * tpw


def tpot_threshold(tpw: float, wpm: float = READING_WPM) -> float:
    """The slowest time per output token that still keeps ahead of the reader."""
    return 1.0 / reading_tokens_per_second(tpw, wpm)


def wait_before_first_word(words: int, tpw: float, tokens_per_second: float, ttft: float,
                           wpm: float = READING_WPM) -> dict[str, float]:
    """How long a reader waits before reading can start, streamed or not, and how long reading takes at ``wpm``.

    Without streaming the first word shows when the last one is made: the first
    token's latency plus every other token at the generation pace.
    """
    tokens = words * tpw
    return {
        "words": words,
        "tokens": tokens,
        "streaming": ttft,
        "no streaming": ttft + (tokens - 1) / tokens_per_second,
        "reading time": words / (wpm / 60.0),
    }
