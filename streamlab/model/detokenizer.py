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

That is two decodes per token, and from Python each decode call costs about a
microsecond of crossing into Rust and back. A byte-level tokenizer (GPT-2's
scheme, and SmolLM2's, Qwen's, Llama 3's) decodes by joining bytes, so the text
of the next window's context *is* the piece just sent, whenever that piece began
on a character boundary: :class:`Detokenizer` keeps it instead of decoding it
again, one decode per token (``benchmarks/detokenizer.py`` measures both).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

REPLACEMENT = "\ufffd"
# A UTF-8 character is at most 4 bytes and every token carries at least one,
# so four held tokens always complete the character that was open when the
# hold began. The count runs from the last piece sent, so in a vocabulary with
# tokens that end one character and begin the next, four can end inside the
# next one (SmolLM2's has none: chapter 1 counts them). Holding back longer
# means the model really produced U+FFFD or invalid bytes: send it.
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
        # Callers pass lists. The Rust method itself when it can be (it skips special tokens by
        # default): a wrapper's frame, or a keyword argument, costs a third of a call again.
        if skip_special_tokens:
            return backend.decode
        return lambda ids: backend.decode(ids, False)
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def joins_bytes(tokenizer: Any) -> bool:
    """True when decoding is concatenation of the tokens' bytes (a byte-level decoder, no clean-up).

    Then ``decode(a + b) == decode(a) + decode(b)`` whenever ``a`` ends on a
    character boundary, which lets the detokenizer reuse text it already has.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    return type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"


class Detokenizer:
    """Incremental, UTF-8-safe detokenizer.

    ``push(id)`` returns the text that is now safe to show ("" while a character
    is still incomplete); ``flush()`` returns whatever is held back at the end.
    Joined, the pieces equal ``tokenizer.decode(ids)`` of the pushed ids.

    ``reuse_text`` (default: when the tokenizer joins bytes, see
    :func:`joins_bytes`) keeps the piece just sent as the next context's text
    instead of decoding it again; False always decodes both windows.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
        max_hold_tokens: int = MAX_HOLD_TOKENS,
        reuse_text: bool | None = None,
    ) -> None:
        self.decode = _make_decode(tokenizer, skip_special_tokens)
        self.max_hold_tokens = max_hold_tokens
        self.reuse_text = joins_bytes(tokenizer) if reuse_text is None else reuse_text
        self.ids: list[int] = self._prime(list(prompt_ids))
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.generated = 0
        self._prefix_text: str | None = None  # decode(ids[prefix_offset:read_offset]) when known

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
        ids = self.ids
        ids.append(int(token_id))
        self.generated += 1
        prefix_text = self._prefix_text
        if prefix_text is None:
            prefix_text = self._prefix_text = self.decode(ids[self.prefix_offset : self.read_offset])
        new_text = self.decode(ids[self.prefix_offset :])
        if new_text.endswith(REPLACEMENT) and len(ids) - self.read_offset < self.max_hold_tokens:
            return ""  # the last character is not complete yet: wait for its next byte
        if len(new_text) <= len(prefix_text):
            return ""  # e.g. a special token that decodes to nothing
        piece = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(ids)
        # The new context is the tokens just sent. Their text is the piece itself when the
        # bytes join and the old context ended on a whole character; otherwise decode it next time.
        clean_cut = self.reuse_text and not prefix_text.endswith(REPLACEMENT)
        self._prefix_text = piece if clean_cut else None
        return piece

    def flush(self) -> str:
        """The end of the answer: send whatever is held, broken or not."""
        prefix_text = self.decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        self._prefix_text = None
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
