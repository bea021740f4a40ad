"""The load benchmark: its figures from traces (no model), and ``benchmarks/load.py --tiny`` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streamlab.book import bench
from streamlab.lab.results.measures import parse_line
from streamlab.client.metrics import READING_THRESHOLD
from streamlab.lab.experiments.load import figures
from streamlab.client.tracing import Trace, TraceEvent


def trace(sent: float, times: list[float], tokens: int) -> Trace:
    t = Trace(way="stream", sent=sent, tokens=tokens, complete=True, end=times[-1] + 0.01)
    t.events = [TraceEvent(x, "text", "a") for x in times]
    t.first_text = times[0]
    return t


def test_figures_from_traces():
    fast = trace(100.0, [0.5, 0.6, 0.7, 0.8], 4)  # a token every 100 ms
    slow = trace(100.0, [1.0, 1.3, 1.6, 2.2], 4)  # 300, 300, 600 ms
    row = figures([fast, slow], wall=2.21)
    assert row["readers"] == row["complete"] == 2 and row["tokens"] == 8
    assert row["ttft_p50_s"] == pytest.approx(0.75)
    assert row["tpot_p50_s"] == pytest.approx((0.3 / 3 + 1.2 / 3) / 2)
    assert row["gap_max_s"] == pytest.approx(0.6)
    assert row["gaps_over_threshold"] == pytest.approx(3 / 6)  # the slow reader's three gaps are over 0.2 s
    assert READING_THRESHOLD == 0.2
    assert row["tokens_per_s"] == pytest.approx(8 / 2.21)
    assert sorted(row["_gaps"]) == pytest.approx([0.1, 0.1, 0.1, 0.3, 0.3, 0.6])


@pytest.mark.model
def test_the_benchmark_runs_at_its_tiny_size(tmp_path):
    script = bench.SCRIPTS / "load.py"
    done = subprocess.run([sys.executable, str(script), "--tiny", "--engines", "batched,default"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "STREAMLAB_BENCH_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    figures_printed = [p for p in (parse_line(line) for line in done.stdout.splitlines() if line.startswith("load: ")) if p]
    saved = json.loads((tmp_path / "load.json").read_text())
    assert figures_printed and len(figures_printed) == len(saved["measures"])
    keys = {f["key"] for f in figures_printed}
    assert {"batched_tokens_per_s_at_2", "default_tokens_per_s_at_2"} <= keys
    rows = saved["tables"]["by engine and readers"]
    assert [(r["engine"], r["readers"]) for r in rows] == [("batched", 1), ("batched", 2), ("default", 1), ("default", 2)]
    assert all(r["complete"] == f"{r['readers']}/{r['readers']}" and r["refused"] == 0 for r in rows)
    assert set(saved["data"]["gaps"]) == {"batched", "default"} and len(saved["data"]["gaps"]["batched"]["2"]) > 0
    scale = next(m for m in saved["measures"] if m["key"] == "default_tokens_per_s_2_vs_1")
    assert (scale["target"], scale["op"]) == (1.5, "≥")
    assert {"default_refused_at_2", "default_slowest_reader_tpot_at_2"} <= keys


def test_the_shipped_server_is_held_to_its_targets():
    """At 8 readers against one: the scale-up, the slowest reader over the threshold, the format against float32."""
    from streamlab.lab.experiments.load import shipped_figures
    from streamlab.lab.results.measures import Report

    def row(tokens_per_s: float, worst: float, refused: int = 0) -> dict:
        return {"tokens_per_s": tokens_per_s, "tpot_worst_s": worst, "refused": refused, "complete": 8 - refused}

    report = Report("load", quiet=True)
    shipped_figures(report, {"default": {1: row(25.0, 0.04), 8: row(45.0, 0.25, refused=1)},
                             "float32": {1: row(14.0, 0.07)}}, at=8)
    got = {m.key: m for m in report.measures}
    # One run at each level: the figures are there, and too few rounds to call a target met.
    assert got["default_tokens_per_s_8_vs_1"].value == pytest.approx(1.8)
    assert got["default_tokens_per_s_8_vs_1"].standing == "too few"
    slowest = got["default_slowest_reader_tpot_at_8"]
    assert slowest.value == pytest.approx(0.25 / READING_THRESHOLD) and slowest.met is False
    assert got["default_vs_float32_one_reader_tokens_per_s"].value == pytest.approx(25 / 14)
    assert got["default_refused_at_8"].value == 1
    plain = Report("load", quiet=True)
    shipped_figures(plain, {"batched": {1: row(1, 1)}}, at=1)
    assert plain.measures == [], "nothing is claimed for a server that was not measured as shipped"


@pytest.mark.model
def test_measure_serves_a_loaded_model_in_process(model_cache):
    """Given the model (a chapter's), each engine is served in this process: the same rows, no server to start."""
    from streamlab.lab.experiments.load import measure
    from streamlab.model.loading import load_model

    report = measure([1, 2], 3, lm=load_model(), quiet=True)
    assert report.params["server"] == "in-process"
    rows = report.tables["by engine and readers"]
    assert [(r["engine"], r["readers"]) for r in rows] == [("threads", 1), ("threads", 2), ("batched", 1), ("batched", 2)]
    assert all(r["complete"] == f"{r['readers']}/{r['readers']}" for r in rows)
    assert all(len(report.data["gaps"][engine]["2"]) > 0 for engine in ("threads", "batched"))
    ratio = next(m for m in report.measures if m.key == "batched_vs_threads_tokens_per_s_at_2")
    assert ratio.target == 1.0 and ratio.op == "≥"
