"""A decode step written out for the Llama architecture: transformers' arithmetic with fewer calls.

At SmolLM2-135M's size a decode step is much the cost of calling things:
transformers' forward runs its norms with their casts, three projections
where one would do, ``rotate_half`` on the queries and on the keys, the
masks' and the cache's bookkeeping, thirty layers a token, and on this
course's CPU the int4 and int8 products are about half of a step's time
(``torch.profiler`` over a decode step: 3.8 of 7.1 ms, 6,500 aten calls).

:class:`FastDecode` makes the same step from the same weights with fewer
calls (4,500 aten calls a step, the products counted the same way): the
query, key and value projections as one int4 product, their packed weights
stacked where the kernel's blocks allow it (a probe at install says), the
gate and up projections as one, the rotation applied to the queries and
keys together, attention by ``scaled_dot_product_attention`` with grouped
heads, and each layer's new keys and values written into room kept behind
the cache's tensors, where ``DynamicCache.update`` copies the whole cache to
add one position (16 rows at 400 positions: a 67 ms step became 58 ms).
Each operation is the one transformers runs, in its order and its dtypes, so
the logits are the same to float32 rounding and the tokens the
same (``tests/test_fast_decode.py`` holds it for every format); a step takes
two thirds of transformers' time on the native kernels, three quarters on
AVX2's (``benchmarks/decode_formats.py`` measures it).

It takes only what it was written for: one new token per row, a cache that
already holds the prompt, an attention mask and positions as the batched
engine passes them. Anything else (a prompt, a model of another architecture
or with rope scaling, an argument it does not know) goes to transformers'
own forward: :func:`install` routes each call.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FastDecode", "install", "installed", "unsupported"]

KNOWN_ARGS = {"input_ids", "use_cache", "cache", "past_key_values", "attention_mask", "position_ids",
              "logits_to_keep"}


def unsupported(model: nn.Module) -> str | None:
    """Why :class:`FastDecode` cannot run ``model``'s decode steps, or None when it can."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) != "llama":
        return "not a Llama-architecture transformers model"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rope scaling {rope.get('rope_type', rope.get('type'))!r}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "biases in the attention or the MLP"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    heads = config.num_attention_heads
    if getattr(config, "head_dim", None) not in (None, config.hidden_size // heads):
        return "a head size other than hidden_size / heads"
    return None


class _Projection:
    """Several projections of the same input as one product where the layers allow it, else one after another."""

    def __init__(self, linears: list[nn.Module]) -> None:
        self.linears = linears
        self.fused = None
        if len(linears) > 1 and all(_int4_kernel(linear) for linear in linears):
            # The packed weights stacked as one, each layer's own buffer then a view of its rows: the weights
            # are held once (the scales and zeros, a thirty-second of it, are stacked as a copy). The kernel
            # packs output rows in blocks (64 on torch 2.13's CPU kernels, the last block short), so a stack
            # is one layer's product only where the blocks fall alike: a probe through both ways says.
            weight = torch.cat([linear.weight_int4 for linear in linears], dim=0).contiguous()
            scales = torch.cat([linear.scales_and_zeros for linear in linears], dim=1).contiguous()
            fused = (weight, scales, linears[0].GROUP)
            if _same_products(fused, linears):
                start = 0
                for linear in linears:
                    rows = linear.weight_int4.shape[0]
                    linear.weight_int4 = weight[start : start + rows]
                    start += rows
                self.fused = fused
        elif len(linears) == 1 and _int4_kernel(linears[0]):
            linear = linears[0]
            self.fused = (linear.weight_int4, linear.scales_and_zeros, linear.GROUP)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is None:
            outs = [linear(x) for linear in self.linears]
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        weight, scales, group = self.fused  # Int4Linear.forward's arithmetic, on a [rows, features] input
        return torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), weight, group, scales).to(x.dtype)


def _same_products(fused: tuple[torch.Tensor, torch.Tensor, int], linears: list[nn.Module]) -> bool:
    """True when the stacked weights multiply a probe as the layers one by one do (to bfloat16's rounding)."""
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(2, linears[0].in_features, generator=generator).to(linears[0].weight_int4.device)
    with torch.no_grad():
        apart = torch.cat([linear(probe) for linear in linears], dim=-1)
        weight, scales, group = fused
        together = torch._weight_int4pack_mm_for_cpu(probe.to(torch.bfloat16), weight, group, scales).to(probe.dtype)
    return float((together - apart).abs().max()) <= 2.0**-6 * float(apart.abs().max())


