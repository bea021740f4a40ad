"""What every benchmark and measuring experiment records: figures, ratios and targets, as lines and as JSON.

A benchmark makes one :class:`Report`, records what it measured, and saves it::

    report = Report("detokenizer", params={"tokens": 4096})
    report.figure("decodestream_us", 0.9, "µs/token")
    report.ratio("window_vs_decodestream", 1.8, target=2.0, rounds=[1.7, 1.8, 1.9, 1.8, 1.8])  # ≤ target
    report.save()                                                # build/bench/detokenizer.json

Each call prints one line a person reads and a test (or ``make bench``'s summary)
parses::

    detokenizer: decodestream_us = 0.9 µs/token
    detokenizer: window_vs_decodestream = 1.80x  (target ≤ 2: met in all 5 rounds, 1.70-1.90)

A target is judged by one rule (``standing``): met only where every round is
on its side, with enough rounds to say so.

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
from typing import Any, Callable, Sequence

from streamlab.lab.results.records import BUILD

# Where reports go; the test suite points this elsewhere so a tiny run never replaces a real one.
BENCH_DIR = Path(os.environ.get("STREAMLAB_BENCH_DIR") or BUILD / "bench")
LINE = re.compile(r"^(?P<bench>[\w.-]+): (?P<key>[\w.-]+) = (?P<value>\S+)(?: (?P<unit>[^()]+?))?(?:\s+\(target (?P<op>[≤≥]) (?P<target>\S+): (?P<verdict>met[^)]*|missed[^)]*|within noise[^)]*|too few[^)]*)\))?$")


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


#: Fewer alternating rounds than this say how one moment went, not whether a target is met (the book's rule too).
MIN_ROUNDS = 5

MET, MISSED, NOISE, TOO_FEW = "met", "missed", "within noise", "too few"


def standing(rounds: Sequence[float], inside: Callable[[float], bool], *, min_rounds: int = MIN_ROUNDS) -> str:
    """The project's one rule for rounds against a target: ``met``, ``missed``, ``within noise`` or ``too few``.

    Met only when every round is on the target's side, missed when none is,
    within noise when they lie on both sides (wherever their median fell), and
    too few to say below ``min_rounds``: a shared machine's one good moment is
    not a property of the code. A benchmark's line (``Measure.verdict``) and a
    chapter's sentence (``streamlab.book.prose_late.rounds_against``) both ask it.
    """
    if len(rounds) < min_rounds:
        return TOO_FEW
    sides = [bool(inside(v)) for v in rounds]
    return MET if all(sides) else MISSED if not any(sides) else NOISE


@dataclass
class Measure:
    key: str
    value: float
    unit: str = ""
    target: float | None = None
    op: str = "≤"  # ≤: lower is better; ≥: higher is better
    note: str = ""
    # The lowest and highest of the rounds the value is the median of, and how many rounds there were: the
    # verdict reads the rounds (``standing``), never the median alone.
    spread: tuple[float, float] | None = None
    rounds: int | None = None
    # A count, not a timing (readers refused, every reader ended): one measurement says it, no noise to judge.
    exact: bool = False

    def inside(self, value: float) -> bool:
        assert self.target is not None
        return value <= self.target if self.op == "≤" else value >= self.target

    @property
    def standing(self) -> str | None:
        """``standing`` of the rounds (their extremes stand for them all against a threshold); None: no target."""
        if self.target is None:
            return None
        if self.exact:
            return MET if self.inside(self.value) else MISSED
        if self.spread is None or not self.rounds:
            return TOO_FEW
        low, high = self.spread
        # Every round is on the target's side exactly when both extremes are; none when neither is.
        extremes = [low] * (self.rounds - 1) + [high] if self.rounds > 1 else [low]
        return standing(extremes, self.inside)

    @property
    def met(self) -> bool | None:
        """True only where the rule says met; None without a target."""
        return None if self.target is None else self.standing == MET

    @property
    def straddles(self) -> bool:
        return self.standing == NOISE

    def verdict(self) -> str:
        kind = self.standing
        if kind is None:
            return ""
        unit = f" {self.unit}" if self.unit and self.unit != "x" else ""
        if self.exact:  # a count: whole numbers stay whole
            by = abs(self.value - self.target)
            return MET if kind == MET else f"missed by {_fmt(int(by) if by.is_integer() else by)}{unit}"
        if kind == TOO_FEW:
            return (f"too few rounds to say: {self.rounds or 1} of {MIN_ROUNDS}"
                    + (f", {_fmt(self.spread[0])}-{_fmt(self.spread[1])}" if self.spread and self.rounds else ""))
        low, high = self.spread or (self.value, self.value)
        if kind == NOISE:
            return f"within noise: rounds {_fmt(low)}-{_fmt(high)}"
        if kind == MET:
            return f"met in all {self.rounds} rounds, {_fmt(low)}-{_fmt(high)}"
        return f"missed by {_fmt(abs(self.value - self.target))}{unit}, every round of {self.rounds}"

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
                "op": self.op, "met": self.met, "note": self.note, "spread": self.spread, "rounds": self.rounds,
                "exact": self.exact, "verdict": self.verdict()}


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
               op: str = "≤", note: str = "", rounds: Sequence[float] | None = None, exact: bool = False) -> Measure:
        """A measured figure (with its unit), optionally against a target.

        ``rounds``: the values ``value`` is the median of, which the verdict reads
        (``standing``); ``exact``: a count, judged on itself. A target with
        neither is "too few rounds to say".
        """
        return self._add(_measure(key, value, unit, target, op, note, rounds, exact))

    def ratio(self, key: str, value: float, *, target: float | None = None, op: str = "≤", note: str = "",
              rounds: Sequence[float] | None = None) -> Measure:
        """A ratio of two figures measured side by side in this run (printed as 1.23x); ``rounds`` as for ``figure``."""
        return self._add(_measure(key, value, "x", target, op, note, rounds, False))

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


def _measure(key: str, value: float, unit: str, target: float | None, op: str, note: str,
             rounds: Sequence[float] | None, exact: bool) -> Measure:
    kept = [float(v) for v in rounds or () if math.isfinite(v)]
    spread = (min(kept), max(kept)) if kept else None
    return Measure(key, float(value), unit, target, op, note, spread, len(kept) or None, exact)


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
