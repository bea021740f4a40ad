"""Small helpers the chapters share: where things are, showing source, recording figures and runs, saving charts.

Every chapter records its headline figures to a JSON file named by its
``results_path`` parameter, so ``make run`` can print them and the notebook
tests can assert them from the executed notebook itself.

A chapter that needs what an earlier one already measured reads that run back
instead of generating it again (``recorded``): chapter 2 records its three
ways of delivering to ``build/runs/``, chapters 3 and 4 read them when they
match, and make them (and record them) when they run alone.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from streamlab.lab.results.records import (
    plain,
)

def bare_tokenizer(model_name: str | None = None) -> Any:
    """The model's tokenizer for counting tokens, without importing transformers (and torch) when it can.

    A chapter that only counts tokens reads the model folder's
    ``tokenizer.json`` with the ``tokenizers`` library that transformers'
    fast tokenizers run on (the same ids, in 0.1 s instead of ~5 s of
    imports); a model without one gets ``load_tokenizer``'s. Count with
    ``streamlab.client.metrics.count_tokens``, which takes either.
    """
    from streamlab.model.loading import load_tokenizer, resolve_model

    folder = Path(resolve_model(model_name)[1])
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    return load_tokenizer(model_name)


def show_source(obj: Any) -> Any:
    """Display the library's real source for ``obj``: the chapter never pastes a copy."""
    from IPython.display import Code

    return Code(inspect.getsource(obj), language="python")


def record(results_path: str | Path | None, headline: str, **figures: Any) -> None:
    """Write the chapter's headline and figures as JSON (when a path is given), and print the headline once.

    It returns nothing, so a chapter's last cell shows its headline, never a dump
    of what it recorded (the tests and ``make run`` read the JSON).
    """
    payload = {"headline": headline, "figures": plain(figures)}
    if results_path:
        path = Path(results_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(headline)