def _int4_kernel(linear: nn.Module) -> bool:
    return getattr(linear, "_kernel", False) and hasattr(linear, "weight_int4") and linear.bias is None


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic: in float32, back to the input's dtype, then the weight."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


@dataclasses.dataclass
class _Layer:
    attn_norm: torch.Tensor
    qkv: _Projection
    out: _Projection
    mlp_norm: torch.Tensor
    gate_up: _Projection
    down: _Projection


class FastDecode:
    """One decode step of a Llama-architecture model, from the model's own modules (see the module's text)."""

    def __init__(self, model: nn.Module) -> None:
        why = unsupported(model)
        if why is not None:
            raise ValueError(f"FastDecode cannot run this model: {why}")
        config, inner = model.config, model.model
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.embed, self.final_norm, self.head = inner.embed_tokens, inner.norm.weight, model.lm_head
        rotary = inner.rotary_emb
        self.inv_freq, self.scaling = rotary.inv_freq, float(getattr(rotary, "attention_scaling", 1.0))
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                layer.input_layernorm.weight, _Projection([attn.q_proj, attn.k_proj, attn.v_proj]),
                _Projection([attn.o_proj]), layer.post_attention_layernorm.weight,
                _Projection([mlp.gate_proj, mlp.up_proj]), _Projection([mlp.down_proj])))
        self.output = _output_class(model)

    def __deepcopy__(self, memo: dict) -> None:
        return None  # a copy of the model runs transformers' forward (see install)

    def takes(self, kwargs: dict[str, Any]) -> bool:
        """True for a call this step was written for: one token per row, onto a cache that holds the prompt."""
        ids, cache = kwargs.get("input_ids"), kwargs.get("cache", kwargs.get("past_key_values"))
        keep, mask, positions = kwargs.get("logits_to_keep", 1), kwargs.get("attention_mask"), kwargs.get("position_ids")
        if not set(kwargs) <= KNOWN_ARGS or kwargs.get("use_cache") is False or not isinstance(keep, int) or keep > 1:
            return False
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] != 1:
            return False
        if (mask is not None and mask.dim() != 2) or (positions is not None and positions.shape != ids.shape):
            return False  # a 4-D mask is the caller's own attention pattern; positions one per row, or none
        layers = getattr(cache, "layers", None)
        if not layers or len(layers) != len(self.layers) or getattr(cache, "offloading", False):
            return False
        from transformers.cache_utils import DynamicLayer

        first = layers[0]
        return (all(isinstance(layer, DynamicLayer) and not getattr(layer, "is_sliding", False) for layer in layers)
                and first.is_initialized and first.get_seq_length() > 0 and first.keys.shape[0] == ids.shape[0])

    def __call__(self, input_ids: torch.Tensor, cache: Any, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None) -> Any:
        rows, heads, kv, dim = input_ids.shape[0], self.heads, self.kv_heads, self.head_dim
        with torch.no_grad():
            x = self.embed(input_ids).view(rows, -1)
            dtype = x.dtype
            if position_ids is None:
                position_ids = torch.full((rows, 1), cache.get_seq_length(), dtype=torch.long, device=x.device)
            # The rotary embedding as LlamaRotaryEmbedding makes it: float32 angles, both halves, then the dtype.
            angles = position_ids.to(torch.float32).view(rows, 1, 1) * self.inv_freq.to(torch.float32).view(1, 1, -1)
            angles = torch.cat([angles, angles], dim=-1)
            cos, sin = (angles.cos() * self.scaling).to(dtype), (angles.sin() * self.scaling).to(dtype)
            mask = None if attention_mask is None else attention_mask.to(torch.bool)[:, None, None, :]
            half = dim // 2
            for index, layer in enumerate(self.layers):
                qkv = layer.qkv(_norm(x, layer.attn_norm, self.eps)).view(rows, heads + 2 * kv, dim)
                qk = qkv[:, : heads + kv]
                turned = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)  # rotate_half, queries and keys at once
                qk = qk * cos + turned * sin
                keys, values = _append(cache.layers[index], qk[:, heads:].unsqueeze(2), qkv[:, heads + kv :].unsqueeze(2))
                attended = F.scaled_dot_product_attention(qk[:, :heads].unsqueeze(2), keys, values, attn_mask=mask,
                                                          enable_gqa=kv != heads)
                x = x + layer.out(attended.view(rows, heads * dim))
                gate, up = layer.gate_up(_norm(x, layer.mlp_norm, self.eps)).chunk(2, dim=-1)
                x = x + layer.down(F.silu(gate) * up)
            logits = self.head(_norm(x, self.final_norm, self.eps)).unsqueeze(1)
        return self.output(logits, cache)


