"""The written-out decode step (streamlab.model.fast_decode): transformers' arithmetic, fewer calls.

The fast step promises transformers' arithmetic: the same operations in the
same order and dtypes, fewer calls. So its logits are held to the float32
reordering bound of tests/test_precision.py (two runs of the same sums may add
their terms in another order), never to one machine's exact bits, and its
greedy tokens to transformers' own. A tiny random Llama checks the
arithmetic in milliseconds, padded batches and int4 included; the real model
checks every decode format once. Speed is benchmarks/decode_formats.py's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from streamlab.model import fast_decode
from streamlab.model.precision import FORMATS, convert_weights, greedy, make_runner
from test_precision import float32_order_bound


def tiny_llama(**overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    settings = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaForCausalLM(LlamaConfig(**{**settings, **overrides})).eval()


def through_transformers(model, **kwargs):
    """The class's own forward, past the installed router."""
    with torch.inference_mode():
        return type(model).forward(model, **kwargs)


def call(model, **kwargs):
    with torch.inference_mode():
        return model(**kwargs)


@pytest.mark.parametrize("weights", ["float32", "int4"])
def test_a_padded_batch_steps_as_transformers_steps_it(weights):
    model = convert_weights(tiny_llama(), weights)
    fast = fast_decode.install(model)
    assert fast is not None and fast_decode.installed(model) is fast
    if weights == "int4":
        # gate and up (128 rows each: whole blocks of the kernel's packing on every CPU) stack into one product.
        # q, k and v (64, 32, 32) stack on AVX2's kernels and not on AVX-512's, whose blocks are 64 rows: the
        # probe at install decides, and either way the step below must be transformers'.
        assert [layer.gate_up.fused is not None for layer in fast.layers] == [True, True]
    # Two prompts of 5 and 3 tokens, the shorter padded on the left, as the batched engine lays them out.
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 11, 12, 13]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    positions = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
    caches = [DynamicCache(config=model.config) for _ in range(2)]
    for cache in caches:
        through_transformers(model, input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                             use_cache=True)
    step = dict(input_ids=torch.tensor([[21], [22]]), attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1),
                position_ids=torch.tensor([[5], [3]]), use_cache=True, logits_to_keep=1)
    assert fast.takes({**step, "cache": caches[0]})
    ours = call(model, **step, cache=caches[0]).logits
    theirs = through_transformers(model, **step, cache=caches[1]).logits
    assert ours.shape == theirs.shape == (2, 1, 256)
    assert float((ours - theirs).abs().max()) <= float32_order_bound(model, theirs)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    # Both caches now hold the same keys, a position more each.
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert a.keys.shape == b.keys.shape == (2, 2, 6, 16)
        assert float((a.keys - b.keys).abs().max()) <= 1e-5 * float(b.keys.abs().max())


