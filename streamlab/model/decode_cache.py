"""The narrow decode weights kept on disk beside the converted model, one file per CPU kernel kind.

Making the int4 (or int8) copy of a model quantizes every ``Linear`` and packs
it for torch's CPU kernel: 1.3-1.6 s for the embedded SmolLM2 on these
machines, at every server start and in every chapter's kernel. The result is
the same every time for the same weights, so it is kept here, as a
safetensors file of the narrow layers' buffers, and read back in a fraction of
that.

What it is the same *for* matters: the int4 kernel's packed layout is not one
layout. ``_convert_weight_to_int4pack_for_cpu`` packs differently under
PyTorch's AVX-512 and AVX2 kernels (the same weights give different bytes),
so the file is named for the kernel kind torch runs here
(``torch.backends.cpu.get_cpu_capability()``, which ``ATEN_CPU_CAPABILITY``
overrides) and for torch's version. A file for another kind is never read,
and a file that does not fit the model (missing or misshapen tensors, a
partial write) is ignored and written again.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

# Bumped when what the file holds changes meaning (the layers' buffers, their layout).
FILE_FORMAT = 1


def kernel_kind() -> str:
    """The CPU kernel kind torch dispatches to here: ``avx512``, ``avx2``, ``default``, ..."""
    return torch.backends.cpu.get_cpu_capability().lower().replace(" ", "-")


def cache_path(folder: Path, weights: str) -> Path:
    version = torch.__version__.replace("+", "-")
    return Path(folder) / f"decode-{weights}-{kernel_kind()}-torch{version}-v{FILE_FORMAT}.safetensors"


def read(folder: Path, weights: str) -> dict[str, torch.Tensor] | None:
    """The stored buffers by their dotted names, or None when there is no usable file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = cache_path(folder, weights)
    try:
        tensors = load_file(path)
    except (OSError, SafetensorError):
        return None
    # Each tensor sits where the file put it, at any byte offset; the AVX-512 int4 kernel reads its operands
    # with aligned loads and dies with a general protection fault on one that is not (a 30-reader batch did).
    # A copy gets torch's own allocation, aligned to 64 bytes.
    return {name: tensor.clone() for name, tensor in tensors.items()}


def write(folder: Path, weights: str, tensors: dict[str, torch.Tensor]) -> Path | None:
    """Store the buffers atomically (a temporary file renamed into place); None where the folder is read-only.

    Several servers starting at once may each convert and write: each rename
    replaces the file whole with the same contents, so a reader never sees half.
    """
    from safetensors.torch import save_file

    path = cache_path(folder, weights)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError:
        return None
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={"weights": weights})
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return None
    return path
