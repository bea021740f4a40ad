"""Where a run of the book keeps things, the prompts it reads, and runs recorded for later chapters.

A chapter that needs what an earlier one already measured reads that run back
instead of generating it again (``recorded``): chapter 2 records its three
ways of delivering to ``build/runs/``, chapters 3 and 4 read them when they
match, and make them (and record them) when they run alone. The experiments
record through it too, so it sits with them, below the book.

The prompts are package data (``streamlab/data/prompts.json``, the same file
as the repository's ``data/prompts.json``), read through ``importlib.resources``
so an installed wheel has them.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "data"  # the repository's copy; the package's own is read by load_prompts
NOTEBOOKS = REPO / "notebooks"
BUILD = REPO / "build"
RUNS = BUILD / "runs"
# Set by ``run-notebooks`` for the chapters it executes: a recording made
# under the same value was made earlier in the same run of the book.
RUN_ID = "STREAMLAB_RUN_ID"


def load_prompts() -> list[dict[str, str]]:
    """The 20 paragraph openings and the human continuations they were cut from."""
    return json.loads(resources.files("streamlab").joinpath("data", "prompts.json").read_text(encoding="utf-8"))


def plain(value: Any) -> Any:
    """Make numpy scalars, NaN and tuples JSON-friendly."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def runs_folder(results_path: str | Path | None = None) -> Path:
    """Where the chapters of one run of the book record runs for each other.

    Beside the results folder (``build/runs/`` for ``make run``; a test's own
    temporary folder in CI, so tests never share), else ``build/runs/``.
    """
    return Path(results_path).resolve().parent.parent / "runs" if results_path else RUNS


@dataclass
class Recorded:
    """A run read back, or made now: its value, and where it came from."""

    name: str
    value: Any
    by: str  # the chapter that made it, e.g. "chapter 2"
    made_at: float  # time.time() when it was recorded
    run: str | None  # the RUN_ID it was made under
    path: Path
    made_here: bool

    @property
    def source(self) -> str:
        """Where the data came from, for the chapter's prose."""
        if self.made_here:
            return "generated here"
        if self.run and self.run == os.environ.get(RUN_ID):
            return f"recorded by {self.by} in this run"
        return f"recorded by {self.by} on {time.strftime('%Y-%m-%d at %H:%M', time.localtime(self.made_at))}"


def _json_key(key: Any) -> Any:
    """The key as JSON gives it back (tuples become lists), so a fresh key compares equal to a saved one."""
    return json.loads(json.dumps(plain(key), ensure_ascii=False))


def recorded(
    name: str,
    key: dict[str, Any],
    make: Callable[[], Any],
    *,
    by: str,
    folder: str | Path | None = None,
    dump: Callable[[Any], Any] = lambda value: value,
    load: Callable[[Any], Any] = lambda data: data,
    covers: Callable[[dict[str, Any], dict[str, Any]], bool] | None = None,
    reuse: bool = True,
) -> Recorded:
    """Read the run ``name`` back when it was recorded with a matching ``key``; else ``make`` it and record it.

    ``key`` says what the run was made with (model, prompts, seed, sizes): a
    recording is used only when ``covers(saved_key, key)`` (equality unless
    given), so a chapter never reads figures made for other sizes. ``dump``
    and ``load`` turn the value into JSON and back. The chapter that owns an
    experiment passes ``reuse=False``: it always measures, and records what it
    measured for the chapters after it.
    """
    path = Path(folder or RUNS) / f"{name}.json"
    key = _json_key(key)
    if reuse and path.exists():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            if (covers or (lambda old, new: old == new))(saved["key"], key):
                return Recorded(name, load(saved["value"]), saved["by"], saved["made_at"], saved.get("run"), path, False)
        except (ValueError, KeyError, TypeError):
            pass  # a damaged or older recording: make it again
    value = make()
    payload = {"name": name, "key": key, "by": by, "made_at": time.time(), "run": os.environ.get(RUN_ID),
               "value": dump(value)}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(payload, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, path)  # a reader never sees half a recording
    return Recorded(name, value, by, payload["made_at"], payload["run"], path, True)