_ROOM = "_streamlab_room"  # on a cache layer: (keys buffer, values buffer, the keys and values views this step set)
ROOM_MIN = 64  # positions of room a buffer gets at least, when it is made (half the length already held, if more)


def _append(layer: Any, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's keys and values one position longer, as ``DynamicLayer.update`` makes them, without its copy.

    ``update`` concatenates: every step copies the whole cache of every layer, a cost that grows with the
    rows and the positions (16 rows at 400 positions: 67 ms a step with it, 58 without). Here the layer's
    tensors are views of buffers with room behind them, and a step writes its position into the room; the
    buffers are copied only when full, or when the layer's tensors are no longer the views this function set
    (whoever replaced them owns what they are now). A position once written is never written again, so a
    view taken of the cache earlier still reads what it read.
    """
    room = layer.__dict__.get(_ROOM)
    length = layer.keys.shape[-2]
    if room is None or room[2] is not layer.keys or room[3] is not layer.values or room[0].shape[-2] == length:
        grown = length + max(ROOM_MIN, length // 2)
        key_buffer, value_buffer = (old.new_empty(*old.shape[:-2], grown, old.shape[-1])
                                    for old in (layer.keys, layer.values))
        key_buffer[..., :length, :] = layer.keys
        value_buffer[..., :length, :] = layer.values
    else:
        key_buffer, value_buffer = room[0], room[1]
    key_buffer[..., length, :] = keys[..., 0, :]
    value_buffer[..., length, :] = values[..., 0, :]
    layer.keys, layer.values = key_buffer[..., : length + 1, :], value_buffer[..., : length + 1, :]
    layer.__dict__[_ROOM] = (key_buffer, value_buffer, layer.keys, layer.values)
    return layer.keys, layer.values


def _output_class(model: nn.Module) -> Any:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    names = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    field = "cache" if "cache" in names else "past_key_values"  # renamed in transformers 5
    return lambda logits, cache: CausalLMOutputWithPast(logits=logits, **{field: cache})


def install(model: nn.Module) -> FastDecode | None:
    """Route ``model``'s decode steps through a :class:`FastDecode`; None (and nothing changed) where it cannot.

    ``model.forward`` becomes a router: a call the fast step takes goes to it,
    any other to the forward of the model's class. Installing twice installs
    once. A deep copy of the model (``copy.deepcopy``, as the conversions to
    other formats make) has no fast step: it would run the original's weights.
    """
    if installed(model) is not None:
        return installed(model)
    own = model.__dict__.get("forward")
    if unsupported(model) is not None or (own is not None and getattr(own, "__func__", None) is not _router(type(model))):
        return None  # another architecture, or a forward of its own already: another router's
    model.__dict__[_ATTR] = FastDecode(model)
    model.forward = types.MethodType(_router(type(model)), model)
    return model.__dict__[_ATTR]


_ATTR = "_streamlab_fast_decode"


@functools.cache
def _router(cls: type) -> Any:
    """The installed forward of a model of class ``cls``, with the class forward's signature (callers read it)."""
    forward = cls.forward

    @functools.wraps(forward)
    def route(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        fast = self.__dict__.get(_ATTR)
        if fast is not None and not args and fast.takes(kwargs):
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            return fast(kwargs["input_ids"], cache, kwargs.get("attention_mask"), kwargs.get("position_ids"))
        return forward(self, *args, **kwargs)

    return route


def installed(model: nn.Module) -> FastDecode | None:
    """The :class:`FastDecode` :func:`install` put on ``model``, if any."""
    return model.__dict__.get(_ATTR)
