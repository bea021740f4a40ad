"""Chapters 11 to 15's plumbing (streamlab.book.prose_late): tables a reader reads, verdicts that follow their numbers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from streamlab.book import prose_late
from streamlab.book.proofread import prose_problems
from streamlab.client.metrics import READING_THRESHOLD


def test_a_tidy_table_shows_no_python_values_and_no_long_floats():
    rows = [{"a_b": 0.123456, "flag": True, "none": None, "nan": math.nan, "ids": [2, 5], "n": 4.0, "name": "x"}]
    (row,) = prose_late.tidy(rows, {"a_b": "share", "flag": "kept", "none": "stop reason", "nan": "error",
                                    "ids": "ids sent back", "n": "pieces", "name": "name"})
    assert row == {"share": 0.12, "kept": "yes", "stop reason": "—", "error": "—", "ids sent back": "2 and 5",
                   "pieces": 4, "name": "x"}
    (kept,) = prose_late.tidy(rows)  # no mapping: every key, as it is
    assert list(kept) == list(rows[0]) and kept["flag"] == "yes"
    assert prose_late.tidy([{"ms": 145.625977}], places={"ms": 0}) == [{"ms": 146}]


def test_a_tidy_value_takes_numpys_scalars_too():
    numpy = pytest.importorskip("numpy")
    assert prose_late.tidy_value(numpy.bool_(False)) == "no"
    assert prose_late.tidy_value(numpy.float64(55.108762), 1) == 55.1
    assert prose_late.tidy_value(numpy.float64("nan")) == prose_late.BLANK


@pytest.mark.parametrize(("values", "said"), [
    ([3.0], "one round, too few to say"),
    ([1.0, 2.0], "too few to say"),
    ([1.0, 2.0, 3.0, 4.0, 5.0], "so met"),
    ([11.0, 12.0, 13.0, 14.0, 15.0], "so missed"),
    ([1.0, 12.0, 3.0, 4.0, 5.0], "within noise"),
])
def test_rounds_are_held_against_a_target_with_their_spread(values, said):
    words = prose_late.rounds_against(values, lambda v: abs(v) <= 10, "within 10 ms", unit=" ms", digits=1)
    assert said in words
    assert prose_problems(f"It reached its first token 1.0 ms later ({words}).") == []


def test_a_pace_is_worded_against_the_threshold():
    assert prose_late.pace_standing(0.5 * READING_THRESHOLD)[0] == "under the threshold"
    assert prose_late.pace_standing(READING_THRESHOLD)[0] == "at about the threshold"
    standing, meaning = prose_late.pace_standing(1.315 * READING_THRESHOLD)
    assert standing == "over the threshold, 1.31x it" or standing == "over the threshold, 1.32x it"
    assert "notices the gaps" in meaning
    # a mean under the threshold with many gaps over it is no smooth read
    standing, meaning = prose_late.pace_standing(0.177, over=0.34)
    assert standing == "under the threshold on average" and "34% of the gaps" in meaning
    assert prose_late.pace_standing(0.177, over=0.01)[0] == "under the threshold"
    assert prose_problems(f"A reader's time per token was 177 ms, {standing}: {meaning}.") == []


def test_a_backpressure_policy_is_named_in_words():
    assert prose_late.policy_name({"policy": "unbounded", "max_queued": 0, "slow_reader_timeout": 0.0}) == "unbounded"
    assert prose_late.policy_name({"max_queued": 256, "slow_reader_timeout": None}) == "bounded at 256"
    assert prose_late.policy_name({"max_queued": 256, "slow_reader_timeout": 2.0}) == "bounded at 256, 2 s timeout"


def test_chapter_11s_tables_have_words_for_headers_and_round_their_buffers():
    (bp,) = prose_late.backpressure_rows([{
        "policy": "bounded_timeout", "max_queued": 256, "slow_reader_timeout": 2.0, "tokens_generated": 1037,
        "pieces_read": 12, "peak_queued": 256, "peak_kernel_kib": 145.625977, "peak_transport_kib": 64.036133,
        "waited_s": 2.0, "stored_reason": "slow_reader"}])
    assert bp["policy"] == "bounded at 256, 2 s timeout" and bp["kernel buffers, at most (KiB)"] == 146
    assert all("_" not in title for title in bp)
    (stream,) = prose_late.stream_rows([{"server": "uvicorn+starlette", "protocol": "sse", "streams": 400,
                                         "gap_p50_ms": 50.0004, "gap_p99_ms": 54.65, "first_event_p99_ms": 65.505,
                                         "cpu_s_per_10k_events": 1.479, "kb_per_stream": 18.35, "completed": 400,
                                         "failed": 0}])
    assert stream["server"] == "uvicorn + Starlette" and stream["protocol"] == "SSE" and stream["median gap (ms)"] == 50
    (load,) = prose_late.load_rows([{"engine": "batched", "readers": 8, "TTFT p50 (s)": 0.568166,
                                     "TTFT p95 (s)": 0.984874, "TPOT p50 (ms)": 105.586772, "gap p50 (ms)": 50.77,
                                     "gap p99 (ms)": 627.75, "gap max (ms)": 693.2, "gaps > 0.2 s": "18%",
                                     "tokens/s": 47.481565, "slowest reader's TPOT (ms)": 161.2, "complete": "8/8",
                                     "refused": 0}])
    assert load["time per token, median (ms)"] == 106 and load["tokens/s, all readers"] == 47.5
    assert load["gaps over 200 ms"] == "18%"


def test_the_schedule_is_judged_by_the_median_gap_and_the_p99_says_who_fell_behind():
    rows = [{"server": "streamlab", "protocol": "sse", "gap_p50_ms": 49.96, "gap_p99_ms": 92.5},
            {"server": "uvicorn+starlette", "protocol": "sse", "gap_p50_ms": 50.0, "gap_p99_ms": 54.7},
            {"server": "websockets", "protocol": "ws", "gap_p50_ms": 80.0, "gap_p99_ms": 130.0}]
    said = prose_late.schedule_words(rows, 50.0)
    assert "the 50 ms schedule for 2 of 3 stacks" in said and "longer for websockets over WebSocket (80 ms)" in said
    assert "from 55 ms (uvicorn + Starlette over SSE) to 130 ms (websockets over WebSocket)" in said
    assert "falls behind its schedule" not in said
    everyone = prose_late.schedule_words(rows[:2], 50.0)
    assert "for both stacks" in everyone and "longer" not in everyone
    assert prose_problems(said) == [] and prose_problems(everyone) == []


def test_replicas_are_named_by_their_place_not_their_port():
    name = prose_late.replica_namer([SimpleNamespace(port=40001), SimpleNamespace(port=40002)])
    assert name("http://127.0.0.1:40002") == "replica 2" and name("127.0.0.1:40001") == "replica 1"
    assert name(40001) == "replica 1" and name(None) == prose_late.BLANK and name("elsewhere") == "elsewhere"
