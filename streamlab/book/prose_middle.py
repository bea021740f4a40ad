"""Plumbing for chapters 6 to 10, out of the chapters' sight: tables as a reader reads them, and words from numbers.

A chapter shows its experiment's calls and the library source it explains;
what turns a result into a table a reader can read (words for yes and no, a
dash for nothing, lists written out, floats rounded, headers in words) and the
few comparisons its sentences choose their words from live here, tested in
``tests/test_prose_middle.py``:

    readable(table)                   True -> 'yes', None/NaN -> '—', [200, 204] -> '200, 204', 0.018476 -> 0.018
    against(0.054, 0.2)               'under' (or 'at about', 'over') a threshold
    times_over(1.19, 0.2)             '6x'
    compared(4.55, 6.33)              'longer', 'shorter' or 'about as long' (within a tenth)
    hop_rows(traces)                  chapter 6's table: first byte, first event, end, longest silence
    no_ports(text)                    'http://127.0.0.1:41153/' -> 'http://127.0.0.1:PORT/': a free port says nothing
    browser_version()                 'Chromium 156': the browser chapter 9's hostile page ran in
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from typing import Any, Mapping

__all__ = ["against", "browser_version", "compared", "hop_rows", "no_ports", "readable", "times_over", "words_for"]

MISSING = "—"
_LOCAL_PORT = re.compile(r"(?<![\w.])(127\.0\.0\.1|localhost|\[::1\]):\d{2,5}\b")


def no_ports(text: str) -> str:
    """A loopback address without its port: the free port a run picked means nothing on the page, so it says PORT."""
    return _LOCAL_PORT.sub(r"\1:PORT", text)


def words_for(name: str) -> str:
    """A column's name as words: 'browser_saw' -> 'browser saw' (a header in code is a header a reader must decode)."""
    return name.replace("_", " ") if isinstance(name, str) and re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", name) else name


def _cell(value: Any, digits: int) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(_cell(v, digits)) for v in value) if value else MISSING
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, str):
        return no_ports(value)
    try:  # numpy's floats and missing values, without importing numpy here
        if value != value:
            return MISSING
    except (TypeError, ValueError):
        pass
    return value


def readable(table: Any, *, digits: int = 3) -> Any:
    """A DataFrame as a reader should see it: no Python values, no unrounded floats, no code names as headers.

    Booleans become 'yes' and 'no', None and NaN a dash, a list its items
    joined by commas, a float rounded to ``digits`` decimals, a loopback
    address's port 'PORT'; column and index names in snake_case are written as
    words. A column of numbers keeps its numbers (right-aligned, as pandas
    shows them).
    """
    shown = table.copy()
    for column in shown.columns:
        values = [_cell(v, digits) for v in shown[column]]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        shown[column] = values
        if not numbers:
            shown[column] = shown[column].astype(object)
    shown.columns = [words_for(c) for c in shown.columns]
    shown.index.names = [words_for(n) for n in shown.index.names]
    return shown


def against(value: float, threshold: float, *, margin: float = 0.1) -> str:
    """Where a value stands against a threshold, in words its numbers choose: 'under', 'at about' or 'over'."""
    if value < (1 - margin) * threshold:
        return "under"
    return "at about" if value <= (1 + margin) * threshold else "over"


def times_over(value: float, threshold: float) -> str:
    """How many times a threshold a value is, as a reader says it: '6x', '1.5x'."""
    ratio = value / threshold
    return f"{ratio:.0f}x" if ratio >= 3 else f"{ratio:.1f}x"


def compared(before: float, after: float, *, longer: str = "longer", shorter: str = "shorter",
             same: str = "about as long", margin: float = 0.1) -> str:
    """The word for ``after`` against ``before``: within ``margin`` (a share of ``before``) it is the same."""
    if abs(after - before) <= margin * before:
        return same
    return longer if after > before else shorter


def hop_rows(traces: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Chapter 6's table: per path, first byte, first event, end, and the reader's longest silence.

    The longest silence counts the wait for the first event as one: through a
    hop that holds the stream it is the whole answer, where the direct path's
    is its slowest token. That column tells a buffering hop from a stream;
    the share of gaps above a threshold does not (one gap of 25 either way).
    """
    rows = []
    for label, t in traces.items():
        first = t.first_text if t.first_text is not None else t.end
        rows.append({
            "path": label, "first byte (s)": t.first_byte, "first event (s)": t.first_text, "end (s)": t.end,
            "first event / end": t.first_text / t.end if t.first_text and t.end else None,
            "longest silence (s)": max([first or 0.0, *t.gaps()]), "complete": t.complete,
        })
    return rows


def browser_version(binary: str | None = None) -> str | None:
    """'Chromium 156' for the Chromium here (the one the chapter's page ran in), or None when there is none."""
    found = binary or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        return None
    try:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(Chromium|Google Chrome|Chrome)\s+(\d+)", out)
    return f"{match.group(1)} {match.group(2)}" if match else None
