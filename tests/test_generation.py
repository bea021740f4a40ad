"""The generation thread: stop flag, stop reasons, chunked prefill, the fair lock, the fake model.

Almost everything runs over ``fakes.FakeLM`` (no weights, milliseconds); the
tests marked ``model`` check on the real model what a fake cannot show.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from fakes import ASSISTANT_ID, EOS_ID, ByteTokenizer, FakeLM
from streamlab.net.aio import run_sync
from streamlab.model.detokenizer import NaiveDetokenizer, broken_pieces, detokenize
from streamlab.protocol.endings import EOS, ERROR, MAX_TOKENS, STOPPED
from streamlab.model.generation import PREFILL_CHUNK, Generation, encode_prompt, generate_text
from streamlab.model.loading import FairLock, LoadedModel

SCRIPT = "Hello 🦜 world"


def run(gen: Generation) -> tuple[list, object]:
    async def main():
        pieces = [p async for p in gen]
        return pieces, await gen.wait()

    return run_sync(main())


# -- the fake model ------------------------------------------------------------


def test_fake_tokenizer_is_one_token_per_byte():
    tok = ByteTokenizer()
    ids = tok("a🦜")["input_ids"]
    assert ids == list("a🦜".encode()) and len(ids) == 5
    assert tok.decode(ids) == "a🦜"
    assert tok.decode(ids[:3]) == "a\ufffd"  # half an emoji is a broken character, as with a real BPE
    assert tok.decode([*ids, EOS_ID]) == "a🦜<|end|>"
    assert tok.decode([*ids, EOS_ID], skip_special_tokens=True) == "a🦜"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True)
    assert chat == [*b"user: hi", EOS_ID, ASSISTANT_ID]
    assert encode_prompt(tok, "hi") == chat and encode_prompt(tok, "hi", chat=False) == [*b"hi"]


def test_fake_lm_offers_what_a_loaded_model_does():
    lm = FakeLM()
    assert isinstance(lm.lock, FairLock)
    assert (lm.name, lm.context_length, lm.load_seconds, lm.device.type) == ("fake", 2048, 0.0, "cpu")
    assert lm.eos_token_ids == {EOS_ID}
    assert next(lm.model.parameters()).dtype == torch.float32
    assert FakeLM(context_length=8192, name="big").context_length == 8192


def test_eos_and_pieces_with_times():
    lm = FakeLM(SCRIPT)
    pieces, result = run(Generation(lm, "hi", chat=False))
    assert result.stop_reason == EOS
    assert "".join(p.text for p in pieces) == SCRIPT == result.text
    assert result.tokens == len(SCRIPT.encode())  # one token per byte: the parrot is four
    assert all("\ufffd" not in p.text for p in pieces)
    assert "🦜" in [p.text for p in pieces]  # held back until its fourth byte, then sent whole
    times = [p.time for p in pieces]
    assert times == sorted(times)


def test_split_characters_are_real_with_the_fake():
    """The naive detokenizer shows the fake's emoji as broken pieces; the incremental one does not."""
    tok = ByteTokenizer()
    ids = tok(SCRIPT)["input_ids"]
    assert broken_pieces(detokenize(NaiveDetokenizer(tok), ids)) == 4
    _, result = run(Generation(FakeLM(SCRIPT), "hi", naive_detokenizer=True))
    assert result.text.count("\ufffd") == 4


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_any_sampling_follows_the_script(temperature):
    result = generate_text(FakeLM(SCRIPT), "hi", temperature=temperature, top_p=1.0, seed=3)
    assert result.text == SCRIPT


def test_chat_prompts_and_conversations():
    """The chat template ends every prompt with the assistant mark: the answer starts there."""
    lm = FakeLM(SCRIPT)
    assert generate_text(lm, "hi").text == SCRIPT  # chat=True: the template
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": SCRIPT},
        {"role": "user", "content": "again"},
    ]
    ids = lm.tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=True)
    for chunk in (0, 1, 3, 7):
        assert generate_text(lm, prompt_ids=ids, prefill_chunk=chunk).text == SCRIPT


