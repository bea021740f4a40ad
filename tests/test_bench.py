"""The benchmarks' report (lines a person reads and a program parses), and each benchmark at its tiny size.

Timings are never asserted here: the machines are shared and noisy. What is
asserted is that every benchmark runs, prints figure lines that parse, and
saves its report with the targets it promises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streamlab.book import bench
from streamlab.lab.results.measures import Report, parse_line
from streamlab.book.bench import summary


def test_lines_round_trip_with_targets_and_verdicts(tmp_path, capsys):
    report = Report("demo", params={"n": 1})
    report.figure("first_token_ms", 0.1663, "ms", target=10)
    report.ratio("tokens_per_s", 0.93, target=0.95, op="≥")
    report.figure("gap_p99_ms", 31.5, "ms", target=20)
    report.table("rows", [{"a": 1, "b": 2.345}, {"a": "x", "c": 3}])
    path = report.save(tmp_path)
    lines = [parse_line(line) for line in capsys.readouterr().out.splitlines()]
    figures = [p for p in lines if p]
    assert [(f["key"], f["value"]) for f in figures] == [("first_token_ms", 0.166), ("tokens_per_s", 0.93), ("gap_p99_ms", 31.5)]
    assert figures[0]["verdict"] == "met" and figures[1]["verdict"].startswith("missed by 0.02")
    assert figures[2]["verdict"] == "missed by 11.5 ms"
    saved = json.loads(path.read_text())
    assert saved["tables"]["rows"][1] == {"a": "x", "c": 3}
    assert [m["met"] for m in saved["measures"]] == [True, False, False]
    table = summary(bench.load(tmp_path))
    assert "tokens_per_s" in table and "≥ 0.95" in table and "missed by 11.5 ms" in table


def test_a_median_whose_rounds_lie_on_both_sides_of_its_target_is_within_noise(capsys):
    report = Report("demo")
    report.ratio("speedup", 1.60, target=1.6, op="≥", spread=(1.54, 1.79))
    report.ratio("clear", 1.70, target=1.6, op="≥", spread=(1.65, 1.79))
    report.ratio("short", 1.50, target=1.6, op="≥", spread=(1.45, 1.58))
    lines = [parse_line(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["verdict"] for p in lines] == ["within noise: rounds 1.54-1.79", "met", "missed by 0.1"]
    assert report.measures[0].met and report.measures[0].straddles, "the median is on the target's side"


def test_a_line_that_is_not_a_figure_is_not_parsed():
    assert parse_line("==> benchmarks/load.py") is None
    assert parse_line("prefill: saved build/bench/prefill.json") is None


def test_make_bench_runs_every_benchmark_that_exists():
    assert all((bench.SCRIPTS / f"{name}.py").exists() for name in ("detokenizer", "overhead", "prefill"))
    assert set(bench.BENCHMARKS) >= {p.stem for p in bench.SCRIPTS.glob("*.py")}, "a benchmark make bench does not run"


@pytest.mark.model
@pytest.mark.parametrize("name", ["detokenizer", "overhead", "prefill"])
def test_benchmark_runs_at_its_tiny_size(name, tmp_path):
    done = subprocess.run([sys.executable, str(bench.SCRIPTS / f"{name}.py"), "--tiny"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "STREAMLAB_BENCH_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [parse_line(line) for line in done.stdout.splitlines() if line.startswith(f"{name}: ")]
    figures = [p for p in printed if p]
    saved = json.loads((tmp_path / f"{name}.json").read_text())
    assert figures and len(figures) == len(saved["measures"])
    assert saved["tables"]
    if name != "prefill":  # prefill shows a trade-off; the others promise targets
        assert any(m["target"] is not None for m in saved["measures"])
