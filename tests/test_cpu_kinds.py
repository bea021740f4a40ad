"""The default decode format follows the CPU it runs on (streamlab.model.cpu_kinds).

The kind is what the kernels use, so forcing AVX2's kernels on a wider CPU
makes it ``avx2``; a measured kind gets the rule's pick from its own figures;
a kind nobody measured gets what passes the rule on every kind that was, or
float32. The figures themselves come from ``benchmarks/decode_formats.py
--record`` and are checked here for what the rule needs, not for their values.
"""

from __future__ import annotations

import pytest

from streamlab.model import cpu_kinds
from streamlab.model.cpu_kinds import cpu_kind, default_for, pick
from streamlab.model.precision import FORMATS

AMX = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
AVX512 = {"avx2", "avx512f", "avx512_bf16"}


def row(speedup, first=1.0, ppl=0.0):
    return {"speedup": speedup, "speedup_range": [speedup, speedup], "first_slowdown": first, "ppl_change": ppl}


@pytest.fixture(autouse=True)
def no_isa_caps(monkeypatch):
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)


def test_the_kind_is_what_the_kernels_use(monkeypatch):
    assert cpu_kind(AMX, "AVX512") == "amx"
    assert cpu_kind(AVX512, "AVX512") == "avx512"
    assert cpu_kind({"avx2"}, "AVX2") == "avx2"
    assert cpu_kind(set(), "DEFAULT") == "other"
    assert cpu_kind(AMX, "AVX2") == "avx2", "ATEN_CPU_CAPABILITY=avx2 on an AMX machine"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu_kind(AMX, "AVX512") == "avx2" and cpu_kind(AVX512, "AVX512") == "avx2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert cpu_kind(AMX, "AVX512") == "avx512", "oneDNN kept off the tiles"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX10_1_512_AMX")
    assert cpu_kind(AMX, "AVX512") == "amx"


def test_flags_are_read_from_cpuinfo():
    text = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse avx2 avx512f\n\nprocessor\t: 1\nflags\t: fpu\n"
    assert cpu_kinds.cpu_flags(text) == {"fpu", "sse", "avx2", "avx512f"}
    assert cpu_kinds.cpu_flags("no flags here") == set()


def test_the_rule_takes_the_fastest_that_keeps_the_first_token_and_the_model():
    rows = {"float32": row(1.0), "a": row(2.0, first=1.2), "b": row(1.9, ppl=-2.5), "c": row(1.5), "d": row(1.4)}
    assert pick(rows) == "c"  # a reads the prompt 20% slower, b is another model
    assert pick({"a": row(2.0, first=1.2)}) == "float32"


def test_formats_the_rounds_cannot_tell_apart_go_to_the_quicker_first_token():
    def rounds(median, low, high, first):
        return {**row(median, first=first), "speedup_range": [low, high]}

    # int4 and split-int4 as one EPYC measured them: medians 4.90 and 4.97, rounds overlapping.
    rows = {"float32": row(1.0), "int4": rounds(4.90, 4.68, 4.93, 0.53), "split-int4": rounds(4.97, 4.68, 5.00, 1.01)}
    assert pick(rows) == "int4"
    # Rounds apart: the faster one, whatever its first token (within the 10%).
    rows["split-int4"] = rounds(5.6, 5.2, 5.9, 1.01)
    assert pick(rows) == "split-int4"


def test_each_kind_gets_its_own_measurement_and_an_unmeasured_one_what_is_safe_everywhere():
    table = {
        "amx": {"measured": "then", "formats": {"float32": row(1.0), "x": row(1.6), "y": row(0.8)}},
        "avx2": {"measured": "now", "formats": {"float32": row(1.0), "x": row(2.2), "y": row(2.4)}},
    }
    assert default_for("amx", table).format == "x" and default_for("avx2", table).format == "y"
    assert "avx2 CPUs (now)" in default_for("avx2", table).why and "2.40x" in default_for("avx2", table).why
    unmeasured = default_for("avx512", table)
    # y is fastest on AVX2 but loses on AMX; x passes on both, at 1.6x at worst.
    assert unmeasured.format == "x" and unmeasured.row is None and "1.60x" in unmeasured.why
    table["amx"]["formats"]["x"] = row(1.6, first=1.5)
    assert default_for("avx512", table).format == "float32", "nothing passes the rule everywhere: float32"


def test_the_shipped_figures_cover_every_format_on_every_kind_they_name():
    table = cpu_kinds.measured()
    assert table and set(table) <= set(cpu_kinds.KINDS)
    formats = {name for name in FORMATS if name != "split"}
    for kind, figures in table.items():
        assert set(figures["formats"]) == formats, kind
        assert figures["formats"]["float32"]["speedup"] == 1.0
        assert figures["measured"], kind
    for kind in (*cpu_kinds.KINDS, "other"):
        assert default_for(kind, table).format in formats
