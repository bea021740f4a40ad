"""Two charts of chapters 1 and 3, drawn by ``streamlab.book.plots`` and named for what they show.

- ``detokenizer_cost``: chapter 1's cost per token against the answer's length,
  whose two axes are both logarithmic, and say so.
- ``filler_leak``: chapter 3's OpenAI chunks with and without the
  ``obfuscation`` filler, each series named for what it is (a plain chunk, not
  "plain event").

``tests/test_prose_early.py`` renders both at the notebook's width.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from streamlab.book import plots

__all__ = ["detokenizer_cost", "filler_leak"]


def detokenizer_cost(rows: Sequence[Mapping[str, Any]], **kwargs: Any) -> Any:
    """``plots.detokenizer_cost``, its length axis marked as the log scale it is (the cost axis says so already)."""
    ax = plots.detokenizer_cost(rows, **kwargs)
    ax.set_xlabel("answer length (tokens, log scale)")
    return ax


def filler_leak(text_bytes: Sequence[int], plain: Sequence[int], filled: Sequence[int], **kwargs: Any) -> Any:
    """Each piece's OpenAI chunk size against its text's size, plain and with the ``obfuscation`` filler."""
    kwargs.setdefault("title", "Random filler: one answer's chunks, with and without it")
    ax = plots.size_leak(text_bytes, plain, filled, padded_label="with its obfuscation field", event="OpenAI chunk",
                         **kwargs)
    ax.collections[0].set_label("plain chunk")
    ax.legend(loc="lower right")
    return ax
