"""Turn token ids into text one token at a time, without ever sending half a character.

A byte-level BPE token is a run of *bytes*, not characters. An emoji such as
U+1F99C is four bytes in UTF-8 and often arrives as two or three tokens; decoding
each token alone gives U+FFFD REPLACEMENT CHARACTER for every fragment. That is
what :class:`NaiveDetokenizer` does, and what a reader of a naive stream sees.

:class:`Detokenizer` keeps two offsets into the ids it has seen (the scheme vLLM
uses): ``prefix_offset`` starts a short window of context, ``read_offset`` marks
where already-sent text ends. Each step decodes only ``ids[prefix_offset:]``,
a few tokens, so the cost per token stays constant however long the answer grows;
decoding the whole text every step would cost O(n) per token, O(n^2) in all.
The context tokens before ``read_offset`` are decoded too so that the new text
is measured against its neighbours: that keeps leading spaces (and the merges of
SentencePiece-style tokenizers) right.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

REPLACEMENT = "\ufffd"
# A UTF-8 character is at most 4 bytes and every token carries at least one,
# so a split character can need at most 3 tokens of waiting. Holding back
# longer means the model really produced U+FFFD or invalid bytes: send it.
MAX_HOLD_TOKENS = 4
# How many of the prompt's last tokens to keep as context for the first piece.
PRIME_TOKENS = 6


def _make_decode(tokenizer: Any, skip_special_tokens: bool) -> Callable[[Sequence[int]], str]:
    """Pick the fastest decode that gives the same text as ``tokenizer.decode``.

    transformers' ``decode`` wraps the Rust tokenizer with Python-side work
    (~7 us per call here against ~2 us); the Rust one is identical whenever no
    clean-up of tokenization spaces is asked for.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    cleanup = getattr(tokenizer, "clean_up_tokenization_spaces", False)
    if backend is not None and not cleanup:
        return lambda ids: backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


class Detokenizer:
    """Incremental, UTF-8-safe detokenizer.

    ``push(id)`` returns the text that is now safe to show ("" while a character
    is still incomplete); ``flush()`` returns whatever is held back at the end.
    Joined, the pieces equal ``tokenizer.decode(ids)`` of the pushed ids.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
        max_hold_tokens: int = MAX_HOLD_TOKENS,
    ) -> None:
        self.decode = _make_decode(tokenizer, skip_special_tokens)
        self.max_hold_tokens = max_hold_tokens
        self.ids: list[int] = self._prime(list(prompt_ids))
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.generated = 0

    def _prime(self, prompt_ids: list[int]) -> list[int]:
        """Keep the prompt's last tokens as context, cut at character boundaries.

        A window that starts mid-character decodes to U+FFFD at its start; one that
        ends mid-character would make the first generated token *change* text we
        count as already sent. Either way the lengths we compare stop meaning
        anything (one engine re-sent the whole prompt that way), so trim both ends
        until the window decodes cleanly, and give up on priming if none does.
        """
        window = prompt_ids[-PRIME_TOKENS:]
        while window and self.decode(window).endswith(REPLACEMENT):
            window = window[:-1]
        while window and self.decode(window).startswith(REPLACEMENT):
            window = window[1:]
        return window

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        self.generated += 1
        prefix_text = self.decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self.decode(self.ids[self.prefix_offset :])
        held = len(self.ids) - self.read_offset
        if new_text.endswith(REPLACEMENT) and held < self.max_hold_tokens:
            return ""  # the last character is not complete yet: wait for its next byte
        if len(new_text) <= len(prefix_text):
            return ""  # e.g. a special token that decodes to nothing
        piece = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return piece

    def flush(self) -> str:
        """The end of the answer: send whatever is held, broken or not."""
        prefix_text = self.decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]


class NaiveDetokenizer:
    """Decode each token alone: fast, simple, and wrong for split characters."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = True) -> None:
        self.decode = _make_decode(tokenizer, skip_special_tokens)

    def push(self, token_id: int) -> str:
        return self.decode([token_id])

    def flush(self) -> str:
        return ""


class FullDecodeDetokenizer:
    """Re-decode everything every step and send the difference: right, but O(n) per token.

    Kept for the cost comparison in chapter 1 and the benchmark.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = True) -> None:
        self.decode = _make_decode(tokenizer, skip_special_tokens)
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.decode(self.ids)
        if text.endswith(REPLACEMENT):
            return ""
        piece, self.sent = text[self.sent :], len(text)
        return piece

    def flush(self) -> str:
        text = self.decode(self.ids)
        piece, self.sent = text[self.sent :], len(text)
        return piece


def detokenize(detok: Any, ids: Sequence[int]) -> list[str]:
    """Push every id through ``detok`` and return the pieces (flush included, empties dropped)."""
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    return [p for p in pieces if p]


def broken_pieces(pieces: Sequence[str]) -> int:
    """How many pieces a reader would see with a replacement character in them."""
    return sum(REPLACEMENT in p for p in pieces)
