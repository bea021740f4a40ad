"""Small helpers the chapters share: where things are, showing source, recording figures.

Every chapter records its headline figures to a JSON file named by its
``results_path`` parameter, so ``make run`` can print them and the notebook
tests can assert them from the executed notebook itself.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
NOTEBOOKS = REPO / "notebooks"
BUILD = REPO / "build"


def load_prompts() -> list[dict[str, str]]:
    """The 20 paragraph openings and the human continuations they were cut from."""
    return json.loads((DATA / "prompts.json").read_text(encoding="utf-8"))


def show_source(obj: Any) -> Any:
    """Display the library's real source for ``obj``: the chapter never pastes a copy."""
    from IPython.display import Code

    return Code(inspect.getsource(obj), language="python")


def _plain(value: Any) -> Any:
    """Make numpy scalars, NaN and tuples JSON-friendly."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def record(results_path: str | Path | None, headline: str, **figures: Any) -> dict[str, Any]:
    """Write the chapter's headline and figures as JSON (when a path is given) and return them."""
    payload = {"headline": headline, "figures": _plain(figures)}
    if results_path:
        path = Path(results_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(headline)
    return payload
