"""Which decode format a CPU gets by default: the rule, applied to what was measured on a CPU of its kind.

A format's speed is the CPU's business. On one machine bfloat16 decoded at
0.81x float32's speed (AMX, whose bfloat16 is fast for a prompt and not for a
token), on another at 1.86x (AVX2 only); the int4 kernel even packs its
weights differently under AVX-512 and AVX2. So a default measured on one CPU
says nothing certain about another. The measurements are kept per *kind*: the
features that decide what the kernels do, from the widest down:

``amx``
    AMX tiles (``amx_bf16``): oneDNN's bfloat16 products run on them.
``avx512``
    AVX-512 (``avx512f``) kernels in PyTorch, no AMX.
``avx2``
    AVX2 kernels only.

The kind is the one the kernels *use*, not only the one the chip has:
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` makes an AVX-512 or AMX
machine run AVX2's kernels, and its kind is then ``avx2``.

``benchmarks/decode_formats.py --record`` writes its summary for the kind it
ran on into ``streamlab/data/decode_formats.json``; :func:`default_for` applies
:func:`pick` (the rule) to that kind's figures. A kind nobody measured gets the
format that the rule picks on *every* measured kind, the one whose worst
decode speed-up is best; where no format passes everywhere, float32.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

KINDS = ("amx", "avx512", "avx2")
MAX_FIRST_TOKEN_SLOWDOWN = 1.10  # the rule: first token at most 10% slower than float32's
MAX_PERPLEXITY_CHANGE = 2.0  # % from float32's, either way, at most
SAFE = "float32"  # where nothing measured says otherwise
MEASURED_FILE = "decode_formats.json"


def pick(rows: dict[str, dict[str, Any]]) -> str:
    """The rule: fastest decode among formats with first token ≤ 10% slower and perplexity within 2%.

    Within 2% either way: a format that scores much better than the weights
    it was made from is a different model, not a free gift. "Fastest" is what
    the rounds can tell apart: a format whose rounds reach into the fastest
    one's (its best round at least that one's worst) is as fast, and of those
    the one with the quicker first token wins (int4 and split-int4 decode with
    the same weights, and their medians swapped places between two runs on
    one machine). ``rows`` maps a format to its ``speedup`` (and its rounds'
    ``speedup_range``, where measured), ``first_slowdown`` and ``ppl_change``
    (%), all against float32 (which passes by definition).
    """
    fit = [name for name in rows if passes(rows[name])]
    if not fit:
        return SAFE
    best = max(fit, key=lambda name: rows[name]["speedup"])
    floor = _rounds(rows[best])[0]
    tied = [name for name in fit if _rounds(rows[name])[1] >= floor]
    return min(tied, key=lambda name: (rows[name]["first_slowdown"], -rows[name]["speedup"]))


def _rounds(row: dict[str, Any]) -> tuple[float, float]:
    low, high = row.get("speedup_range") or (row["speedup"], row["speedup"])
    return float(low), float(high)


def passes(row: dict[str, Any]) -> bool:
    return row["first_slowdown"] <= MAX_FIRST_TOKEN_SLOWDOWN and abs(row["ppl_change"]) <= MAX_PERPLEXITY_CHANGE


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's flags in ``/proc/cpuinfo`` (empty where there is none: not Linux, not x86)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            return set(line.split(":", 1)[1].split())
    return set()


def _onednn_cap() -> str:
    return os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).upper()


def cpu_kind(flags: set[str] | None = None, capability: str | None = None) -> str:
    """``amx``, ``avx512``, ``avx2``, or ``other``: what the kernels here use (see the module docstring)."""
    if flags is None:
        flags = cpu_flags()
    if capability is None:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    capability, cap = capability.upper(), _onednn_cap()
    capped = cap not in ("", "ALL", "DEFAULT")  # oneDNN's own cap: AVX2, AVX512_CORE_BF16, AVX10_1_512_AMX, ...
    if capability == "AVX512" and "amx_bf16" in flags and not (capped and "AMX" not in cap):
        return "amx"
    if capability == "AVX512" and not (capped and not cap.startswith(("AVX512", "AVX10"))):
        return "avx512"
    if capability in ("AVX2", "AVX512"):
        return "avx2"
    return "other"


def features_line(flags: set[str] | None = None) -> str:
    """What ``info`` says of the CPU: its kind, the features that decide it, and the kernels torch runs."""
    import torch

    flags = cpu_flags() if flags is None else flags
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    forced = [f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if os.environ.get(k)]
    return (f"{cpu_kind(flags)} ({' '.join(shown) or 'none of avx2, avx512f, amx_bf16'}; torch runs its "
            f"{torch.backends.cpu.get_cpu_capability()} kernels" + (f", {', '.join(forced)}" if forced else "") + ")")


def measured(path: Path | None = None) -> dict[str, Any]:
    """Every kind's recorded figures: ``{kind: {"measured": how, "formats": {name: row}}}``."""
    if path is not None:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    return json.loads(resources.files("streamlab").joinpath("data", MEASURED_FILE).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Choice:
    """The default format for a kind, and why: from that kind's measurement, or the safe choice for all."""

    format: str
    kind: str
    why: str
    row: dict[str, Any] | None  # the picked format's figures where this kind was measured


def default_for(kind: str, table: dict[str, Any] | None = None) -> Choice:
    table = measured() if table is None else table
    if kind in table:
        rows = table[kind]["formats"]
        name = pick(rows)
        row = rows.get(name)
        return Choice(name, kind, f"the rule's pick for {kind} CPUs ({table[kind]['measured']}): "
                      + describe(row), row)
    everywhere = [name for name in set.intersection(*(set(t["formats"]) for t in table.values()))
                  if all(passes(t["formats"][name]) for t in table.values())] if table else []
    if not everywhere:
        return Choice(SAFE, kind, f"no format passes the rule on every measured kind ({', '.join(table)})", None)
    worst = {name: min(t["formats"][name]["speedup"] for t in table.values()) for name in everywhere}
    name = max(everywhere, key=worst.get)
    return Choice(name, kind, f"{kind} CPUs were never measured; {name} passes the rule on every kind that was "
                  f"({', '.join(table)}), at {worst[name]:.2f}x float32's decode or more", None)


def describe(row: dict[str, Any] | None) -> str:
    if not row:
        return "float32 itself"
    low, high = row.get("speedup_range", (row["speedup"], row["speedup"]))
    return (f"decode {row['speedup']:.2f}x float32's (rounds {low:.2f}-{high:.2f}x), first token "
            f"{row['first_slowdown']:.2f}x, perplexity {row['ppl_change']:+.2f}%")


def record(kind: str, how: str, rows: dict[str, dict[str, Any]], path: Path) -> None:
    """Write (or replace) one kind's figures in the table at ``path``, leaving the other kinds as they are."""
    table = measured(path) if path.is_file() else {}
    table[kind] = {"measured": how, "formats": {
        name: {k: (round(v, 4) if isinstance(v, float) else [round(x, 4) for x in v] if isinstance(v, tuple) else v)
               for k, v in row.items()} for name, row in rows.items()}}
    path.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n", encoding="utf-8")
