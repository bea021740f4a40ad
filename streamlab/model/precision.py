"""The formats a model can decode in on a CPU, as named choices: what each trades, and how a loop uses it.

Decoding one token reads every weight once and does little arithmetic with
each, so its speed is set by how many bytes the weights take; reading a prompt
multiplies each weight by many tokens at once, so its speed is set by how fast
the CPU does arithmetic in that format. The two phases want different formats:

``float32``
    The weights as loaded: the reference every other format is measured against.
``bfloat16``
    Every weight and activation in bfloat16: half the bytes per token. Its
    prompt reading depends on the CPU: with AMX or AVX-512 BF16 (this course's
    Xeons report both) oneDNN reads it faster than float32; with AVX2 alone
    every product is converted and it reads ~3x slower.
``int8``
    Weight-only int8 with one scale per output channel (per row of each
    ``Linear``): a quarter of float32's bytes. Activations, norms, attention and
    the KV cache stay float32; each matrix product casts its input to bfloat16
    for torch's ``_weight_int8pack_mm`` kernel (the same kernel gpt-fast uses;
    with float32 inputs it is ten times slower) and its output back.
``int4``
    Weight-only int4 in groups of 32 along each row, a scale and a zero per
    group, through torch's ``_weight_int4pack_mm_for_cpu``; float32 activations
    as for int8. The embedded SmolLM2 was shipped as GGUF Q4_1, which is this
    very layout: its layers come back exact but for the bfloat16 rounding of
    the scales. A model that was never 4-bit loses more: the benchmark's
    perplexity says how much.
``split-int8``, ``split-int4``, ``split-bfloat16`` (``split``: the one that measured best)
    The prompt read in float32 and the tokens decoded in the narrow format:
    the first token as soon as float32's, the tokens after it as fast as the
    narrow format's. Two copies of the weights, one per phase; an int8 or int4
    copy shares everything but its ``Linear`` weights with the float32 model.
    The KV cache the prompt leaves is handed to the decoding copy in its
    dtype: no conversion for int8 and int4 (both keep float32 activations), a
    cast to bfloat16 for ``split-bfloat16``.

In int8 and int4 the token embedding stays float32 and shared (a lookup reads
one row per token: quantizing it would save memory, not time); the output
projection, tied to the embedding in SmolLM2, gets its own int8 copy with a
scale per vocabulary row (it is a fifth of the weights and read in full for
every token; int4 would lose what the GGUF's 8-bit embedding kept).

:class:`DecodeRunner` is how a generation loop uses a format: ``prefill`` for prompt
chunks and ``decode`` for decode steps, each routed to its phase's copy. A
loop that does not know about phases yet can use :func:`prepare_model`, which
routes by the shape of the input instead (more than one new token per row: a
prompt). ``benchmarks/decode_formats.py`` measures every format side by side.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from streamlab.model import decode_cache, fast_decode

WEIGHTS = ("float32", "bfloat16", "int8", "int4")  # what one copy of the weights can be
INT8_MAX = 127
# The smallest scale a channel gets: an all-zero row still divides by something.
_MIN_SCALE = 2.0**-60


@dataclass(frozen=True)
class DecodeFormat:
    """A decode format: the weights the prompt is read with, and the weights the tokens are made with."""

    name: str
    prefill: str
    decode: str
    summary: str

    @property
    def split(self) -> bool:
        return self.prefill != self.decode


FORMATS: dict[str, DecodeFormat] = {
    f.name: f
    for f in (
        DecodeFormat("float32", "float32", "float32", "the weights as loaded; the reference"),
        DecodeFormat("bfloat16", "bfloat16", "bfloat16", "half the bytes per token, bfloat16 arithmetic throughout"),
        DecodeFormat("int8", "int8", "int8", "weight-only int8, a scale per output channel; float32 activations"),
        DecodeFormat("int4", "int4", "int4", "weight-only int4 in groups of 32 (an int8 head); float32 activations"),
        DecodeFormat("split-int8", "float32", "int8", "prompt in float32, tokens in int8 (shares all but the Linear weights)"),
        DecodeFormat("split-int4", "float32", "int4", "prompt in float32, tokens in int4 (shares all but the Linear weights)"),
        DecodeFormat("split-bfloat16", "float32", "bfloat16", "prompt in float32, tokens in bfloat16 (KV cache cast at the handoff)"),
    )
}
# ``split`` names the split that measured best (benchmarks/decode_formats.py, see SPLIT_MEASURED).
SPLIT = "split-int4"
SPLIT_MEASURED = "int4 decodes fastest of the three and keeps perplexity within 0.2%; no KV conversion at the handoff"
FORMATS["split"] = DecodeFormat("split", FORMATS[SPLIT].prefill, FORMATS[SPLIT].decode, FORMATS[SPLIT].summary)


def format_names() -> list[str]:
    return list(FORMATS)


def get_format(name: str | DecodeFormat) -> DecodeFormat:
    """The named format; a typo gets an error that lists every valid name."""
    if isinstance(name, DecodeFormat):
        return name
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown decode format {name!r}; valid formats: {', '.join(FORMATS)}") from None


# -- int8 weights ---------------------------------------------------------------------------------


def _round_up_to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    """The smallest bfloat16 value at least ``x`` (positive float32 input).

    The int8 kernel multiplies by scales in the activations' dtype, bfloat16.
    A scale rounded to nearest would be up to 0.4% off the one the weights were
    rounded against; rounded up once, before quantizing, the scale the kernel
    uses is exactly the one the int8 values were made with, and no weight
    overflows 127 (the scale only grew).
    """
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0xFFFF) & ~0xFFFF).view(torch.float32)


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: ``weight ≈ q * scales[:, None]``; returns ``(q, scales)``.

    One scale per row (output channel) rather than one per tensor: a row with
    small weights keeps its resolution even when another row of the same
    matrix has an outlier. (torch's ``quantize_dynamic``, one scale per tensor
    and int8 activations as well, took perplexity on the human texts from 33
    to 113 here.) Each weight is off by at most half its row's step.
    """
    w = weight.detach().float()
    scales = _round_up_to_bfloat16(w.abs().amax(dim=1).clamp(min=_MIN_SCALE) / INT8_MAX)
    q = torch.round(w / scales[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scales


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return q.float() * scales.float()[:, None]


class StoredMismatch(ValueError):
    """Stored narrow weights that do not fit the layer they are for: convert afresh instead."""


def _check_stored(stored: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype],
                  shapes: dict[str, tuple[int, ...]]) -> None:
    for name, dtype in dtypes.items():
        tensor = stored.get(name)
        if tensor is None or tensor.dtype != dtype or tuple(tensor.shape) != shapes[name]:
            got = "nothing" if tensor is None else f"{tensor.dtype} {tuple(tensor.shape)}"
            raise StoredMismatch(f"{name}: stored {got}, the layer needs {dtype} {shapes[name]}")


class Int8Linear(nn.Module):
    """A bias-free or biased ``Linear`` whose weight is int8 with a float scale per output channel.

    On a CPU the product goes through ``torch._weight_int8pack_mm``, which
    reads the int8 weight directly (never a float copy of it); it is fast with
    bfloat16 inputs and about ten times slower with float32 ones, so the input
    is cast to bfloat16 for it and the output cast back to the caller's dtype.
    Elsewhere (or without the kernel) the weight is de-quantized per call.
    """

    BUFFERS = {"weight_int8": torch.int8, "scales": torch.bfloat16}

    def __init__(self, linear: nn.Linear, stored: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        device = linear.weight.device
        if stored is None:
            q, scales = quantize_per_channel(linear.weight)
            stored = {"weight_int8": q, "scales": scales.to(torch.bfloat16)}
        _check_stored(stored, self.BUFFERS, {"weight_int8": (linear.out_features, linear.in_features),
                                             "scales": (linear.out_features,)})
        self.register_buffer("weight_int8", stored["weight_int8"].to(device))
        self.register_buffer("scales", stored["scales"].to(device))
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self._kernel = device.type == "cpu" and hasattr(torch, "_weight_int8pack_mm")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if self._kernel:
            y = torch._weight_int8pack_mm(flat.to(torch.bfloat16).contiguous(), self.weight_int8, self.scales)
        else:
            y = nn.functional.linear(flat.to(torch.bfloat16), self.weight_int8.to(torch.bfloat16)) * self.scales
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def quantize_groups_int4(weight: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 in groups of ``group`` along each row: ``weight ≈ (q - 8) * scale + zero``.

    Returns ``(q, scales, zeros)``: ``q`` in 0..15 as uint8 ``[out, in]``, the
    other two ``[out, in // group]``, the layout torch's int4 kernel takes.
    Sixteen levels between each group's minimum and maximum: a group that was
    already on such a grid (every ``Linear`` of the embedded SmolLM2, stored as
    GGUF Q4_1, blocks of 32) comes back exactly.
    """
    out_features, in_features = weight.shape
    if in_features % group:
        raise ValueError(f"{in_features} input features do not split into groups of {group}")
    w = weight.detach().float().reshape(out_features, in_features // group, group)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((high - low) / 15).clamp(min=_MIN_SCALE)
    q = torch.round((w - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.uint8)
    return q.reshape(out_features, in_features), scales, low + 8 * scales


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    group = q.shape[1] // scales.shape[1]
    w = (q.float().reshape(*scales.shape, group) - 8) * scales.float()[..., None] + zeros.float()[..., None]
    return w.reshape(q.shape)


class Int4Linear(nn.Module):
    """A ``Linear`` held as int4 in groups of 32 with a scale and a zero each (:func:`quantize_groups_int4`).

    On a CPU the product goes through ``torch._weight_int4pack_mm_for_cpu``
    (the kernel torchao's and gpt-fast's int4 use), fast with bfloat16 inputs
    only, as the int8 one is, so the input is cast to bfloat16 and back. The
    scales and zeros it takes are bfloat16: that rounding, not the 4 bits, is
    what separates this layer from the Q4_1 weights it was made from.
    """

    GROUP = 32
    ROWS = 16  # the CPU kernel packs output channels sixteen at a time
    BUFFERS = {"weight_int4": torch.uint8, "scales_and_zeros": torch.bfloat16}

    @classmethod
    def fits(cls, linear: nn.Linear) -> bool:
        return linear.in_features % cls.GROUP == 0 and linear.out_features % cls.ROWS == 0

    def __init__(self, linear: nn.Linear, stored: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        device = linear.weight.device
        self._kernel = device.type == "cpu" and hasattr(torch, "_weight_int4pack_mm_for_cpu")
        if stored is None:
            q, scales, zeros = quantize_groups_int4(linear.weight, self.GROUP)
            # The kernel's packing depends on the CPU kernels torch runs (see streamlab.model.decode_cache).
            # Off the CPU: one value a byte, kept simple.
            weight = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1) if self._kernel else q
            # [in // group, out, 2]: each group's scale and zero side by side, as the kernel reads them.
            packed = torch.stack([scales.t(), zeros.t()], dim=-1).contiguous().to(torch.bfloat16)
            stored = {"weight_int4": weight, "scales_and_zeros": packed}
        _check_stored(stored, self.BUFFERS, {
            "weight_int4": (linear.out_features, linear.in_features // (2 if self._kernel else 1)),
            "scales_and_zeros": (linear.in_features // self.GROUP, linear.out_features, 2)})
        self.register_buffer("weight_int4", stored["weight_int4"].to(device))
        self.register_buffer("scales_and_zeros", stored["scales_and_zeros"].to(device))
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).to(torch.bfloat16).contiguous()
        if self._kernel:
            y = torch._weight_int4pack_mm_for_cpu(flat, self.weight_int4, self.GROUP, self.scales_and_zeros)
        else:
            sz = self.scales_and_zeros
            weight = dequantize_int4(self.weight_int4, sz[..., 0].t(), sz[..., 1].t()).to(torch.bfloat16)
            y = nn.functional.linear(flat, weight)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {self.GROUP}"


def _shared_copy(model: nn.Module) -> nn.Module:
    """A copy of the module tree whose parameters and buffers are the original's own tensors.

    Replacing a copy's ``Linear`` layers then costs only the new weights: the
    embedding, the norms and the rotary tables stay one set in memory, shared
    by the float32 model and its int8 twin.
    """
    memo: dict[int, Any] = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def _narrow_linear(child: nn.Linear, weights: str, head: bool, stored: dict[str, torch.Tensor] | None) -> nn.Module:
    """The int8 or int4 twin of one layer; the output projection is int8 in both (see the module docstring).

    A layer whose shape the int4 kernel cannot take stays int8 rather than float32.
    ``stored``: its buffers as a previous conversion made them (streamlab.model.decode_cache).
    """
    if weights == "int4" and not head and Int4Linear.fits(child):
        return Int4Linear(child, stored)
    return Int8Linear(child, stored)


def _narrow_layers(linears: list[tuple[str, nn.Linear]], weights: str, output: nn.Module | None,
                   stored: dict[str, torch.Tensor] | None) -> list[nn.Module]:
    """Every layer's twin, made before any is put in place (a stored file that does not fit changes nothing)."""
    by_layer: dict[str, dict[str, torch.Tensor]] | None = None
    if stored is not None:
        by_layer = {}
        for key, tensor in stored.items():
            layer, _, buffer = key.rpartition(".")
            by_layer.setdefault(layer, {})[buffer] = tensor
        if set(by_layer) != {name for name, _ in linears}:
            raise StoredMismatch("the stored layers are not this model's")
    return [_narrow_linear(child, weights, child is output, None if by_layer is None else by_layer[name])
            for name, child in linears]


def convert_weights(model: nn.Module, weights: str, *, copy_model: bool = True, cache: Path | None = None) -> nn.Module:
    """``model`` (loaded in float32) made ready to run with ``weights``: float32, bfloat16, int8 or int4.

    float32 returns the model itself (unless ``copy_model`` and a copy is
    asked for, as the tests do to hand a cache between two float32 copies).
    bfloat16 is a full copy cast to bfloat16. int8 and int4 are copies sharing
    every tensor with ``model`` except their ``Linear`` weights, each replaced
    by an :class:`Int8Linear` or :class:`Int4Linear` (the output projection is
    int8 in both; see the module's docstring for why the embedding is not).

    ``cache``, a folder that belongs to these very weights (the converted
    model's own): int8 and int4 layers are read from the file a previous
    conversion left there for this CPU's kernels, or made and stored there.
    """
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; valid: {', '.join(WEIGHTS)}")
    if weights == "float32":
        return copy.deepcopy(model) if copy_model else model.float()
    if weights == "bfloat16":
        return (copy.deepcopy(model) if copy_model else model).to(torch.bfloat16)
    target = _shared_copy(model) if copy_model else model
    output = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
    places = [(module, child_name, f"{path}.{child_name}" if path else child_name)
              for path, module in target.named_modules()
              for child_name, child in module.named_children() if isinstance(child, nn.Linear)]
    linears = [(name, getattr(module, child_name)) for module, child_name, name in places]
    stored = decode_cache.read(cache, weights) if cache is not None else None
    try:
        narrow = _narrow_layers(linears, weights, output, stored)
    except StoredMismatch:
        stored = None
        narrow = _narrow_layers(linears, weights, output, None)
    for (module, child_name, _), layer in zip(places, narrow):
        setattr(module, child_name, layer)
    if cache is not None and stored is None:
        decode_cache.write(cache, weights, {f"{name}.{buffer}": tensor for (_, _, name), layer in zip(places, narrow)
                                            for buffer, tensor in layer.named_buffers() if buffer != "bias"})
    if getattr(target, "config", None) is not None and hasattr(target.config, "tie_word_embeddings"):
        target.config.tie_word_embeddings = False  # the head is its own int8 tensor now: never re-tie it
    return target


def activation_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the hidden states (and so of the KV cache): the embedding's."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and getattr(embeddings, "weight", None) is not None:
        return embeddings.weight.dtype
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def cast_cache(cache: Any, dtype: torch.dtype) -> Any:
    """Convert a KV cache's keys and values to ``dtype`` in place (nothing to do when they already are).

    Called at every step, so the check is one look at the first layer; the
    conversion itself happens once, at the handoff from prompt to tokens.
    """
    if cache is None:
        return cache
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers 5: a DynamicLayer per layer
        filled = [layer for layer in layers if getattr(layer, "keys", None) is not None and layer.keys.numel()]
        if not filled or filled[0].keys.dtype == dtype:
            return cache
        for layer in filled:
            layer.keys, layer.values = layer.keys.to(dtype), layer.values.to(dtype)
        return cache
    keys, values = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if keys is not None and values is not None:  # transformers 4: two lists
        if keys and keys[0].dtype != dtype:
            keys[:] = [k.to(dtype) for k in keys]
            values[:] = [v.to(dtype) for v in values]
        return cache
    raise TypeError(f"cannot cast a KV cache of type {type(cache).__name__}")


def _cache_arg(model: nn.Module) -> str:
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5


class DecodeRunner:
    """A model made ready for a format, as a generation loop calls it: ``prefill`` then ``decode``.

    ``prefill`` reads prompt tokens into the cache with the prefill weights;
    ``decode`` feeds tokens (one per row when decoding; several when scoring a
    text teacher-forced) with the decode weights, converting the cache to the
    decode copy's dtype first when the two copies differ. Both return the
    model's output (``.logits``), and take the same keyword arguments as the
    model (``attention_mask``, ``position_ids``, ``logits_to_keep``) so a
    batched loop can pass its masks through.
    """

    def __init__(self, fmt: DecodeFormat, prefill_model: nn.Module, decode_model: nn.Module | None = None) -> None:
        self.format = fmt
        self.prefill_model = prefill_model
        self.decode_model = decode_model if decode_model is not None else prefill_model
        self.prefill_dtype = activation_dtype(self.prefill_model)
        self.decode_dtype = activation_dtype(self.decode_model)
        self._arg = _cache_arg(self.prefill_model)
        self._decode_arg = _cache_arg(self.decode_model)

    @property
    def config(self) -> Any:
        return self.prefill_model.config

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.prefill_model.config)

    def _run(self, model: nn.Module, arg: str, dtype: torch.dtype, ids: Any, cache: Any, kwargs: dict) -> Any:
        if not isinstance(ids, torch.Tensor):
            ids = torch.tensor([list(ids)], dtype=torch.long)
        ids = ids.to(model.device)
        cast_cache(cache, dtype)
        with torch.inference_mode():
            return model(input_ids=ids, use_cache=True, **{arg: cache}, **kwargs)

    def prefill(self, ids: Any, cache: Any, **kwargs: Any) -> Any:
        """Prompt tokens (a list, or a ``[batch, tokens]`` tensor) through the prefill weights."""
        return self._run(self.prefill_model, self._arg, self.prefill_dtype, ids, cache, kwargs)

    def decode(self, ids: Any, cache: Any, **kwargs: Any) -> Any:
        """Tokens fed back (``[batch, 1]`` a step) through the decode weights, after the KV handoff."""
        return self._run(self.decode_model, self._decode_arg, self.decode_dtype, ids, cache, kwargs)

    def __repr__(self) -> str:
        return f"<DecodeRunner {self.format.name}: prefill {self.format.prefill}, decode {self.format.decode}>"


def make_runner(model: nn.Module, name: str | DecodeFormat, *, cache: Path | None = None) -> DecodeRunner:
    """A :class:`DecodeRunner` for the named format from a loaded float32 ``model`` (left as it is).

    Formats that need other weights build them as copies, so one float32
    model can back every format in the same process (the benchmark measures
    them side by side that way). ``cache``: as for :func:`convert_weights`.
    """
    fmt = get_format(name)
    if fmt.prefill == "float32" and fmt.decode == "float32":
        return _fast(DecodeRunner(fmt, model))
    prefill = model if fmt.prefill == "float32" else convert_weights(model, fmt.prefill, cache=cache)
    if not fmt.split:
        return _fast(DecodeRunner(fmt, prefill))
    return _fast(DecodeRunner(fmt, prefill, convert_weights(model, fmt.decode, cache=cache)))


def _fast(runner: DecodeRunner) -> DecodeRunner:
    """The runner with its decode copy's steps routed through :mod:`streamlab.model.fast_decode` where it runs."""
    fast_decode.install(runner.decode_model)
    return runner


def _routed(runner: DecodeRunner, original: Callable[..., Any]) -> Callable[..., Any]:
    arg = runner._arg

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.shape[-1] > 1:
            cast_cache(kwargs.get(arg), runner.prefill_dtype)
            return original(*args, **kwargs)
        cache = kwargs.pop(arg, None)
        cast_cache(cache, runner.decode_dtype)
        return runner.decode_model(*args, **{runner._decode_arg: cache}, **kwargs)

    return forward


def prepare_model(model: nn.Module, name: str | DecodeFormat, *, cache: Path | None = None) -> tuple[nn.Module, DecodeRunner]:
    """Make a freshly loaded float32 ``model`` ready for a format, for loops that call ``model(...)``.

    Returns the model to call (converted in place where the format allows, so
    a loaded model is not held twice) and its :class:`DecodeRunner`. For a split
    format the returned model is the float32 one with its ``forward`` routing
    a pass with one token per row to the decode copy: the generation loops
    read a prompt in chunks of many tokens and decode one token per row, so
    the shape tells the phase until they call :meth:`DecodeRunner.prefill` and
    :meth:`DecodeRunner.decode` themselves. ``cache``: as for :func:`convert_weights`.
    """
    fmt = get_format(name)
    if not fmt.split:
        converted = convert_weights(model, fmt.decode, copy_model=False, cache=cache)
        return converted, _fast(DecodeRunner(fmt, converted))
    runner = _fast(DecodeRunner(fmt, model, convert_weights(model, fmt.decode, cache=cache)))
    model.forward = _routed(runner, model.forward)
    return model, runner


def weight_bytes(runner: DecodeRunner) -> int:
    """Bytes of weights a decode step reads: the decode copy's tensors, less the embedding's unread rows.

    A token's embedding is one row of its table; the table is read in full
    only where it doubles as the output projection (tied, as in SmolLM2's
    float32 and bfloat16 copies; the int8 and int4 copies have their own int8 head).
    """
    model = runner.decode_model
    seen: set[int] = set()
    total = 0
    for t in (*model.parameters(), *model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    inputs = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    outputs = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    table = getattr(inputs, "weight", None)
    if table is not None and getattr(outputs, "weight", None) is not table:
        total -= table.numel() * table.element_size()
    return total


def greedy(runner: DecodeRunner, prompt_ids: Sequence[int], tokens: int) -> list[int]:
    """The first ``tokens`` greedy tokens after a prompt: one prefill, then decode steps with the cache."""
    cache = runner.new_cache()
    out = runner.prefill(list(prompt_ids), cache, logits_to_keep=1)
    made = [int(out.logits[0, -1].argmax())]
    while len(made) < tokens:
        out = runner.decode([made[-1]], cache)
        made.append(int(out.logits[0, -1].argmax()))
    return made
