"""The load benchmark: its figures from traces (no model), and ``benchmarks/load.py --tiny`` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streamlab.book import bench
from streamlab.book.bench import parse_line
from streamlab.lab.load import READING_THRESHOLD, figures
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
    done = subprocess.run([sys.executable, str(script), "--tiny"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "STREAMLAB_BENCH_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    figures_printed = [p for p in (parse_line(line) for line in done.stdout.splitlines() if line.startswith("load: ")) if p]
    saved = json.loads((tmp_path / "load.json").read_text())
    assert figures_printed and len(figures_printed) == len(saved["measures"])
    keys = {f["key"] for f in figures_printed}
    assert {"threads_tokens_per_s_at_2", "batched_tokens_per_s_at_2", "batched_vs_threads_tokens_per_s_at_2"} <= keys
    ratio = next(m for m in saved["measures"] if m["key"] == "batched_vs_threads_tokens_per_s_at_2")
    assert ratio["target"] == 1.0 and ratio["op"] == "≥"
    rows = saved["tables"]["by engine and readers"]
    assert [(r["engine"], r["readers"]) for r in rows] == [("threads", 1), ("threads", 2), ("batched", 1), ("batched", 2)]
    assert all(r["complete"] == f"{r['readers']}/{r['readers']}" for r in rows)
    assert set(saved["data"]["gaps"]) == {"threads", "batched"} and len(saved["data"]["gaps"]["batched"]["2"]) > 0


@pytest.mark.model
def test_measure_serves_a_loaded_model_in_process(model_cache):
    """Given the model (a chapter's), each engine is served in this process: the same rows, no server to start."""
    from streamlab.lab.load import measure
    from streamlab.model.loading import load_model

    report = measure([1, 2], 3, lm=load_model(), quiet=True)
    assert report.params["server"] == "in-process"
    rows = report.tables["by engine and readers"]
    assert [(r["engine"], r["readers"]) for r in rows] == [("threads", 1), ("threads", 2), ("batched", 1), ("batched", 2)]
    assert all(r["complete"] == f"{r['readers']}/{r['readers']}" for r in rows)
    assert all(len(report.data["gaps"][engine]["2"]) > 0 for engine in ("threads", "batched"))
