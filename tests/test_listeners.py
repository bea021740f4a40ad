"""``serve --also``: one process, one loaded model, several listeners, each its own port, store and limits.

The chapters start the servers they compare this way (one model load instead
of four). What must hold: each listener keeps its own configuration and
store; ``stop PORT`` on stdin closes one while the others go on serving,
an answer streaming on another included; the last stop ends the process; a
kill takes them all; a flag that belongs to the process is refused inside
``--also`` in one line. Run over the scripted source (no model): in seconds.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from streamlab.client import timed as client
from streamlab.lab.setups import runner
from streamlab.server.config import MAX_ACTIVE

pytestmark = pytest.mark.timeout(120)

SCRIPTED = ["--scripted-rate", "200"]


def test_each_listener_has_its_own_limits_store_and_log(tmp_path):
    listeners = runner.start_listeners({"plain": [], "naive": ["--naive", "--max-active", "3"],
                                        "named": ["--db", str(tmp_path / "named.sqlite")]}, model=SCRIPTED)
    try:
        plain, naive, named = listeners["plain"], listeners["naive"], listeners["named"]
        assert plain.process.pid == naive.process.pid == named.process.pid
        assert len({plain.port, naive.port, named.port}) == 3
        health = {label: client.get_json_sync(s.port, "/health") for label, s in listeners.items()}
        assert (health["plain"]["naive"], health["naive"]["naive"]) == (False, True)
        assert (health["plain"]["max_active"], health["naive"]["max_active"]) == (MAX_ACTIVE, 3)
        trace = client.stream_sync(naive.port, "Hello", 5)
        assert trace.status == 200 and trace.complete
        # The request went to the naive listener's log alone.
        assert len(naive.logs()) == 1 and plain.logs() == [] and named.logs() == []
        stores = plain.stderr()
        assert f"store {plain.data_dir / 'streamlab.db'}" in stores
        assert f"store {plain.data_dir / 'streamlab-2.db'}" in stores  # the second listener's, beside the first
        assert f"store {tmp_path / 'named.sqlite'}" in stores
    finally:
        for server in listeners.values():
            server.stop()
    assert plain.process.poll() == 0
    assert not plain.data_dir.exists()  # the throwaway store went with the process


def test_stopping_one_listener_leaves_the_others_serving_even_mid_answer():
    listeners = runner.start_listeners({"a": [], "b": [], "c": []}, model=["--scripted-rate", "40"])
    a, b, c = listeners["a"], listeners["b"], listeners["c"]
    streamed: dict = {}
    reader = threading.Thread(target=lambda: streamed.update(trace=client.stream_sync(c.port, "Hello", 40)))
    try:
        reader.start()
        deadline = time.monotonic() + 30
        while not any(record["tokens"] >= 3 for record in c.logs()) and time.monotonic() < deadline:
            time.sleep(0.02)  # the answer on c is under way
        assert b.stop() is None  # a listener of several: closed alone, the process lives on
        assert b.process.poll() is None
        with pytest.raises(OSError):
            client.get_json_sync(b.port, "/health", timeout=2)
        reader.join(30)
        trace = streamed["trace"]
        assert trace.status == 200 and trace.complete and trace.tokens == 40  # the answer on c was not touched
        assert client.get_json_sync(a.port, "/health")["ok"]
        assert a.stop() is None and a.process.poll() is None
        assert c.stop() == 0  # the last one stops the process
    finally:
        for server in listeners.values():
            server.stop()


def test_a_kill_takes_every_listener():
    listeners = runner.start_listeners({"a": [], "b": []}, model=SCRIPTED)
    a, b = listeners["a"], listeners["b"]
    a.kill()
    with pytest.raises(OSError):
        client.get_json_sync(b.port, "/health", timeout=2)
    assert b.stop() is not None  # the process had ended: its exit code, nothing left to close


def test_start_servers_in_one_process_or_one_each():
    apart = runner.start_servers({"x": SCRIPTED, "y": [*SCRIPTED, "--naive"]})
    try:
        assert apart["x"].process.pid != apart["y"].process.pid
    finally:
        for server in apart.values():
            server.stop()


@pytest.mark.parametrize("also, said", [
    ("--model other", "--also '--model other': --model belongs to the whole process; give it once, outside --also"),
    ("--loop uvloop", "--loop belongs to the whole process"),
    ("--naiev", "--also '--naiev': unrecognized arguments: --naiev"),
    ("--port 'x", "No closing quotation"),
])
def test_a_flag_that_is_not_a_listeners_own_is_one_line(also, said):
    done = subprocess.run([sys.executable, "-m", "streamlab", "serve", "--port", "0", *SCRIPTED, f"--also={also}"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert said in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2


def test_a_relay_serves_one_listener():
    done = subprocess.run([sys.executable, "-m", "streamlab", "serve", "--port", "0", "--upstream",
                           "http://127.0.0.1:9", "--also=--naive"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "--also: a relay serves one listener" in done.stderr