def test_max_tokens():
    _, result = run(Generation(FakeLM(SCRIPT), "hi", chat=False, max_tokens=3))
    assert (result.stop_reason, result.tokens, result.text) == (MAX_TOKENS, 3, "Hel")


def test_ignore_eos_repeats_the_script():
    lm = FakeLM("one")
    _, result = run(Generation(lm, "hi", chat=False, max_tokens=9, ignore_eos=True))
    assert (result.stop_reason, result.tokens) == (MAX_TOKENS, 9)
    assert result.text == "oneoneo"  # one, EOS, one, EOS, o: each EOS counts as a token and shows as nothing


def test_generations_sharing_one_fake_model_each_get_the_script():
    lm = FakeLM(SCRIPT, decode_seconds=0.001)

    async def main():
        gens = [Generation(lm, f"prompt {i}", chat=i % 2 == 0, prefill_chunk=3) for i in range(4)]
        return await asyncio.gather(*(g.wait() for g in gens))

    assert [r.text for r in run_sync(main())] == [SCRIPT] * 4


def test_stop_flag_checked_before_every_token():
    lm = FakeLM(" a" * 50, decode_seconds=0.01)
    gen = Generation(lm, "hi", chat=False, max_tokens=100)

    async def main():
        got = 0
        async for piece in gen:
            got += 1
            if got == 5:
                gen.stop("client_left")
        return await gen.wait()

    result = run_sync(main())
    assert result.stop_reason == STOPPED
    assert 5 <= result.tokens <= 6
    assert gen.stopped_by == "client_left"


def test_fault_after_n_tokens():
    pieces, result = run(Generation(FakeLM(" a" * 20), "hi", chat=False, max_tokens=20, fail_after=4))
    assert result.stop_reason == ERROR
    assert result.tokens == 4 and len(pieces) == 4
    assert "injected fault" in result.error


def test_pause_is_cut_short_by_stop():
    gen = Generation(FakeLM(" a" * 10), "hi", chat=False, max_tokens=10, pauses={2: 30.0})

    async def main():
        async for piece in gen:
            if piece.tokens == 2:
                asyncio.get_running_loop().call_later(0.2, gen.stop)
        return await gen.wait()

    started = time.perf_counter()
    result = run_sync(main())
    assert result.stop_reason == STOPPED and result.tokens == 2
    assert time.perf_counter() - started < 10


def test_event_loop_keeps_running_while_the_model_computes():
    """Each fake step takes 0.3 s of blocking work; a ticker on the loop must not notice."""
    lm = FakeLM(" a b", decode_seconds=0.3)
    gaps: list[float] = []

    async def ticker(stop: asyncio.Event):
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def main():
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        result = await Generation(lm, "hi", chat=False).wait()
        stop.set()
        await tick
        return result

    result = run_sync(main())
    assert result.tokens == 4
    # A blocked loop would miss its tick for the whole of every 0.3 s step; one late
    # tick is a busy machine, not a blocked loop.
    blocked = [gap for gap in gaps if gap >= 0.29]
    assert len(blocked) <= 1, f"the event loop was blocked by the model: gaps {blocked}"


# -- chunked prefill -------------------------------------------------------------


def test_the_prompt_is_read_in_chunks():
    prompt = "x" * 1000
    lm = FakeLM(SCRIPT)
    gen = Generation(lm, prompt, chat=False, prefill_chunk=128)
    _, result = run(gen)
    assert result.text == SCRIPT
    assert gen.prompt_tokens_read == result.prompt_tokens == 1000
    assert (lm.model.prefill_calls, lm.model.prefill_tokens) == (8, 1000)  # 7 x 128 + 104

    for one_pass in (0, None):
        lm = FakeLM(SCRIPT)
        gen = Generation(lm, prompt, chat=False, prefill_chunk=one_pass)
        assert run(gen)[1].text == SCRIPT
        assert (lm.model.prefill_calls, gen.prompt_tokens_read) == (1, 1000)


