"""A model name that is neither a folder nor reachable is one line within seconds, not a minute of retries.

The hub is made unreachable on purpose (``HF_ENDPOINT`` at a closed port of
127.0.0.1), so these tests are as quick and as offline on a machine with a
network as on one without. A hub that accepts the connection is left to
huggingface_hub, and an id already in the Hugging Face cache is read from
there without asking the hub at all.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from streamlab.model import loading
from streamlab.model.loading import ModelError, convert_embedded

REPO = Path(__file__).resolve().parents[1]
HUB_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "STREAMLAB_MODEL", "STREAMLAB_DEBUG")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nobody listens there once it is closed


def offline_user(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a user with no hub and no switch set: the hub's port is simply closed."""
    env = {key: value for key, value in os.environ.items() if key not in HUB_VARIABLES and "PROXY" not in key.upper()}
    env.update({"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HOME": str(tmp_path / "hf"),
                "STREAMLAB_DATA": str(tmp_path / "data"), **extra})
    return env


def test_a_name_nowhere_is_one_line_within_5_s(tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "streamlab", "serve", "--port", "0"], cwd=REPO,
                          env=offline_user(tmp_path, STREAMLAB_MODEL="nope/nope"), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("streamlab: store ")]
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("streamlab: model 'nope/nope' ") and "cannot be reached" in line, line
    assert "--model" in line and "STREAMLAB_MODEL" in line and "go online" in line
    assert "Retry" not in done.stderr and "Traceback" not in done.stderr
    assert took < 5, took


def test_the_probe_tells_a_closed_port_from_a_listening_one(monkeypatch):
    for variable in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    assert "Connection refused" in loading.hub_unreachable()
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen()
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{hub.getsockname()[1]}")
        assert loading.hub_unreachable() is None
        assert loading.hub_options("streamlab-tests/not-cached") == {}  # a hub that answers is asked


def test_a_proxy_is_what_the_probe_connects_to(monkeypatch):
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")
        assert loading.hub_unreachable() is None


def test_a_switched_off_hub_is_said_without_a_probe(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(loading, "hub_unreachable", lambda *a: pytest.fail("probed a hub that is switched off"))
    with pytest.raises(ModelError, match=r"switched off \(TRANSFORMERS_OFFLINE=1\).*unset TRANSFORMERS_OFFLINE"):
        loading.hub_options("streamlab-tests/not-cached")


def test_a_name_that_cannot_be_an_id_is_said():
    with pytest.raises(ModelError, match=r"neither a folder here nor a Hugging Face model id.*--model"):
        loading.hub_options("no such//model")


def test_an_id_in_the_cache_loads_with_the_hub_unreachable(tmp_path):
    """A model downloaded once keeps working offline: read from the cache, no probe, no request."""
    snapshot = tmp_path / "hf" / "hub" / "models--streamlab-tests--cached" / "snapshots" / ("0" * 40)
    shutil.copytree(convert_embedded(), snapshot, ignore=shutil.ignore_patterns("*.safetensors", "*.json.lock"))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    code = textwrap.dedent(
        """
        from streamlab.model import loading
        loading.hub_unreachable = lambda *a: print("probed")
        print(loading.hub_options("streamlab-tests/cached"))
        tokenizer = loading.load_tokenizer("streamlab-tests/cached")
        print(tokenizer.decode(tokenizer("hello")["input_ids"]))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=offline_user(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["{'local_files_only': True}", "hello"], done.stdout
