"""What every benchmark and measuring experiment records: figures, ratios and targets, as lines and as JSON.

A benchmark makes one :class:`Report`, records what it measured, and saves it::

    report = Report("detokenizer", params={"tokens": 4096})
    report.figure("decodestream_us", 0.9, "µs/token")
    report.ratio("window_vs_decodestream", 1.8, target=2.0)      # met when ≤ target
    report.save()                                                # build/bench/detokenizer.json

Each call prints one line a person reads and a test (or ``make bench``'s summary)
parses::

    detokenizer: decodestream_us = 0.9 µs/token
    detokenizer: window_vs_decodestream = 1.80x  (target ≤ 2: met)

The experiments (``load``, ``backpressure``) report through it too, so it sits
with them; ``streamlab.book.bench`` runs the benchmarks and prints the summary.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from streamlab.lab.results.records import BUILD

# Where reports go; the test suite points this elsewhere so a tiny run never replaces a real one.
BENCH_DIR = Path(os.environ.get("STREAMLAB_BENCH_DIR") or BUILD / "bench")
LINE = re.compile(r"^(?P<bench>[\w.-]+): (?P<key>[\w.-]+) = (?P<value>\S+)(?: (?P<unit>[^()]+?))?(?:\s+\(target (?P<op>[≤≥]) (?P<target>\S+): (?P<verdict>met|missed[^)]*|within noise[^)]*)\))?$")


def machine() -> str:
    """The machine in a few words, for the record (the figures mean little without it)."""
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def load_note() -> str:
    """The machine's load average now, and whether other programs compete for its cores (a benchmark's first line)."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    busy = f" (above the {cores} cores: other programs are competing)" if load > cores else ""
    return f"load average {load:.1f}{busy}"


def _fmt(value: float) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) >= 100):
        return f"{int(value)}"
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


@dataclass
class Measure:
    key: str
    value: float
    unit: str = ""
    target: float | None = None
    op: str = "≤"  # ≤: lower is better; ≥: higher is better
    note: str = ""
    # The lowest and highest of the rounds the value is the median of: where they lie on both sides of the
    # target, the verdict is "within noise" whichever side the median fell on.
    spread: tuple[float, float] | None = None

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value <= self.target if self.op == "≤" else self.value >= self.target

    @property
    def straddles(self) -> bool:
        return self.target is not None and self.spread is not None and min(self.spread) < self.target < max(self.spread)

    def verdict(self) -> str:
        if self.met is None:
            return ""
        if self.straddles:
            low, high = sorted(self.spread or ())
            return f"within noise: rounds {_fmt(low)}-{_fmt(high)}"
        if self.met:
            return "met"
        return f"missed by {_fmt(abs(self.value - self.target))}{(' ' + self.unit) if self.unit and self.unit != 'x' else ''}"

    def line(self, bench: str) -> str:
        value = f"{_fmt(self.value)}x" if self.unit == "x" else _fmt(self.value)
        text = f"{bench}: {self.key} = {value}"
        if self.unit and self.unit != "x":
            text += f" {self.unit}"
        if self.target is not None:
            text += f"  (target {self.op} {_fmt(self.target)}: {self.verdict()})"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "unit": self.unit, "target": self.target,
                "op": self.op, "met": self.met, "note": self.note, "spread": self.spread,
                "verdict": self.verdict()}


@dataclass
class Report:
    """One benchmark run: its parameters, its figures and ratios, its tables; printed as recorded."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    quiet: bool = False
    measures: list[Measure] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # anything else worth keeping (series for charts)
    started: float = field(default_factory=time.time)

    def _add(self, measure: Measure) -> Measure:
        self.measures.append(measure)
        if not self.quiet:
            print(measure.line(self.name), flush=True)
        return measure

    def figure(self, key: str, value: float, unit: str = "", *, target: float | None = None,
               op: str = "≤", note: str = "") -> Measure:
        """A measured figure (with its unit), optionally against a target."""
        return self._add(Measure(key, float(value), unit, target, op, note))

    def ratio(self, key: str, value: float, *, target: float | None = None, op: str = "≤", note: str = "",
              spread: tuple[float, float] | None = None) -> Measure:
        """A ratio of two figures measured side by side in this run (printed as 1.23x); ``spread``: its rounds' range."""
        return self._add(Measure(key, float(value), "x", target, op, note, spread))

    def table(self, name: str, rows: Sequence[dict[str, Any]]) -> None:
        """Rows of a table (printed aligned, kept in the JSON)."""
        rows = [dict(r) for r in rows]
        self.tables[name] = rows
        if not self.quiet and rows:
            print(f"\n{self.name}: {name}")
            print(format_table(rows))
            print(flush=True)

    def get(self, key: str) -> float:
        for m in self.measures:
            if m.key == key:
                return m.value
        raise KeyError(key)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "machine": machine(),
            "date": time.strftime("%Y-%m-%d", time.localtime(self.started)),
            "seconds": round(time.time() - self.started, 1),
            "params": self.params,
            "measures": [m.as_dict() for m in self.measures],
            "tables": self.tables,
            "data": self.data,
        }

    def save(self, folder: Path | None = None) -> Path:
        folder = Path(folder) if folder is not None else BENCH_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.json"
        path.write_text(json.dumps(self.as_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        if not self.quiet:
            print(f"{self.name}: saved {path}", flush=True)
        return path


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of dicts as aligned plain text (numbers formatted the way the lines are)."""
    if not rows:
        return ""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    cells = [[_fmt(r.get(c, "")) if isinstance(r.get(c, ""), (int, float)) else str(r.get(c, "")) for c in columns]
             for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    out = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def parse_line(line: str) -> dict[str, Any] | None:
    """One printed line back into its parts (None for a line that is not a figure)."""
    m = LINE.match(line.strip())
    if not m:
        return None
    parts = m.groupdict()
    value = parts["value"].rstrip("x")
    try:
        parts["value"] = float(value)
    except ValueError:
        return None
    return parts