def test_default_chunk_and_bad_values():
    assert Generation(FakeLM(), "hi").prefill_chunk == PREFILL_CHUNK > 0
    with pytest.raises(ValueError):
        Generation(FakeLM(), "hi", prefill_chunk=-1)


def test_each_chunk_is_its_own_turn_with_the_lock():
    class CountingLock(FairLock):
        turns = 0

        def acquire(self, *args, **kwargs):
            CountingLock.turns += 1
            return super().acquire(*args, **kwargs)

    lm = FakeLM("abc")
    lm.lock = CountingLock()
    result = generate_text(lm, "y" * 100, chat=False, prefill_chunk=10)
    assert result.text == "abc"
    assert CountingLock.turns == 10 + 3  # ten chunks, then a pass per token after the first, and one for EOS


def test_a_stop_during_prefill_ends_it_within_one_chunk():
    chunk = 100
    lm = FakeLM(SCRIPT, prefill_seconds_per_token=0.0005)  # 50 ms a chunk, 1 s for the whole prompt
    gen = Generation(lm, "z" * 2000, chat=False, prefill_chunk=chunk)

    async def main():
        gen.start()
        while gen.prompt_tokens_read < 300:
            await asyncio.sleep(0.002)
        read_at_stop = gen.prompt_tokens_read
        gen.stop("client_left")
        pieces = [p async for p in gen]
        return read_at_stop, pieces, await gen.wait()

    read_at_stop, pieces, result = run_sync(main())
    assert (result.stop_reason, result.tokens, pieces) == (STOPPED, 0, [])
    assert read_at_stop <= gen.prompt_tokens_read <= read_at_stop + chunk < 2000
    assert result.prompt_tokens == 2000


def test_a_stop_before_the_start_reads_nothing():
    lm = FakeLM(SCRIPT)
    gen = Generation(lm, "hi", chat=False)
    gen.stop()
    _, result = run(gen)
    assert (result.stop_reason, result.tokens, gen.prompt_tokens_read) == (STOPPED, 0, 0)
    assert lm.model.prefill_calls == 0


def test_an_empty_prompt_is_an_error_not_a_hang():
    _, result = run(Generation(FakeLM(), prompt_ids=[]))
    assert result.stop_reason == ERROR and "no tokens" in result.error


def _short_during_long(prefill_chunk: int, total: int = 4000) -> list[int]:
    """A short request starts while a long prompt is read: how much of the long prompt
    had been read at each of the short request's tokens."""
    lm = FakeLM("abcde", prefill_seconds_per_token=0.0002)  # 4,000 tokens: 0.8 s in all
    long_gen = Generation(lm, "L" * total, chat=False, max_tokens=1, prefill_chunk=prefill_chunk)
    seen: list[int] = []  # recorded in the short request's thread, right after each of its tokens

    async def main():
        long_gen.start()
        while not lm.lock.locked():  # the long prompt is being read
            await asyncio.sleep(0.001)
        short = Generation(
            lm, "S", chat=False, max_tokens=5, prefill_chunk=prefill_chunk,
            on_token=lambda n: seen.append(long_gen.prompt_tokens_read),
        )
        assert (await short.wait()).tokens == 5
        await long_gen.wait()
        return seen

    return run_sync(main())


def test_a_short_request_is_served_between_the_chunks_of_a_long_prompt():
    chunk = 100
    seen = _short_during_long(prefill_chunk=chunk)
    # The short request finished while the long prompt was still being read, and between two of
    # its tokens the long one got one chunk (two, if the count was bumped just as we looked).
    assert seen[-1] < 4000
    assert all(b - a <= 2 * chunk for a, b in zip(seen, seen[1:]))


def test_in_one_pass_a_short_request_waits_for_the_whole_long_prompt():
    assert _short_during_long(prefill_chunk=0)[0] == 4000


# -- the fair lock ---------------------------------------------------------------


