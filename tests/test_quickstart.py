"""The README's quick start, run as a reader would: its first screen, then serve, curl -N, Ctrl-C.

The commands are read from the README itself, so the page cannot drift from
what works. Only the port changes (``--port 0``: a test never takes 8000).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamlab.lab.setups.runner import start_process

README = Path(__file__).resolve().parents[1] / "README.md"
FIRST_SCREEN = 40  # lines


def _blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def _commands(block: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_first_screen_is_the_quick_start() -> None:
    head = "\n".join(README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN])
    assert "## Quick start" in head
    (setup, *_), (curl, *_) = (_commands(b) for b in _blocks(head)[:2])
    assert setup.startswith("make setup") and "serve" in head and curl.startswith("curl -N")
    assert "Ctrl-C" in head and ".venv" in head  # how to stop it, and how to use the venv


@pytest.mark.model
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed (make test installs it)")
def test_the_quick_start_serves_streams_and_stops_on_ctrl_c() -> None:
    serve_block, curl_block = _blocks(README.read_text(encoding="utf-8"))[:2]
    serve = next(c for c in _commands(serve_block) if "streamlab serve" in c)
    curl = next(c for c in _commands(curl_block) if c.startswith("curl -N"))
    argv = shlex.split(serve)
    assert argv[:3] == ["python", "-m", "streamlab"]
    running = start_process([sys.executable, *argv[1:], "--port", "0", "--exit-on-stdin-eof"], name="quick start")
    try:
        curl_argv = [a.replace("http://127.0.0.1:8000", running.url) for a in shlex.split(curl)]
        done = subprocess.run(curl_argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        events = re.findall(r"^event: (\w+)$", done.stdout, re.M)
        assert events[-1] == "end" and len(re.findall(r"^data: ", done.stdout, re.M)) > 10
        started = time.monotonic()
        os.kill(running.process.pid, signal.SIGINT)  # what Ctrl-C sends
        assert running.process.wait(15) == 0
        assert time.monotonic() - started < 10
    finally:
        running.stop()
