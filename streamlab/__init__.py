"""streamlab: how a language model's text reaches a reader, measured."""

from __future__ import annotations

__version__ = "0.1.0"

from .model import DEFAULT_MODEL, LoadedModel, ModelError, load_model  # noqa: E402

__all__ = ["DEFAULT_MODEL", "LoadedModel", "ModelError", "load_model", "__version__"]
