"""Execute every chapter with papermill at CI size and assert the figures it recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamlab.notebooks import chapters, execute

pytestmark = [pytest.mark.notebook]

# CI-sized parameters per chapter (faithful defaults stay in the notebooks).
QUICK: dict[str, dict] = {
    "01_split_characters": {"cost_lengths": [128, 512], "generate_tokens": 30},
    "02_three_ways": {"n_prompts": 2, "max_tokens": 60},
    "03_bytes_on_the_wire": {"n_prompts": 1, "max_tokens": 30},
    "04_the_reader": {"n_prompts": 2, "max_tokens": 40},
}


def run_chapter(name: str, tmp_path: Path) -> dict:
    notebook = next(nb for nb in chapters() if nb.stem == name)
    return execute(notebook, parameters=QUICK.get(name, {}), out_dir=tmp_path, timeout=900)["figures"]


def test_every_chapter_has_quick_parameters():
    assert {nb.stem for nb in chapters()} <= set(QUICK)


def test_01_split_characters(tmp_path):
    f = run_chapter("01_split_characters", tmp_path)
    assert f["naive_broken"] > 0
    assert f["incremental_broken"] == 0
    assert f["joined_equal"] is True
    assert all(row["naive broken"] > 0 and row["incremental broken"] == 0 for row in f["scripts"])
    assert all(row["joined equals original"] for row in f["scripts"])
    # Costs are measured, not asserted (timings belong to benchmarks/); the table must be there.
    assert [row["answer length (tokens)"] for row in f["cost_us_per_token"]] == [128, 512]
    assert f["flush_holds_fragment"] is True
    assert f["model_incremental_broken"] == 0
    assert f["model_joined_equal"] is True


def test_02_three_ways(tmp_path):
    f = run_chapter("02_three_ways", tmp_path)
    ways = f["ways"]
    assert f["complete_first_equals_end"] is True
    for way in ("stream", "ws"):
        assert ways[way]["first text (s)"] < ways[way]["end (s)"] / 10, way
    assert f["same_text"] is True
    # Streaming costs bytes: /complete is the cheapest per byte of text, SSE the dearest.
    assert ways["complete"]["ratio"] < ways["ws"]["ratio"] < ways["stream"]["ratio"]
    assert all(row["complete"] for row in f["rows"])


def test_03_bytes_on_the_wire(tmp_path):
    f = run_chapter("03_bytes_on_the_wire", tmp_path)
    sizes = f["bytes_per_event"]
    assert f["smallest"] == "WebSocket frame" and f["largest"] == "OpenAI chat.completion.chunk"
    assert sizes["WebSocket frame"] < sizes["streamlab SSE event"] < sizes["Anthropic content_block_delta"]
    assert f["recoverable_plain"] == 1.0
    assert f["recoverable_padded"] < 1.0 and f["padding_cost"] > 1.0


def test_04_the_reader(tmp_path):
    f = run_chapter("04_the_reader", tmp_path)
    assert 1.0 < f["tokens_per_word"] < 2.0
    assert abs(f["reading_tps"] - 238 / 60 * f["tokens_per_word"]) < 1e-9
    assert abs(f["tpot_threshold_s"] - 1 / f["reading_tps"]) < 1e-9
    assert f["generation_tps"] > 0 and f["ratio"] == pytest.approx(f["generation_tps"] / f["reading_tps"])
    for row in f["waits"]:
        assert row["wait, streaming (s)"] < row["wait, no streaming (s)"]
