"""The decode formats (streamlab.model.precision): int8 that reproduces its weights, formats that agree, a KV handoff.

The arithmetic is checked on plain tensors first (no model): per-channel int8
reproduces each weight within half its row's step, and a converted layer
computes nearly what the float one does. Then, on the real model and a few
tokens each: every format writes text, the narrow formats pick the tokens
float32 picks, and handing the KV cache from a prefill copy to a decode copy
changes nothing when both are float32. Speed is the benchmark's business
(benchmarks/decode_formats.py), never asserted here.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from streamlab.model import precision
from streamlab.model.precision import (
    FORMATS, DecodeFormat, Int4Linear, Int8Linear, DecodeRunner, cast_cache, convert_weights, dequantize, dequantize_int4,
    get_format, greedy, make_runner, quantize_groups_int4, quantize_per_channel,
)

PROMPT = "The keeper of the lighthouse climbed the stairs at dusk, lit the lamp and wrote in his log:"


def test_per_channel_scales_reproduce_the_weights_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(64, 96) * torch.logspace(-3, 1, 64)[:, None]  # rows four decades apart
    w[5, 7] = 40.0  # an outlier spoils its own row's resolution only
    w[9] = 0.0  # an all-zero row still gets a usable scale
    q, scales = quantize_per_channel(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scales.shape == (64,)
    assert int(q.abs().max()) <= 127
    assert torch.equal(scales.bfloat16().float(), scales), "scales must be exact in the kernel's bfloat16"
    error = (dequantize(q, scales) - w).abs()
    assert bool((error <= scales[:, None] / 2 * (1 + 1e-6)).all())
    assert float(error[9].max()) == 0.0
    small_row = 0  # the smallest row is not flattened to zero by the large ones
    assert float((dequantize(q, scales)[small_row] - w[small_row]).abs().max()) < float(w[small_row].abs().max()) / 100


def test_int4_groups_reproduce_the_weights_within_half_a_step_and_a_4_bit_grid_exactly():
    torch.manual_seed(2)
    w = torch.randn(48, 96) * torch.logspace(-2, 0, 48)[:, None]
    q, scales, zeros = quantize_groups_int4(w, 32)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and scales.shape == zeros.shape == (48, 3)
    error = (dequantize_int4(q, scales, zeros) - w).abs().reshape(48, 3, 32)
    assert bool((error <= scales[..., None] / 2 * (1 + 1e-5) + 1e-7).all())
    # Weights already on sixteen levels per group (GGUF Q4_1, as the embedded model ships) come back exactly.
    low, step = torch.randn(48, 3, 1), torch.rand(48, 3, 1) + 0.1
    levels = torch.randint(0, 16, (48, 3, 32)).float()
    levels[..., 0], levels[..., 1] = 0, 15  # each group spans its whole grid, as a quantizer's output does
    grid = (low + step * levels).reshape(48, 96)
    torch.testing.assert_close(dequantize_int4(*quantize_groups_int4(grid, 32)), grid, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
def test_a_narrow_linear_computes_nearly_what_the_float_one_does(kind):
    torch.manual_seed(1)
    layer = nn.Linear(96, 48)
    x = torch.randn(3, 5, 96)
    with torch.inference_mode():
        exact = layer(x)
        approx = kind(layer)(x)
    assert approx.shape == exact.shape and approx.dtype == exact.dtype
    relative = float((approx - exact).norm() / exact.norm())
    assert relative < (0.01 if kind is Int8Linear else 0.1), relative  # 4 bits of a normal weight: ~7% off


def test_converting_shares_all_but_the_linear_weights():
    model = nn.Sequential(nn.Embedding(10, 8), nn.LayerNorm(8), nn.Linear(8, 10))
    int8 = convert_weights(model, "int8")
    assert isinstance(int8[2], Int8Linear) and isinstance(model[2], nn.Linear), "the original is left as it was"
    assert int8[0].weight is model[0].weight and int8[1].weight is model[1].weight
    assert convert_weights(model, "bfloat16")[2].weight.dtype == torch.bfloat16
    assert model[2].weight.dtype == torch.float32
    odd = nn.Sequential(nn.Linear(96, 48), nn.Linear(96, 40), nn.Embedding(4, 96))
    int4 = convert_weights(odd, "int4")  # 40 outputs do not pack in sixteens: that layer stays int8
    assert isinstance(int4[0], Int4Linear) and isinstance(int4[1], Int8Linear)



def _small_model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(64, 32), nn.Linear(64, 40), nn.Linear(32, 64))  # the middle one stays int8


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_narrow_weights_are_stored_once_per_kernel_kind_and_read_back_exactly(tmp_path, monkeypatch, weights):
    from streamlab.model import decode_cache

    model = _small_model()
    made = convert_weights(model, weights, cache=tmp_path)
    (stored,) = tmp_path.glob("decode-*.safetensors")
    assert stored == decode_cache.cache_path(tmp_path, weights)
    assert decode_cache.kernel_kind() in stored.name and torch.__version__.split("+")[0] in stored.name

    def no_quantizing(*args, **kwargs):
        raise AssertionError("a stored conversion must be read, not made again")

    monkeypatch.setattr(precision, "quantize_groups_int4", no_quantizing)
    monkeypatch.setattr(precision, "quantize_per_channel", no_quantizing)
    read = convert_weights(model, weights, cache=tmp_path)
    assert [type(m) for m in read] == [type(m) for m in made]
    # The CPU kernels load their operands aligned: a tensor left at its offset in the file crashed a server.
    assert all(b.data_ptr() % 64 == 0 for b in read.buffers()), "every stored buffer read into aligned memory"
    for a, b in zip(made.buffers(), read.buffers()):
        assert torch.equal(a, b)
    x = torch.randn(2, 64)
    with torch.inference_mode():
        assert torch.equal(read[0](x), made[0](x)) and torch.equal(read[1](x), made[1](x))
    # The int4 kernel packs differently under AVX-512 and AVX2: another kind's file is never read.
    monkeypatch.setattr(decode_cache, "kernel_kind", lambda: "another-kind")
    with pytest.raises(AssertionError, match="must be read"):
        convert_weights(model, weights, cache=tmp_path)


def test_a_stored_file_that_does_not_fit_is_made_again(tmp_path):
    from streamlab.model import decode_cache

    model = _small_model()
    path = decode_cache.cache_path(tmp_path, "int4")
    path.write_bytes(b"half a file")  # a write cut short (the real writes are atomic; a disk can still lie)
    first = convert_weights(model, "int4", cache=tmp_path)
    assert path.stat().st_size > 1000, "made and written again"
    other = nn.Sequential(nn.Linear(64, 48), nn.Linear(64, 40), nn.Linear(32, 64))  # same names, another shape
    assert isinstance(convert_weights(other, "int4", cache=tmp_path)[0], Int4Linear)
    decode_cache.write(tmp_path, "int4", {"elsewhere.weight_int4": torch.zeros(2, dtype=torch.uint8)})
    again = convert_weights(model, "int4", cache=tmp_path)  # another model's layers: converted afresh
    assert all(torch.equal(a, b) for a, b in zip(first.buffers(), again.buffers()))

def test_a_cache_is_cast_once_at_the_handoff():
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), 0)
    assert cast_cache(cache, torch.float32) is cache and cache.layers[0].keys.dtype == torch.float32
    cast_cache(cache, torch.bfloat16)
    assert cache.layers[0].keys.dtype == torch.bfloat16 and cache.layers[0].values.dtype == torch.bfloat16
    assert cast_cache(None, torch.bfloat16) is None


def test_a_typo_names_the_valid_formats(monkeypatch):
    from streamlab.model.loading import ModelError, pick_dtype, pick_precision

    with pytest.raises(ValueError, match="valid formats: float32, bfloat16, int8"):
        get_format("bfloat61")
    cpu = torch.device("cpu")
    monkeypatch.setenv("STREAMLAB_DTYPE", "int9")
    with pytest.raises(ModelError, match="'int9'.*valid: float32, bfloat16, int8, int4, .*split, float16"):
        pick_precision(cpu)
    monkeypatch.setenv("STREAMLAB_DTYPE", "split")
    assert pick_precision(cpu) == "split" and pick_dtype(cpu) == torch.float32  # made from float32 after loading
    monkeypatch.setenv("STREAMLAB_DTYPE", "bfloat16")
    assert pick_dtype(cpu) == torch.bfloat16
    monkeypatch.delenv("STREAMLAB_DTYPE")
    from streamlab.model.loading import cpu_default

    assert pick_precision(cpu) == cpu_default().format, "the measured default for this kind of CPU"
    assert pick_precision(cpu, measured=False) == "float32", "a model nobody measured keeps float32"
    assert pick_precision(torch.device("cuda")) == "float16"
    assert set(FORMATS) >= {"float32", "bfloat16", "int8", "split"} and FORMATS["split"].split


# -- the real model ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm():
    from streamlab.model.loading import load_model

    return load_model(precision="float32")


@pytest.fixture(scope="module")
def runners(lm):
    return {name: make_runner(lm.model, name, cache=lm.narrow_cache) for name in FORMATS}


@pytest.fixture(scope="module")
def prompt_ids(lm):
    return lm.tokenizer(PROMPT)["input_ids"]


def same_positions(a: list[int], b: list[int]) -> int:
    return sum(x == y for x, y in zip(a, b))


def picks(runner: DecodeRunner, prompt_ids: list[int], tokens: list[int]) -> list[int]:
    """The token ``runner`` picks at each position of ``tokens``, fed them teacher-forced (no cascade)."""
    cache = runner.new_cache()
    first = runner.prefill(prompt_ids, cache, logits_to_keep=1).logits[0, -1:]
    rest = runner.decode(tokens[:-1], cache).logits[0]
    return torch.cat([first, rest]).argmax(dim=-1).tolist()


@pytest.mark.model
def test_every_format_writes_text_and_picks_the_tokens_float32_picks(lm, runners):
    from streamlab.lab.results.records import load_prompts

    prompts = [lm.tokenizer(item["prompt"])["input_ids"] for item in load_prompts()[:3]]
    agree = {name: 0 for name in runners}
    for ids in prompts:
        reference = greedy(runners["float32"], ids, 8)
        for name, runner in runners.items():
            made = greedy(runner, ids, 8)
            assert len(made) == 8 and lm.tokenizer.decode(made).strip(), name
            # Greedy text that differs once differs from there on; the same text so far is the fair question.
            agree[name] += sum(a == b for a, b in zip(picks(runner, ids, reference), reference))
    assert agree["float32"] == 24
    for name, count in agree.items():
        assert count >= 20, (name, agree)


def float32_order_bound(model: nn.Module, logits: torch.Tensor) -> float:
    """How far two float32 runs of the same weights may drift apart from summation order alone.

    Two copies of one model compute the same sums, but their tensors sit at
    other addresses, and the CPU kernels block a product by alignment and by
    instruction set (AVX2 against AVX-512): the terms of each dot product are
    added in another order. One reordered sum of ``K`` terms moves by about
    ``sqrt(K)`` roundings (``u = 2**-24``) of its size when the roundings are
    independent; the ``M`` matrix products a token goes through (seven a layer,
    then the head) add theirs the same way, in quadrature. The widest product
    (the MLP's ``intermediate_size``) bounds ``K``; the largest logit sets the
    scale; a factor of 8 covers the tail of the sum of independent roundings.
    For SmolLM2-135M: 211 products, K = 1536, u = 6e-8: 2.7e-4 of the largest
    logit, 7.8e-3 here. Measured: 1.4e-5 on an AVX2-only EPYC (one logit in
    49,152 past a flat 1e-5, which failed), 1.9e-5 on an AVX-512 one with
    its own kernels and with AVX2's. A handoff that did change something is
    past it: the test checks that a cache rounded through bfloat16 and back
    is caught (2.4e-2 there); a lost or doubled position changes the next token.
    """
    config = model.config
    products = 7 * config.num_hidden_layers + 1
    widest = max(config.hidden_size, config.intermediate_size)
    return 8 * (products * widest) ** 0.5 * 2.0**-24 * float(logits.abs().max())


def assert_same_up_to_float32_order(actual: torch.Tensor, expected: torch.Tensor, model: nn.Module) -> None:
    bound = float32_order_bound(model, expected)
    worst = float((actual - expected).abs().max())
    assert worst <= bound, f"{worst:.3g} apart, past float32's reordering bound {bound:.3g}"
    assert int(actual.argmax()) == int(expected.argmax())


@pytest.mark.model
def test_the_kv_handoff_between_two_float32_copies_changes_nothing(lm, prompt_ids):
    both = DecodeFormat("split-float32", "float32", "float32", "two copies, one format: the handoff alone")
    split = DecodeRunner(both, lm.model, convert_weights(lm.model, "float32"))
    assert split.decode_model is not split.prefill_model
    one = DecodeRunner(FORMATS["float32"], lm.model)
    cache_one, cache_split = one.new_cache(), split.new_cache()
    first = one.prefill(prompt_ids, cache_one, logits_to_keep=1).logits[0, -1]
    assert torch.equal(first, split.prefill(prompt_ids, cache_split, logits_to_keep=1).logits[0, -1])
    token = int(first.argmax())
    after_one = one.decode([token], cache_one).logits[0, -1]
    after_split = split.decode([token], cache_split).logits[0, -1]
    assert cache_split.layers[0].keys.dtype == torch.float32  # handed over as it was: nothing converted
    assert_same_up_to_float32_order(after_split, after_one, lm.model)
    # The bound catches a handoff that rounds: the same step after the cache went through bfloat16 and back.
    rounded = one.new_cache()
    one.prefill(prompt_ids, rounded, logits_to_keep=1)
    cast_cache(cast_cache(rounded, torch.bfloat16), torch.float32)
    after_rounding = one.decode([token], rounded).logits[0, -1]
    assert float((after_rounding - after_one).abs().max()) > float32_order_bound(lm.model, after_one)
    assert greedy(split, prompt_ids, 5) == greedy(one, prompt_ids, 5)


@pytest.mark.model
def test_a_bfloat16_decode_copy_gets_the_cache_in_its_dtype(runners, prompt_ids):
    runner = runners["split-bfloat16"]
    cache = runner.new_cache()
    token = int(runner.prefill(prompt_ids, cache, logits_to_keep=1).logits[0, -1].argmax())
    assert cache.layers[0].keys.dtype == torch.float32  # the prompt was read in float32
    runner.decode([token], cache)
    assert cache.layers[0].keys.dtype == torch.bfloat16
    assert cache.get_seq_length() == len(prompt_ids) + 1


@pytest.mark.model
def test_a_loaded_split_model_routes_one_token_passes_to_its_decode_copy(lm, runners, prompt_ids):
    model, runner = precision.prepare_model(copy.deepcopy(lm.model), "split")
    assert runner.decode_model is not model and isinstance(model, type(lm.model))
    arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = runner.new_cache()
    with torch.inference_mode():
        first = model(input_ids=torch.tensor([prompt_ids]), use_cache=True, logits_to_keep=1, **{arg: cache})
        token = int(first.logits[0, -1].argmax())
        step = model(input_ids=torch.tensor([[token]]), use_cache=True, **{arg: cache}).logits[0, -1]
    reference = runners["split"]
    ref_cache = reference.new_cache()
    reference.prefill(prompt_ids, ref_cache, logits_to_keep=1)
    assert_same_up_to_float32_order(step, reference.decode([token], ref_cache).logits[0, -1], lm.model)


@pytest.mark.model
def test_the_benchmark_prints_lines_that_parse(tmp_path):
    from streamlab.book import bench
    from streamlab.lab.results import measures

    script = bench.SCRIPTS / "decode_formats.py"
    done = subprocess.run([sys.executable, str(script), "--tiny"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "STREAMLAB_BENCH_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [measures.parse_line(line) for line in done.stdout.splitlines() if line.startswith("decode_formats: ")]
    figures = [p for p in printed if p]
    saved = json.loads((tmp_path / "decode_formats.json").read_text())
    assert figures and len(figures) == len(saved["measures"])
    goal = next(f for f in figures if f["key"] == "default_decode_speedup")
    assert goal["op"] == "≥" and goal["verdict"].startswith(("met", "missed", "within noise", "too few"))
    assert saved["data"]["default"] in FORMATS
    assert "decode_formats" in bench.BENCHMARKS
    from streamlab.lab.outside.llamacpp import native_unavailable_reason, unavailable_reason

    if native_unavailable_reason() is None or unavailable_reason() is None:  # make engine built llama.cpp
        keys = {f["key"] for f in figures}  # its row beside the formats, and our default against it
        assert "llama_cpp_vs_float32_decode" in keys and "default_vs_llama_cpp_decode" in keys
    else:
        assert "decode_formats: llama.cpp not measured: " in done.stdout
