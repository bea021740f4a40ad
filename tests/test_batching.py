"""The batched engine on the real model: the same answers as a thread per generation, all at once.

Each generation samples with its own seeded ``Sampler`` whether it runs in
its thread or in a row of the batch, so its answer must not change. A row of
a padded batch is computed with other matrix shapes than the same sequence
alone, so its logits can differ in the last float bits; at these sizes no
token flips (checked here with the default sampling settings, seed and all,
and with greedy decoding where many rows of different lengths share a batch).

Small sizes (a few tokens each): the whole file runs in well under a minute
on 2 shared cores.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from streamlab.net.errors import UserError
from streamlab.net.aio import run_sync
from streamlab.model.batching import MAX_HOLES, BatchedEngine, can_batch
from streamlab.protocol.endings import EOS, ERROR, MAX_TOKENS, STOP_SEQUENCE, STOPPED
from streamlab.model.generation import Generation, encode_prompt

model = pytest.mark.model

PROMPTS = [
    "Hi",
    "Tell me about ferries.",
    "Write a haiku about the sea and the long night of the lighthouse keeper, who keeps the lamp lit.",
]


@pytest.fixture(scope="module")
def lm():
    """The model in float32: the engine's padding, masks and positions are checked by exact answers.

    In the default decode format (split-int4) each matrix product casts its
    input to bfloat16, which turns float32's round-off between a padded batch
    and a lone row into another token now and then at a near-tie: the
    bookkeeping under test is the same, but "the same text" would no longer
    say that it is right.
    """
    from streamlab.model.loading import load_model

    return load_model(precision="float32")


@pytest.fixture
def engine(lm):
    return BatchedEngine(lm)


def results(gens: list[Generation]) -> list:
    async def main():
        for gen in gens:
            gen.start()
        return [await gen.wait() for gen in gens]

    return run_sync(main())


def alone(lm, prompt, **kwargs):
    (result,) = results([Generation(lm, prompt, **kwargs)])
    return result


@model
def test_the_real_model_can_be_batched_and_the_fake_cannot(lm):
    from fakes import FakeLM

    assert can_batch(lm) and not can_batch(FakeLM())


@model
def test_one_generation_alone_gives_the_threads_answer(lm, engine):
    kwargs = dict(max_tokens=10, ignore_eos=True, seed=3)  # the default sampling: temperature 0.7, top-p 0.9
    thread = alone(lm, PROMPTS[1], **kwargs)
    gen = Generation(lm, PROMPTS[1], scheduler=engine, **kwargs)
    (batched,) = results([gen])
    assert batched.text == thread.text and batched.tokens == 10 and batched.stop_reason == MAX_TOKENS
    assert len(batched.token_times) == 10 and batched.started <= batched.token_times[0] <= batched.ended
    assert gen.prompt_tokens_read == len(gen.prompt_ids) and engine.stats.steps == 9  # the first token comes with the prompt


@model
def test_a_lone_generation_is_stepped_as_a_bare_loop_is_and_a_ragged_batch_with_a_mask(lm, engine):
    steps = []
    forward = engine._forward

    def spy(ids, cache, **kwargs):
        if ids.shape[1] == 1:  # a decode step (a prompt chunk has the chunk's length)
            steps.append((ids.shape[0], sorted(kwargs)))
        return forward(ids, cache, **kwargs)

    engine._forward = spy
    thread = alone(lm, PROMPTS[1], max_tokens=5, ignore_eos=True)
    (lone,) = results([Generation(lm, PROMPTS[1], max_tokens=5, ignore_eos=True, scheduler=engine)])
    assert lone.text == thread.text
    assert steps == [(1, [])] * 4  # no mask, no positions: the cache's length is the row's position
    steps.clear()
    results([Generation(lm, p, max_tokens=5, ignore_eos=True, scheduler=engine) for p in PROMPTS[:2]])
    assert (2, ["attention_mask", "position_ids"]) in steps  # rows of two lengths: padding to mask


@model
def test_rows_of_different_lengths_each_get_their_own_answer(lm, engine):
    prompts = PROMPTS
    greedy = dict(max_tokens=8, ignore_eos=True, temperature=0.0, chat=False)
    sampled = dict(max_tokens=8, ignore_eos=True, seed=11)
    kinds = [greedy, sampled]
    # The threads' answers run at the same time as the batch: both take turns on the model's lock.
    threads = [Generation(lm, p, **k) for p in prompts for k in kinds]
    batched = [Generation(lm, p, scheduler=engine, **k) for p in prompts for k in kinds]
    got = results(threads + batched)
    mine, theirs = got[len(threads):], got[: len(threads)]
    assert [r.text for r in mine] == [r.text for r in theirs]
    assert engine.stats.max_batch >= len(batched) - 2  # (the first may finish before the last prompt is read)


@model
def test_a_generation_joins_while_others_decode(lm, engine):
    first = Generation(lm, PROMPTS[1], max_tokens=14, ignore_eos=True, scheduler=engine)
    late = Generation(lm, PROMPTS[2], max_tokens=6, ignore_eos=True, scheduler=engine)

    async def main():
        first.start()
        while first.tokens < 4:
            await asyncio.sleep(0.01)
        joined_at = first.tokens
        late.start()
        return joined_at, await first.wait(), await late.wait()

    joined_at, a, b = run_sync(main())
    assert 4 <= joined_at < 14
    assert a.text == alone(lm, PROMPTS[1], max_tokens=14, ignore_eos=True).text
    assert b.text == alone(lm, PROMPTS[2], max_tokens=6, ignore_eos=True).text
    assert engine.stats.max_batch == 2 and engine.stats.rebuilds >= 2  # the first alone, then the two together


@model
def test_stop_ends_a_row_within_one_step_and_the_others_go_on(lm, engine):
    leaving = Generation(lm, PROMPTS[1], max_tokens=40, ignore_eos=True, scheduler=engine)
    staying = Generation(lm, PROMPTS[0], max_tokens=12, ignore_eos=True, scheduler=engine)

    async def main():
        leaving.start()
        staying.start()
        while leaving.tokens < 3:
            await asyncio.sleep(0.005)
        at_stop = leaving.tokens
        leaving.stop()
        return at_stop, await leaving.wait(), await staying.wait()

    at_stop, stopped, finished = run_sync(main())
    assert stopped.stop_reason == STOPPED and stopped.tokens <= at_stop + 1  # the step under way, at most
    assert finished.stop_reason == MAX_TOKENS and finished.tokens == 12
    assert finished.text == alone(lm, PROMPTS[0], max_tokens=12, ignore_eos=True).text


@model
def test_a_long_prompt_is_read_in_chunks_between_the_others_steps(lm, engine):
    text = "The keeper of the lighthouse wrote in his log every evening: the weather, the ships, the lamp. " * 20
    ids = encode_prompt(lm.tokenizer, text + "Summarise the log.")[-400:]
    decoding = Generation(lm, PROMPTS[1], max_tokens=30, ignore_eos=True, scheduler=engine)
    reading = Generation(lm, prompt_ids=ids, max_tokens=2, temperature=0.0, prefill_chunk=100, scheduler=engine)

    async def main():
        decoding.start()
        while decoding.tokens < 2:
            await asyncio.sleep(0.005)
        started = time.perf_counter()
        reading.start()
        return started, await reading.wait(), await decoding.wait()

    started, long_one, other = run_sync(main())
    first_of_long = long_one.token_times[0]
    during = [t for t in other.token_times if started <= t <= first_of_long]
    assert reading.prompt_tokens_read == 400 and engine.stats.chunks == 1 + 4  # its prompt, then four chunks of 100
    assert len(during) >= 3  # a token of the other between the chunks
    gaps = [b - a for a, b in zip(other.token_times, other.token_times[1:])]
    # About one chunk and one step each (a quarter of the reading and a bit), never the whole prompt.
    # (A ratio, not seconds: this machine is shared, and its absolute times wander.)
    assert max(gaps) < 0.75 * (first_of_long - started)
    assert other.text == alone(lm, PROMPTS[1], max_tokens=30, ignore_eos=True).text


@model
def test_endings_are_the_threads_endings(lm, engine):
    free = dict(max_tokens=60, seed=1)
    (whole,) = results([Generation(lm, PROMPTS[0], **free)])
    assert whole.stop_reason == EOS  # "Hi" gets a short greeting, and the model says when it is done
    cut = whole.text[len(whole.text) // 3 : len(whole.text) // 3 + 4]
    cases = [
        dict(max_tokens=5, seed=1),  # max_tokens
        dict(max_tokens=60, seed=1, stop_sequences=[cut]),  # a stop sequence in the middle
        dict(max_tokens=0),  # nothing at all
        dict(max_tokens=10, fail_after=3),  # the injected fault
    ]
    threads = [whole, *results([Generation(lm, PROMPTS[0], **c) for c in cases])]
    batched = results([Generation(lm, PROMPTS[0], scheduler=engine, **c) for c in [free, *cases]])

    def ending(r):
        return (r.text, r.tokens, r.stop_reason, r.stop_sequence, r.error)

    assert [ending(r) for r in batched] == [ending(r) for r in threads]
    assert [r.stop_reason for r in batched] == [EOS, MAX_TOKENS, STOP_SEQUENCE, MAX_TOKENS, ERROR]
    (empty,) = results([Generation(lm, prompt_ids=[], scheduler=engine)])
    assert empty.stop_reason == ERROR and "no tokens" in empty.error


@model
def test_a_row_without_room_sits_out_then_rejoins_with_its_answer_intact(lm, engine):
    room = {"ok": True}
    slow = Generation(lm, PROMPTS[1], max_tokens=10, ignore_eos=True, scheduler=engine)
    slow.has_room = lambda: room["ok"]  # the backpressure hook: its reader is not keeping up
    busy = Generation(lm, PROMPTS[2], max_tokens=3 + MAX_HOLES + 6, ignore_eos=True, scheduler=engine)
    paused = Generation(lm, PROMPTS[0], max_tokens=6, ignore_eos=True, pauses={2: 0.3}, scheduler=engine)

    async def main():
        for gen in (slow, busy, paused):
            gen.start()
        while slow.tokens < 3:
            await asyncio.sleep(0.002)
        room["ok"] = False
        held = slow.tokens
        while busy.tokens < held + MAX_HOLES + 2:  # long enough to be parked out of the batch
            await asyncio.sleep(0.005)
        still = slow.tokens
        room["ok"] = True
        return held, still, await slow.wait(), await busy.wait(), await paused.wait()

    held, still, a, b, c = run_sync(main())
    assert still <= held + 1  # no token while its reader was behind (but the step under way)
    assert engine.stats.holes > 0 and engine.stats.rebuilds >= 3  # a hole, then parked, then back
    assert a.text == alone(lm, PROMPTS[1], max_tokens=10, ignore_eos=True).text
    assert b.text == alone(lm, PROMPTS[2], max_tokens=3 + MAX_HOLES + 6, ignore_eos=True).text
    assert c.text == alone(lm, PROMPTS[0], max_tokens=6, ignore_eos=True).text
    times = c.token_times
    assert times[2] - times[1] >= 0.3  # the pause, as the thread keeps it


# -- the server option -----------------------------------------------------------


def test_the_engine_flag():
    from streamlab.server.config import ENGINE, ServerConfig, config_from_args, parse_args

    assert config_from_args(parse_args([])).engine == ENGINE == ServerConfig().engine
    assert config_from_args(parse_args(["--engine", "batched"])).engine == "batched"
    assert config_from_args(parse_args(["--engine", "threads"])).engine == "threads"
    with pytest.raises(UserError):  # one line, exit 2, from the cli wrapper
        parse_args(["--engine", "magic"])


def test_a_model_that_cannot_be_batched_runs_threads_whatever_the_config():
    from fakes import FakeLM
    from inprocess import serving
    from streamlab.client import timed as client

    with serving(FakeLM("Hello, world!"), engine="batched") as server:
        trace = client.stream_sync(server.port, "hi", 50)
        assert trace.text == "Hello, world!" and trace.complete
        assert server.source._batched is None


@model
def test_the_server_streams_from_the_batch(lm):
    from inprocess import serving
    from streamlab.client import timed as client

    async def readers(port):
        return await asyncio.gather(
            *(client.stream(port, PROMPTS[i], 6, seed=i, ignore_eos=True) for i in range(3)),
            client.stream(port, PROMPTS[1], 30, seed=9, ignore_eos=True, stop_after=2),  # leaves after 2 pieces
        )

    texts = {}
    for engine in ("threads", "batched"):
        with serving(lm, engine=engine, max_active=4) as server:
            traces = run_sync(readers(server.port))
            texts[engine] = [t.text for t in traces[:3]]
            assert all(t.complete and t.tokens == 6 for t in traces[:3])
            left = client.wait_log_sync(server.port, traces[3].request_id)
            assert left["stop_reason"] == STOPPED and left["tokens"] <= left["tokens_at_stop"] + 2
            if engine == "batched":
                assert server.source._batched.stats.max_batch >= 2
            else:
                assert server.source._batched is None
    assert texts["batched"] == texts["threads"]
