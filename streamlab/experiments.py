"""The chapters' experiments as functions: run against a live server, return tidy rows.

Notebooks call these so the prose and the plots stay short and the procedure
itself is tested code. Each returns plain dicts (one row per measurement) and
keeps the client traces for the plots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from . import client

WAYS = ("complete", "stream", "ws")


@dataclass
class ThreeWays:
    """Every prompt answered three ways; ``traces[i][way]`` is the client's trace."""

    traces: list[dict[str, Any]] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for i, by_way in enumerate(self.traces):
            for way, t in by_way.items():
                out.append({
                    "prompt": i, "way": way, "first text (s)": t.first_text, "end (s)": t.end,
                    "bytes on the wire": t.total_bytes, "bytes of text": t.text_bytes, "ratio": t.ratio,
                    "pieces": len(t.text_events), "tokens": t.tokens, "complete": t.complete,
                })
        return out

    def same_text(self) -> bool:
        """Did the same text arrive all three ways, for every prompt?"""
        return all(len({t.text for t in by_way.values()}) == 1 for by_way in self.traces)

    def texts_agree(self) -> list[bool]:
        return [len({t.text for t in by_way.values()}) == 1 for by_way in self.traces]


def three_ways(
    port: int, prompts: Sequence[str], *, max_tokens: int = 100, seed: int = 0, ways: Sequence[str] = WAYS,
) -> ThreeWays:
    """Ask the same question through /complete, /stream and /ws, one after another.

    ``chat=False`` continues each paragraph as prose; ``ignore_eos`` makes every
    answer exactly ``max_tokens`` long, so the three ways carry equal work.
    """
    result = ThreeWays()
    common = {"seed": seed, "chat": False, "ignore_eos": True}
    for prompt in prompts:
        by_way: dict[str, Any] = {}
        for way in ways:
            if way == "ws":
                by_way[way] = client.websocket_sync(port, prompt, max_tokens, **common)
            else:
                by_way[way] = client.post_sync(port, f"/{way}", {"prompt": prompt, "max_tokens": max_tokens, **common})
        result.traces.append(by_way)
    return result
