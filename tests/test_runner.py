"""Tests for streamlab.lab.setups.runner: starting processes, waiting for readiness, always stopping them."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import pytest

from streamlab.client import timed as client
from streamlab.lab.setups import runner
from streamlab.net import processes

pytestmark = pytest.mark.timeout(120)


def script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


READY = "print('fake: listening on http://127.0.0.1:4321', flush=True)\n"


def test_free_port_can_be_bound():
    port = processes.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_start_process_waits_for_the_listening_line():
    code = (
        "import sys, time\nprint('warming up', flush=True)\ntime.sleep(0.3)\n" + READY + "sys.stdin.read()\n"
    )
    running = runner.start_process(script(code))
    try:
        assert (running.port, running.url) == (4321, "http://127.0.0.1:4321")
        assert running.stdout_lines[:2] == ["warming up", "fake: listening on http://127.0.0.1:4321"]
        assert running.process.poll() is None
    finally:
        running.stop()
    assert running.process.poll() is not None


def test_a_crash_before_readiness_raises_with_stderr():
    code = "import sys\nsys.stderr.write('boom: no such flag --frobnicate\\n')\nsys.exit(3)\n"
    with pytest.raises(RuntimeError) as info:
        runner.start_process(script(code))
    assert "boom: no such flag --frobnicate" in str(info.value)
    assert "exit code 3" in str(info.value)


def test_silence_past_the_timeout_raises_and_stops_the_process():
    with pytest.raises(RuntimeError, match="was not listening after 1 s"):
        runner.start_process(script("import time\ntime.sleep(60)\n"), ready_timeout=1)


def test_stop_insists_when_sigterm_is_ignored():
    code = (
        "import signal, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        + READY
        + "import time\ntime.sleep(60)\n"
    )
    running = runner.start_process(script(code))
    started = time.monotonic()
    assert running.stop(timeout=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 5


def test_stdout_keeps_draining_after_readiness():
    code = (
        READY
        + "for i in range(20000):\n    print('x' * 50)\nprint('finished', flush=True)\nimport sys\nsys.stdin.read()\n"
    )
    running = runner.start_process(script(code))
    try:
        deadline = time.monotonic() + 20
        while "finished" not in running.stdout_lines and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "finished" in running.stdout_lines  # a full pipe would have blocked the child
    finally:
        running.stop()


def test_commands():
    assert runner.server_command("--naive")[1:] == [
        "-m",
        "streamlab",
        "serve",
        "--port",
        "0",
        "--exit-on-stdin-eof",
        "--naive",
    ]
    assert runner.proxy_command("--block", "8192")[1:5] == ["-m", "streamlab", "proxy", "--port"]


@pytest.mark.model
def test_serve_yields_a_ready_server_that_dies_with_its_parent(model_cache):
    with runner.serve("--ping-interval", "5") as server:
        assert client.get_json_sync(server.port, "/health")["ok"]
        assert server.logs() == []
        assert "listening on" in server.stdout_lines[0]
        assert server.args[-2:] == ("--ping-interval", "5")
        # A parent that dies closes the pipe: the server must not outlive it.
        assert server.process.stdin is not None
        server.process.stdin.close()
        assert server.process.wait(10) == 0


@pytest.mark.model
def test_bad_server_flags_raise_with_the_reason(model_cache):
    with pytest.raises(RuntimeError, match="unrecognized arguments: --no-such-flag"):
        with runner.serve("--no-such-flag"):
            pass


def test_serve_in_process_gives_a_listening_server_and_its_loop_then_shuts_it_down():
    import asyncio

    from fakes import FakeLM

    with runner.serve_in_process(FakeLM("Hello.")) as server:
        assert server.listening and server.port > 0
        assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0, "on its loop"), server.loop).result(5) == "on its loop"
        assert client.get_json_sync(server.port, "/health")["ok"]
        loop = server.loop
    assert not server.listening and loop.is_closed()


def test_serve_in_process_keeps_the_start_up_line_out_of_the_caller_s_stderr(capsys):
    """A chapter serving in process shows no operator's log line (its store, what it recovered) as stderr."""
    from fakes import FakeLM

    with runner.serve_in_process(FakeLM("Hello.")) as server:
        assert "streamlab: store " in server.start_log
    assert "streamlab: store" not in capsys.readouterr().err


def test_a_server_not_started_is_not_listening():
    from fakes import FakeLM
    from streamlab.server.app import Server

    server = Server(FakeLM())
    assert not server.listening and server.loop is None and server.port == 0


# --------------------------------------------------------------------------
# A store of its own: the child's STREAMLAB_DATA (tests/test_user_data.py starts real servers)
# --------------------------------------------------------------------------

SAYS_ITS_DATA = "import os, sys\nprint('data:', os.environ.get('STREAMLAB_DATA'), flush=True)\n"


def data_of(running: runner.RunningServer) -> str:
    return next(line for line in running.stdout_lines if line.startswith("data: "))[len("data: "):]


def test_a_process_gets_a_throwaway_data_folder_that_goes_when_it_stops(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMLAB_DATA", str(tmp_path / "the reader's"))
    running = runner.start_process(script(SAYS_ITS_DATA + READY + "sys.stdin.read()\n"))
    try:
        assert running.data_dir is not None and running.data_dir.is_dir()
        assert data_of(running) == str(running.data_dir)
    finally:
        running.stop()
    assert not running.data_dir.exists()


def test_a_command_naming_its_db_or_an_env_naming_a_folder_keeps_its_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMLAB_DATA", str(tmp_path / "inherited"))
    code = SAYS_ITS_DATA + READY + "sys.stdin.read()\n"
    for cmd, env, expected in [
        ([*script(code), "--db", "x.db"], None, str(tmp_path / "inherited")),  # --db: the folder is not used
        ([*script(code), "--db=x.db"], None, str(tmp_path / "inherited")),
        (script(code), {**os.environ, "STREAMLAB_DATA": str(tmp_path / "chosen")}, str(tmp_path / "chosen")),
    ]:
        running = runner.start_process(cmd, env=env)
        running.stop()
        assert running.data_dir is None and data_of(running) == expected
    passed_along = runner.start_process(script(code), env=dict(os.environ))  # the reader's folder, merely copied
    passed_along.stop()
    assert passed_along.data_dir is not None and data_of(passed_along) == str(passed_along.data_dir)
    assert runner.names_a_store(["serve", "--db", "a"]) and not runner.names_a_store(["serve", "--dbx"])


def test_a_process_that_never_gets_ready_takes_its_data_folder_with_it():
    code = "import os, sys\nsys.stderr.write(f\"data: {os.environ['STREAMLAB_DATA']}\\n\")\nsys.exit(3)\n"
    with pytest.raises(RuntimeError) as info:
        runner.start_process(script(code))
    folder = str(info.value).split("data: ")[1].split()[0]
    assert folder and not os.path.exists(folder)
