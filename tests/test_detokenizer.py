"""The incremental detokenizer against the naive one, DecodeStream, and hostile input."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlab.model.detokenizer import (
    MAX_HOLD_TOKENS,
    REPLACEMENT,
    Detokenizer,
    FullDecodeDetokenizer,
    NaiveDetokenizer,
    broken_pieces,
    detokenize,
)
from streamlab.model.loading import load_tokenizer

SENTENCE = "Con vẹt 🦜 nói: mô hình sinh văn bản từng token một 🫠"
# Characters that split across tokens in many ways: emoji with skin tones and
# ZWJ sequences, flags, CJK, Vietnamese, Devanagari, accented Latin, Korean, Arabic.
ALPHABET = (
    "abc xyz THE the ,.!?'\n\t 0123456789"
    "👋🏽👍🏿🦜🫠😀🎉👨‍👩‍👧‍👦👩‍❤️‍👨🏳️‍🌈🇻🇳"
    "模型一次生成个词元東京は雨です"
    "ẹảừộăơưđÀÁẠ"
    "भाषामॉडलएकसमयमेंटोकन"
    "ÇçéèêëïñüØŁłß"
    "언어모델은토큰"
    "النموذجيكتب"
)
HYP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_split_characters_sentence(tok):
    ids = ids_of(tok, SENTENCE)
    naive = detokenize(NaiveDetokenizer(tok), ids)
    incremental = detokenize(Detokenizer(tok), ids)
    assert broken_pieces(naive) > 0
    assert broken_pieces(incremental) == 0
    assert "".join(incremental) == SENTENCE
    assert "".join(naive) != SENTENCE


@HYP
@given(text=st.text(alphabet=ALPHABET, min_size=1, max_size=60))
def test_multilingual_text_never_breaks(tok, text):
    ids = ids_of(tok, text)
    pieces = detokenize(Detokenizer(tok), ids)
    assert broken_pieces(pieces) == 0
    assert "".join(pieces) == tok.decode(ids) == text


@HYP
@given(ids=st.lists(st.integers(min_value=0, max_value=49151), min_size=1, max_size=40))
def test_random_ids_join_to_full_decode(tok, ids):
    """Random ids make invalid byte runs too: the join must still equal decode()."""
    pieces = detokenize(Detokenizer(tok), ids)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)


@HYP
@given(ids=st.lists(st.integers(min_value=0, max_value=49151), min_size=1, max_size=40),
       text=st.text(alphabet=ALPHABET, max_size=30))
def test_reusing_the_sent_piece_as_context_changes_nothing(tok, ids, text):
    """One decode per token (the piece kept as the next context) gives the very pieces two decodes give."""
    from streamlab.model.detokenizer import joins_bytes

    assert joins_bytes(tok)  # the default tokenizer is byte-level: the fast path is the one tested
    mixed = ids_of(tok, text) + ids if text else ids
    fast = Detokenizer(tok, reuse_text=True)
    slow = Detokenizer(tok, reuse_text=False)
    assert [fast.push(i) for i in mixed] == [slow.push(i) for i in mixed]
    assert fast.flush() == slow.flush()


@HYP
@given(text=st.text(alphabet=ALPHABET, min_size=1, max_size=60))
def test_agrees_with_decode_stream(tok, text):
    """Step by step, the text sent so far equals what tokenizers' DecodeStream has sent."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=True)
    ours, theirs = Detokenizer(tok), []
    sent = []
    for token in ids_of(tok, text):
        sent.append(ours.push(token))
        theirs.append(stream.step(tok.backend_tokenizer, token) or "")
        assert "".join(sent) == "".join(theirs)


def test_model_generated_ids(tok):
    """Ids a real model sampled at a high temperature, where odd byte runs are common."""
    from streamlab.model.loading import load_model
    from streamlab.model.generation import Generation
    from streamlab.net.aio import run_sync

    lm = load_model()
    for seed, prompt in enumerate(["Écris une phrase avec des emoji 🎉", "用中文写一句话", "Tell a story 🦜"]):
        gen = Generation(lm, prompt, max_tokens=40, seed=seed, temperature=1.6, top_p=1.0)
        result = run_sync(gen.wait())
        pieces = detokenize(Detokenizer(tok, gen.prompt_ids), gen.token_ids)
        assert "".join(pieces) == tok.decode(gen.token_ids, skip_special_tokens=True)
        assert result.text == "".join(pieces)


