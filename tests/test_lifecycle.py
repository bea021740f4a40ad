"""One generation's lifecycle: the legal moves and what they give, the illegal ones refused.

Over the fake byte tokenizer (one token per UTF-8 byte, so a parrot is four
tokens the detokenizer must hold back and join): no model, no threads.
The last tests drive a whole ``Generation`` the way a third driver would,
through the public moves only, and watch its pieces through ``observers``.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from fakes import EOS_ID, ByteTokenizer, FakeLM
from streamlab.model.generation import Generation, generate_text
from streamlab.model.lifecycle import GENERATION_ENDINGS, InjectedFault, Lifecycle, LifecycleError, Phase, Piece
from streamlab.net.aio import run_sync
from streamlab.protocol.endings import EOS, ERROR, MAX_TOKENS, STOP_SEQUENCE, STOPPED

PROMPT = [*b"hi there"]


def life(prompt=PROMPT, **kwargs) -> Lifecycle:
    kwargs.setdefault("eos_ids", {EOS_ID})
    return Lifecycle(ByteTokenizer(), prompt, **kwargs)


def read_prompt(lc: Lifecycle) -> None:
    lc.begin()
    for chunk in lc.prompt_chunks():
        assert lc.check() is None
        lc.chunk_read(len(chunk))


def feed(lc: Lifecycle, text: str) -> list:
    return [lc.accept(token) for token in text.encode()]


# -- the legal moves -------------------------------------------------------------


def test_a_whole_answer_moves_through_every_phase_once():
    lc = life(prefill_chunk=3)
    assert lc.phase is Phase.CREATED
    lc.begin()
    assert lc.phase is Phase.READING and lc.started > 0
    assert lc.prompt_chunks() == [[*b"hi "], [*b"the"], [*b"re"]]
    lc.chunk_read(3)
    assert lc.prompt_chunks() == [[*b"the"], [*b"re"]]  # what is still to read, after a stop or a crash alike
    lc.chunk_read(3)
    lc.chunk_read(2)
    assert lc.phase is Phase.READING and lc.check() is None
    first = lc.accept(ord("O"))
    assert lc.phase is Phase.DECODING
    assert first.ending is None and first.piece.text == "O" and first.piece.tokens == 1
    assert [a.piece.text for a in feed(lc, "k.")] == ["k", "."]
    eos = lc.accept(EOS_ID)
    assert (eos.piece, eos.ending, lc.phase, lc.tokens) == (None, EOS, Phase.ENDING, 3)  # EOS is not counted
    tail, result = lc.end(EOS)
    assert tail is None and lc.phase is Phase.ENDED and lc.result is result
    assert (result.text, result.tokens, result.stop_reason, result.prompt_tokens) == ("Ok.", 3, EOS, 8)
    assert result.started <= result.token_times[0] <= result.token_times[-1] <= result.ended
    assert lc.token_ids == [*b"Ok."]


def test_a_split_character_is_held_back_then_handed_over_whole():
    lc = life()
    read_prompt(lc)
    got = feed(lc, "a🦜")
    assert [a.piece.text if a.piece else None for a in got] == ["a", None, None, None, "🦜"]
    assert all(a.ending is None for a in got) and lc.tokens == 5
    assert got[-1].piece.tokens == 5


def test_half_a_character_at_the_end_comes_out_of_end():
    lc = life()
    read_prompt(lc)
    got = [lc.accept(token) for token in "a🦜".encode()[:3]]  # "a" and half the parrot
    assert [a.piece.text if a.piece else None for a in got] == ["a", None, None]
    tail, result = lc.end(STOPPED)
    assert tail is not None and tail.tokens == 3 and result.text == "a" + tail.text
    assert result.tokens == 3 and result.stop_reason == STOPPED


def test_check_turns_max_tokens_a_stop_and_the_fault_into_endings():
    lc = life(max_tokens=2)
    read_prompt(lc)
    feed(lc, "ab")
    assert lc.check() == MAX_TOKENS and lc.phase is Phase.ENDING

    lc = life()
    lc.begin()
    lc.stop()  # from any thread; moves nothing until the driver looks
    assert lc.stop_requested and lc.phase is Phase.READING
    assert lc.check() == STOPPED and lc.ending == STOPPED
    assert lc.end(STOPPED)[1].tokens == 0

    lc = life(fail_after=1)
    read_prompt(lc)
    feed(lc, "a")
    with pytest.raises(InjectedFault, match="after 1 tokens"):
        lc.check()
    assert lc.end(ERROR, "InjectedFault: boom")[1].error == "InjectedFault: boom"


def test_a_stop_sequence_ends_at_the_token_that_completes_it_and_is_never_sent():
    lc = life(stop_sequences=["\nUser:"])
    read_prompt(lc)
    got = feed(lc, "Yes.\nUser:")
    sent = "".join(a.piece.text for a in got if a.piece)
    assert sent == "Yes." and got[-1].ending == STOP_SEQUENCE and lc.phase is Phase.ENDING
    assert all(a.ending is None for a in got[:-1])
    tail, result = lc.end(STOP_SEQUENCE)
    assert tail is None and (result.text, result.stop_sequence) == ("Yes.", "\nUser:")


def test_text_held_for_a_stop_sequence_that_never_came_is_the_tail():
    lc = life(stop_sequences=["STOP"])
    read_prompt(lc)
    assert "".join(a.piece.text for a in feed(lc, "go ST") if a.piece) == "go "
    tail, result = lc.end(MAX_TOKENS)
    assert tail.text == "ST" and result.text == "go ST" and result.stop_reason == MAX_TOKENS


def test_an_answer_may_end_in_any_phase_before_ended():
    for moves in ([], ["begin"], ["begin", "read", "token"]):
        lc = life()
        if moves:
            read_prompt(lc) if "read" in moves else lc.begin()
        if "token" in moves:
            lc.accept(ord("x"))
        _, result = lc.end(ERROR, "the engine broke")
        assert lc.phase is Phase.ENDED and result.ended >= result.started > 0


def test_ignore_eos_counts_the_eos_token_like_any_other():
    lc = life(eos_ids=())
    read_prompt(lc)
    assert lc.accept(EOS_ID).ending is None and lc.tokens == 1 and lc.phase is Phase.DECODING


# -- the illegal ones ----------------------------------------------------------------


@pytest.mark.parametrize("move", ["prompt_chunks", "chunk_read", "check", "accept"])
def test_nothing_but_begin_or_end_before_begin(move):
    lc = life()
    args = {"chunk_read": (1,), "accept": (ord("a"),)}.get(move, ())
    with pytest.raises(LifecycleError, match=f"{move}\\(\\) in phase CREATED"):
        getattr(lc, move)(*args)
    assert lc.phase is Phase.CREATED


def test_begin_only_once():
    lc = life()
    lc.begin()
    with pytest.raises(LifecycleError, match="begin\\(\\) in phase READING: only allowed in CREATED"):
        lc.begin()


def test_no_token_before_the_whole_prompt_is_read():
    lc = life(prefill_chunk=4)
    lc.begin()
    lc.chunk_read(4)
    with pytest.raises(LifecycleError, match="4 of 8 prompt tokens read"):
        lc.accept(ord("a"))
    assert lc.phase is Phase.READING and lc.tokens == 0


def test_the_prompt_cannot_be_read_twice_nor_past_its_end():
    lc = life()
    lc.begin()
    with pytest.raises(LifecycleError, match="chunk_read\\(9\\)"):
        lc.chunk_read(9)
    lc.chunk_read(8)
    lc.accept(ord("a"))
    for move, args in (("prompt_chunks", ()), ("chunk_read", (1,))):
        with pytest.raises(LifecycleError, match="in phase DECODING"):
            getattr(lc, move)(*args)


def test_after_a_reason_to_end_only_end():
    lc = life()
    read_prompt(lc)
    assert lc.accept(EOS_ID).ending == EOS
    for move, args in (("check", ()), ("accept", (ord("a"),)), ("begin", ())):
        with pytest.raises(LifecycleError, match="in phase ENDING"):
            getattr(lc, move)(*args)
    lc.end(EOS)


def test_end_only_once_and_only_with_a_generation_ending():
    lc = life()
    read_prompt(lc)
    with pytest.raises(ValueError, match="unknown generation ending 'client_left'"):
        lc.end("client_left")  # a stored reason, not one the generation gives
    assert lc.phase is Phase.READING  # refused, so nothing moved
    lc.end(STOPPED)
    assert GENERATION_ENDINGS == {EOS, MAX_TOKENS, STOPPED, ERROR, STOP_SEQUENCE}
    for move, args in (("end", (STOPPED,)), ("check", ()), ("accept", (ord("a"),))):
        with pytest.raises(LifecycleError, match="in phase ENDED"):
            getattr(lc, move)(*args)


def test_an_empty_prompt_is_an_error_to_end_with():
    lc = life(prompt=[])
    lc.begin()
    with pytest.raises(ValueError, match="the prompt has no tokens"):
        lc.prompt_chunks()


def test_a_negative_chunk_size_is_refused():
    with pytest.raises(ValueError, match="prefill_chunk"):
        life(prefill_chunk=-1)


# -- a Generation, driven by hand and watched -------------------------------------------


class ByHand:
    """A scheduler that only takes the generation in: the test makes every move, as a driver would."""

    def __init__(self) -> None:
        self.taken: list[Generation] = []

    def submit(self, gen: Generation) -> None:
        gen.begin()
        self.taken.append(gen)


def test_a_third_driver_needs_only_the_public_moves():
    lm = FakeLM("Hi 🦜")
    scheduler = ByHand()
    gen = Generation(lm, "hello", chat=False, prefill_chunk=2, scheduler=scheduler)
    watched: list[Piece] = []
    gen.observers.append(watched.append)

    async def main():
        gen.start()
        assert scheduler.taken == [gen] and gen.phase is Phase.READING
        with pytest.raises(LifecycleError):
            gen.accept(ord("H"))  # a driver bug is said where it happens
        past = None
        for chunk in gen.prompt_chunks():
            out = lm.model(input_ids=_ids(chunk), past_key_values=past)
            past = out.past_key_values
            gen.chunk_read(len(chunk))
        while gen.check() is None:
            token = gen.sampler(out.logits[0, -1], gen.token_ids)
            if (reason := gen.accept(token)) is not None:
                break
            out = lm.model(input_ids=_ids([token]), past_key_values=past)
        else:
            reason = gen.lifecycle.ending
        gen.end(reason)
        pieces = [p async for p in gen]
        return pieces, await gen.wait()

    pieces, result = run_sync(main())
    assert (result.text, result.stop_reason, gen.phase) == ("Hi 🦜", EOS, Phase.ENDED)
    assert gen.prompt_tokens_read == 5 and "🦜" in [p.text for p in pieces]
    assert watched == pieces  # every piece handed over, seen as it went


def _ids(ids):
    import torch

    return torch.tensor([ids], dtype=torch.long)


def test_observers_see_each_piece_the_thread_hands_over():
    gen = Generation(FakeLM("Hello 🦜"), "hi", chat=False, stop_sequences=["zzz"])
    watched: list[Piece] = []
    gen.observers.append(watched.append)

    async def main():
        pieces = [p async for p in gen]
        return pieces, await gen.wait()

    pieces, result = run_sync(main())
    assert watched == pieces and "".join(p.text for p in watched) == result.text == "Hello 🦜"
    assert gen.phase is Phase.ENDED


def test_the_thread_ends_every_generation_through_the_lifecycle():
    for kwargs, reason in (({}, EOS), ({"max_tokens": 2}, MAX_TOKENS), ({"fail_after": 1}, ERROR)):
        result = generate_text(FakeLM("abc"), "hi", chat=False, **kwargs)
        assert result.stop_reason == reason


def test_the_drivers_call_no_private_method_of_a_generation():
    """Both drivers move a generation through its public moves only (read from the source)."""
    model = Path(__file__).resolve().parents[1] / "streamlab" / "model"
    for name, generation in (("batching.py", {"gen"}), ("generation.py", set())):
        tree = ast.parse((model / name).read_text(encoding="utf-8"))
        private = [
            node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and (
                (isinstance(node.value, ast.Name) and node.value.id in generation)
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "gen")
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "lifecycle")
            )
        ]
        assert not private, f"{name} reaches into a generation: {private}"


def test_a_stopped_generation_by_hand_ends_stopped():
    scheduler = ByHand()
    gen = Generation(FakeLM(), "hi", scheduler=scheduler)

    async def main():
        gen.start()
        gen.stop("client_left")
        assert gen.check() == STOPPED
        gen.end(STOPPED)
        return await asyncio.wait_for(gen.wait(), 5)

    result = run_sync(main())
    assert (result.stop_reason, result.tokens, gen.stopped_by) == (STOPPED, 0, "client_left")