def _queue_threads(lock: FairLock, n: int, order: list[int]) -> list[threading.Thread]:
    """Start ``n`` threads that each take the lock, one after another in the queue."""
    threads = []
    for i in range(n):

        def take(i: int = i) -> None:
            with lock:
                order.append(i)

        thread = threading.Thread(target=take)
        thread.start()
        while lock.waiting < i + 1:  # wait until this one is queued before starting the next
            time.sleep(0.001)
        threads.append(thread)
    return threads


def test_fair_lock_serves_threads_in_the_order_they_asked():
    lock, order = FairLock(), []
    lock.acquire()
    threads = _queue_threads(lock, 8, order)
    lock.release()
    for thread in threads:
        thread.join(5)
    assert order == list(range(8))
    assert not lock.locked() and lock.waiting == 0


def test_fair_lock_a_releasing_thread_cannot_take_it_back_first():
    """The barging that starves others with threading.Lock: release, then ask again at once."""
    lock, order = FairLock(), []
    lock.acquire()
    threads = _queue_threads(lock, 1, order)
    lock.release()
    with lock:  # straight back in line: behind the waiter, who got it handed over
        order.append("releaser")
    threads[0].join(5)
    assert order == [0, "releaser"]


def test_fair_lock_timeouts_and_misuse():
    lock = FairLock()
    assert lock.acquire(blocking=False)
    assert not lock.acquire(blocking=False)
    assert not lock.acquire(timeout=0.01)
    assert lock.waiting == 0  # a waiter that gave up left the queue
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()


def test_loaded_model_has_a_fair_lock():
    lm = LoadedModel("m", ByteTokenizer(), SimpleNamespace(), torch.device("cpu"), 0.0, "m")
    assert isinstance(lm.lock, FairLock)


# -- context length --------------------------------------------------------------


def _with(config: object = None, model_max_length: object = None) -> LoadedModel:
    model = SimpleNamespace(config=config) if config is not None else SimpleNamespace()
    tokenizer = SimpleNamespace(model_max_length=model_max_length)
    return LoadedModel("m", tokenizer, model, torch.device("cpu"), 0.0, "m")


def test_context_length_from_config_then_tokenizer():
    assert _with(SimpleNamespace(max_position_embeddings=4096), 512).context_length == 4096
    assert _with(SimpleNamespace(n_positions=1024)).context_length == 1024  # GPT-2's name for it
    assert _with(SimpleNamespace(), 2048).context_length == 2048
    assert _with(SimpleNamespace(), int(1e30)).context_length is None  # transformers' "no limit" placeholder
    assert _with().context_length is None


# -- the real model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def real_lm():
    from streamlab.model.loading import load_model

    return load_model()


@pytest.mark.model
def test_real_model_context_length(real_lm):
    assert real_lm.context_length == 8192


@pytest.mark.model
def test_real_model_is_reproducible(real_lm):
    a = generate_text(real_lm, "The lighthouse keeper", max_tokens=12, chat=False, ignore_eos=True)
    b = generate_text(real_lm, "The lighthouse keeper", max_tokens=12, chat=False, ignore_eos=True)
    assert a.text == b.text and a.tokens == 12
    c = generate_text(real_lm, "The lighthouse keeper", max_tokens=12, chat=False, ignore_eos=True, seed=1)
    assert c.text != a.text


@pytest.mark.model
def test_real_model_chunked_prefill_gives_the_same_greedy_answer(real_lm):
    paragraph = (
        "The keeper of the lighthouse wrote in his log every evening: the weather, the ships that "
        "passed, the state of the lamp and the oil, and now and then a line about the gulls. "
    )
    ids = encode_prompt(real_lm.tokenizer, paragraph * 30 + "Summarise the log in one sentence.")
    ids = ids[-600:]
    assert len(ids) == 600
    answers = {}
    for chunk in (0, 128):  # one pass, then five chunks (4 x 128 + 88) with the KV cache carried over
        gen = Generation(real_lm, prompt_ids=ids, max_tokens=24, temperature=0.0, prefill_chunk=chunk)
        _, result = run(gen)
        assert gen.prompt_tokens_read == 600 and result.tokens > 0
        answers[chunk] = (gen.token_ids, result.text)
    assert answers[128] == answers[0]