def test_the_cache_grows_in_room_behind_it_and_reads_as_transformers_concatenation():
    """The step writes each position into room behind the layer's tensors: copied when full, never overwritten."""
    model = tiny_llama()
    fast_decode.install(model)
    ours, theirs = DynamicCache(config=model.config), DynamicCache(config=model.config)
    prompt = dict(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    call(model, **prompt, cache=ours)
    through_transformers(model, **prompt, cache=theirs)
    first = ours.layers[0]
    early_view, early = first.keys, first.keys.clone()  # what a reader of the cache took after the prompt
    buffers, steps = set(), fast_decode.ROOM_MIN + 10  # past the first buffer's room: it is copied once
    for token in range(steps):
        step = dict(input_ids=torch.tensor([[4 + token % 200]]), use_cache=True)
        a, b = call(model, **step, cache=ours).logits, through_transformers(model, **step, cache=theirs).logits
        assert float((a - b).abs().max()) <= float32_order_bound(model, b)
        buffers.add(first.keys.untyped_storage().data_ptr())
    assert len(buffers) == 2  # one buffer for the first ROOM_MIN positions after the prompt, one more when it was full
    for a, b in zip(ours.layers, theirs.layers):
        assert a.keys.shape == b.keys.shape == (1, 2, 3 + steps, 16) and a.get_seq_length() == 3 + steps
        assert float((a.keys - b.keys).abs().max()) <= 1e-5 * float(b.keys.abs().max())
        assert float((a.values - b.values).abs().max()) <= 1e-5 * float(b.values.abs().max())
    assert torch.equal(early_view, early)  # an earlier view still reads what it read
    # Tensors put on the layer by someone else (the batched engine's rebuild) are theirs: the next step copies them.
    replaced = first.keys.clone()
    first.keys = replaced
    call(model, input_ids=torch.tensor([[9]]), use_cache=True, cache=ours)
    assert first.keys.untyped_storage().data_ptr() != replaced.untyped_storage().data_ptr()
    assert torch.equal(first.keys[:, :, :-1], replaced) and replaced.shape[-2] == 3 + steps


def test_what_the_step_was_not_written_for_goes_to_transformers():
    model = tiny_llama()
    fast = fast_decode.install(model)
    cache = DynamicCache(config=model.config)
    prompt = dict(input_ids=torch.tensor([[1, 2, 3]]), cache=cache, use_cache=True)
    assert not fast.takes(prompt)  # several tokens: a prompt
    assert not fast.takes(dict(input_ids=torch.tensor([[1]]), cache=cache, use_cache=True))  # nothing cached yet
    call(model, **prompt)
    one = dict(input_ids=torch.tensor([[4]]), cache=cache, use_cache=True)
    assert fast.takes(one)
    assert not fast.takes({**one, "output_hidden_states": True})  # an argument it does not know
    assert not fast.takes({**one, "use_cache": False})
    assert not fast.takes({**one, "cache": None})
    assert not fast.takes({**one, "attention_mask": torch.ones(1, 1, 1, 4)})  # the caller's own 4-D pattern
    assert not fast.takes({**one, "logits_to_keep": torch.tensor([0])})
    # greedy's prompt and its steps both pass the router: the tokens are transformers' own.
    runner_ids = [1, 2, 3, 4, 5]
    from streamlab.model.precision import DecodeRunner

    runner = DecodeRunner(FORMATS["float32"], model)
    routed = greedy(runner, runner_ids, 12)
    del model.__dict__[fast_decode._ATTR]  # the router, with no fast step: transformers' forward for everything
    assert greedy(runner, runner_ids, 12) == routed


def test_a_copy_of_the_model_runs_its_own_weights_not_the_original_fast_step():
    model = tiny_llama()
    fast_decode.install(model)
    twin = copy.deepcopy(model)
    assert fast_decode.installed(twin) is None  # the original's step would read the original's weights
    with torch.no_grad():
        twin.lm_head.weight.mul_(2)
    cache = DynamicCache(config=twin.config)
    call(twin, input_ids=torch.tensor([[1, 2]]), cache=cache, use_cache=True)
    step = dict(input_ids=torch.tensor([[3]]), use_cache=True)
    twin_cache = copy.deepcopy(cache)
    assert torch.equal(call(twin, **step, cache=cache).logits, through_transformers(twin, **step, cache=twin_cache).logits)
    assert fast_decode.install(twin) is not None  # and it can have its own


def test_a_model_it_was_not_written_for_is_left_as_it_was():
    assert "rope" in fast_decode.unsupported(tiny_llama(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                         "rope_theta": 10000.0}))
    assert fast_decode.unsupported(tiny_llama(attention_bias=True)) is not None
    model = tiny_llama(mlp_bias=True)
    assert fast_decode.install(model) is None and "forward" not in model.__dict__


@pytest.mark.model
def test_every_format_decodes_the_tokens_transformers_decodes():
    from streamlab.model.loading import load_model

    lm = load_model(precision="float32")
    ids = lm.tokenizer("The keeper of the lighthouse climbed the stairs at dusk, lit the lamp and")["input_ids"]
    for name in FORMATS:
        runner = make_runner(lm.model, name, cache=lm.narrow_cache)
        step = fast_decode.installed(runner.decode_model)
        assert step is not None, name
        if FORMATS[name].decode == "int4":  # every layer's q, k, v and its gate and up as one product each
            assert all(layer.qkv.fused and layer.gate_up.fused for layer in step.layers), name
        fast = greedy(runner, ids, 16)
        step = runner.decode_model.__dict__.pop(fast_decode._ATTR)
        try:
            assert greedy(runner, ids, 16) == fast, name
        finally:
            runner.decode_model.__dict__[fast_decode._ATTR] = step