def test_literal_replacement_character_is_sent_not_stalled(tok):
    text = "a \ufffd b \ufffd c"
    ids = ids_of(tok, text)
    detok = Detokenizer(tok)
    sent = ""
    for token in ids:
        sent += detok.push(token)
    sent += detok.flush()
    assert sent == text
    # Each real U+FFFD went out once the next token showed it was final, not at flush.
    detok = Detokenizer(tok)
    before_flush = "".join(detok.push(t) for t in ids_of(tok, "x \ufffd y z"))
    assert REPLACEMENT in before_flush


def test_invalid_byte_run_is_bounded(tok):
    """A model that emits continuation bytes forever must not stall the stream."""
    lone_continuation = tok.convert_tokens_to_ids("Ģ")  # byte 0x80 in the byte-level alphabet
    assert tok.decode([lone_continuation]) == REPLACEMENT
    detok = Detokenizer(tok)
    outputs = [detok.push(lone_continuation) for _ in range(20)]
    # Never more than MAX_HOLD_TOKENS pushes in a row without output.
    silent = longest = 0
    for out in outputs:
        silent = 0 if out else silent + 1
        longest = max(longest, silent)
    assert longest < MAX_HOLD_TOKENS
    assert "".join(outputs) + detok.flush() == tok.decode([lone_continuation] * 20)


def test_window_stays_short_on_a_long_answer(tok):
    """O(1) per token: no decode call ever looks at more than a few tokens."""
    ids = ids_of(tok, " ".join([SENTENCE] * 120))[:4096]
    detok = Detokenizer(tok)
    sizes: list[int] = []
    inner = detok.decode
    detok.decode = lambda window: (sizes.append(len(window)), inner(window))[1]
    pieces = [detok.push(t) for t in ids] + [detok.flush()]
    assert "".join(pieces) == tok.decode(ids)
    assert max(sizes) <= 2 * MAX_HOLD_TOKENS
    # The full re-decode, by contrast, decodes everything every step.
    full = FullDecodeDetokenizer(tok)
    full_sizes: list[int] = []
    inner_full = full.decode
    full.decode = lambda window: (full_sizes.append(len(window)), inner_full(window))[1]
    for t in ids[:500]:
        full.push(t)
    assert max(full_sizes) == 500


def test_flush_returns_the_held_fragment(tok):
    parrot = ids_of(tok, " 🦜")
    assert len(parrot) > 1
    detok = Detokenizer(tok)
    assert detok.push(ids_of(tok, "Hi")[0]) == "Hi"
    assert [detok.push(t) for t in parrot[:-1]] == [""] * (len(parrot) - 1)
    assert REPLACEMENT in detok.flush()


def test_priming_keeps_the_leading_space(tok):
    prompt = ids_of(tok, "The cat")
    answer = ids_of(tok, " sat on the mat")
    pieces = detokenize(Detokenizer(tok, prompt), answer)
    assert "".join(pieces) == " sat on the mat"
    assert pieces[0].startswith(" ")


def test_prompt_ending_mid_character_is_not_resent(tok):
    """A prompt cut inside an emoji: the output never repeats the prompt's text."""
    whole = ids_of(tok, "Hello there 🦜")
    prompt, rest = whole[:-1], whole[-1:]
    answer = rest + ids_of(tok, " and more")
    pieces = detokenize(Detokenizer(tok, prompt), answer)
    joined = "".join(pieces)
    assert "Hello" not in joined
    assert joined == tok.decode(answer)


def test_naive_is_one_piece_per_token(tok):
    ids = ids_of(tok, SENTENCE)
    assert len(detokenize(NaiveDetokenizer(tok), ids)) == len(ids)