# -- stop sequences ------------------------------------------------------------

from streamlab.model.stop_sequences import StopSequences  # noqa: E402


def test_stop_sequence_split_across_pieces_is_held_back_then_cut():
    stops = StopSequences(["\n\nUser:"])
    sent = [stops.feed(t) for t in ["Hello", " there.\n", "\nUs", "er: hi"]]
    assert "".join(sent) == "Hello there."
    assert sent[1] == " there." and sent[2] == ""  # the newline waited for the next piece
    assert stops.matched == "\n\nUser:" and stops.feed("more") == "" and stops.flush() == ""


def test_text_that_only_looked_like_a_stop_sequence_is_sent_after_all():
    stops = StopSequences(["STOP"])
    assert stops.feed("a ST") == "a " and stops.feed("OOL") == "STOOL"
    assert stops.feed("x S") == "x " and stops.flush() == "S" and stops.matched is None


def test_earliest_of_several_stop_sequences_wins():
    stops = StopSequences(["world", "lo"])
    assert stops.feed("hello world") == "hel" and stops.matched == "lo"


def test_generation_ends_at_a_stop_sequence_without_sending_it():
    lm = FakeLM("One fish, two fish. Red fish, blue fish.")
    result = generate_text(lm, "fish", stop_sequences=["Red"], max_tokens=100)
    assert result.text == "One fish, two fish. " and result.stop_reason == "stop_sequence"
    assert result.stop_sequence == "Red"
    untouched = generate_text(lm, "fish", stop_sequences=["purple"], max_tokens=100)
    assert untouched.text == "One fish, two fish. Red fish, blue fish." and untouched.stop_reason == "eos"


# -- the hand-over: the model waits for a waiting reader to take its piece ---------

from streamlab.model import generation as generation_module  # noqa: E402
from streamlab.model.generation import PieceQueue  # noqa: E402


def test_a_queue_says_when_its_reader_waits_and_when_it_caught_up():
    async def main():
        queue = PieceQueue()
        assert not queue.reader_waiting()
        cue = queue.caught_up()
        ready = queue.ready()  # nothing queued: the reader parks
        assert queue.reader_waiting() and cue.is_set()
        cue.clear()
        queue.put_nowait("piece")
        assert ready.done() and not queue.reader_waiting()
        assert queue.ready().done() and not cue.is_set()  # an item was there: it did not catch up yet
        queue.get_nowait()
        queue.ready()
        assert cue.is_set()

    run_sync(main())


def test_the_thread_lets_a_waiting_reader_take_each_piece_before_it_makes_the_next(monkeypatch):
    monkeypatch.setattr(generation_module, "HANDOVER_WAIT", 5.0)  # never the bound here: the reader always comes
    # A slow prompt: the reader is parked before the first piece. The tokens are instant.
    lm = FakeLM("abcdefghij", prefill_seconds_per_token=0.005)
    gen = Generation(lm, "hi", max_tokens=10, ignore_eos=True, chat=False)
    got = []

    async def main():
        async for piece in gen:
            time.sleep(0.003)  # the reader's work with the piece (the server's write), the loop held
            got.append((piece.time, time.perf_counter()))
        return await gen.wait()

    result = run_sync(main())
    assert result.tokens == 10 and len(got) == 10
    # Each piece was made after the reader was done with the one before (left alone, the instant
    # fake would have made them all while the reader slept over the first).
    assert all(made > done for (made, _), (_, done) in zip(got[1:], got))


def test_a_generation_nobody_reads_is_not_held_back(monkeypatch):
    monkeypatch.setattr(generation_module, "HANDOVER_WAIT", 5.0)
    gen = Generation(FakeLM("abcdefghij"), "hi", max_tokens=30, ignore_eos=True, chat=False)

    async def main():
        gen.start()
        return await gen.wait()

    started = time.perf_counter()
    assert run_sync(main()).tokens == 30
    assert time.perf_counter() - started < 5.0  # not one wait: no reader was ever parked
