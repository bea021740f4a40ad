"""The same answers three ways (chapter 2): /complete, /stream and /ws, traced, and recorded for chapters 3, 4.

``three_ways`` asks the same questions through each route, one after
another, and keeps every client trace; ``three_ways_run`` is chapter 2's run
of it, recorded (``results.records``) so the chapters after it read back the
very same traces instead of generating them again.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from streamlab.client import timed as client
from streamlab.lab.results.records import Recorded, recorded
from streamlab.client.tracing import Trace, TraceEvent

WAYS = ("complete", "stream", "ws")
THREE_WAYS_RUN = "02_three_ways"  # build/runs/02_three_ways.json: chapter 2's run, read back by chapters 3 and 4


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

    def to_json(self) -> list[dict[str, Any]]:
        return [{way: trace_to_json(t) for way, t in by_way.items()} for by_way in self.traces]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]], ways: Sequence[str] | None = None) -> ThreeWays:
        """The recorded traces back, only ``ways`` of them when given."""
        return cls([{way: trace_from_json(t) for way, t in by_way.items() if ways is None or way in ways}
                    for by_way in data])


def trace_to_json(trace: Trace) -> dict[str, Any]:
    """A client's trace as JSON, all of it (the body as base64), so a later chapter reads back the very same trace."""
    data = dataclasses.asdict(trace)
    data["body"] = base64.b64encode(trace.body).decode("ascii")
    return data


def trace_from_json(data: dict[str, Any]) -> Trace:
    fields = {f.name for f in dataclasses.fields(Trace)}
    values = {k: v for k, v in data.items() if k in fields}
    values["body"] = base64.b64decode(values.get("body", ""))
    values["chunks"] = [tuple(c) for c in values.get("chunks", [])]
    values["events"] = [TraceEvent(**e) for e in values.get("events", [])]
    return Trace(**values)


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


def _covers_ways(saved: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """A recording serves a chapter when everything matches and it holds every way the chapter reads."""
    def rest(key: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in key.items() if k != "ways"}

    return rest(saved) == rest(wanted) and set(wanted["ways"]) <= set(saved["ways"])


def three_ways_run(
    prompts: Sequence[str],
    *,
    max_tokens: int,
    seed: int,
    by: str,
    folder: str | Path | None = None,
    model_name: str | None = None,
    ways: Sequence[str] = WAYS,
    port: int | None = None,
    reuse: bool = True,
) -> Recorded:
    """Chapter 2's run of ``three_ways``, shared: read back when recorded with the same model, prompts, seed
    and size (and at least ``ways``), else run now (on ``port``, or a server started for it) and recorded.

    Chapter 2 owns the experiment (``reuse=False``: it always measures);
    chapters 3 and 4 read its run, and make it only when they run alone.
    ``.value`` is the ``ThreeWays``.
    """
    from streamlab.model.loading import DEFAULT_MODEL

    key = {"experiment": "three_ways", "model": model_name or os.environ.get("STREAMLAB_MODEL") or DEFAULT_MODEL,
           "prompts": list(prompts), "max_tokens": max_tokens, "seed": seed, "chat": False, "ignore_eos": True,
           "ways": list(ways)}

    def make() -> ThreeWays:
        if port is not None:
            return three_ways(port, prompts, max_tokens=max_tokens, seed=seed, ways=ways)
        from streamlab.lab.setups.runner import serve

        with serve(*(["--model", model_name] if model_name else [])) as server:
            return three_ways(server.port, prompts, max_tokens=max_tokens, seed=seed, ways=ways)

    return recorded(THREE_WAYS_RUN, key, make, by=by, folder=folder, dump=ThreeWays.to_json,
                    load=lambda data: ThreeWays.from_json(data, ways), covers=_covers_ways, reuse=reuse)
