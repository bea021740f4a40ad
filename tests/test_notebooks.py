"""Execute every chapter with papermill at CI size and assert the figures it recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamlab.notebooks import chapters, execute

pytestmark = [pytest.mark.notebook]

# CI-sized parameters per chapter (faithful defaults stay in the notebooks).
QUICK: dict[str, dict] = {
    "01_split_characters": {"cost_lengths": [128, 512], "generate_tokens": 30},
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
