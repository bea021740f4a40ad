"""A warm starter forks our servers (streamlab.net.warm): the same program as one started fresh, seconds sooner.

Each test starts its own starter with ``runner.warm_starts`` (a session
that already has one reuses it), asks for servers through the runner as
the chapters do, and checks that what it got behaves as ``subprocess.Popen``
would: its ready line, its answers, its exit code on stdin's end, on
SIGTERM and on ``kill -9``, and a fresh start for what the starter must not fork.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from streamlab.lab.setups import runner
from streamlab.net import warm
from streamlab.net.processes import Started, start_and_wait, stop_process


@pytest.fixture(scope="module")
def starter():
    saved = os.environ.pop(warm.ENV, None)  # this file's own starter, whatever the session has
    try:
        with runner.warm_starts() as path:
            assert path is not None, "the starter did not start"
            yield path
    finally:
        if saved is not None:
            os.environ[warm.ENV] = saved


def forked(tmp_path: Path, *args: str) -> Started:
    """A scripted server asked of the starter (the runner asks only for those that load a model: loads_model)."""
    return start_and_wait(runner.server_command("--scripted-rate", "200", "--db", str(tmp_path / "s.db"), *args),
                          env=runner._child_env(None), warm=True)


def answer(server: runner.RunningServer | Started, tokens: int = 5) -> str:
    reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens,
                             "temperature": 0})
    reply.raise_for_status()
    return reply.json()["choices"][0]["message"]["content"]


def test_a_server_is_forked_answers_and_ends_as_a_fresh_one_would(starter: str, tmp_path: Path) -> None:
    server = forked(tmp_path)
    try:
        assert isinstance(server.process, warm.WarmProcess)
        assert server.process.poll() is None
        assert os.readlink(f"/proc/{server.process.pid}/cwd") == os.getcwd()  # the asker's folder, not the starter's
        assert answer(server)
        assert f"store {tmp_path}/s.db" in server.log_path.read_text()  # its stderr: the log the asker opened
    finally:
        code = stop_process(server.process)
    assert code == 0  # SIGTERM and stdin's end: a clean exit, as the starter reaped it
    assert server.process.wait(0) == 0


def test_kill_9_reaches_the_child_and_its_code_says_so(starter: str, tmp_path: Path) -> None:
    server = forked(tmp_path)
    server.process.kill()
    assert server.process.wait(10) == -signal.SIGKILL
    with pytest.raises(OSError):
        os.kill(server.process.pid, 0)  # gone, and reaped by the starter: no zombie left


def test_the_end_of_stdin_stops_a_server_that_watches_it(starter: str, tmp_path: Path) -> None:
    server = forked(tmp_path)
    assert server.process.stdin is not None
    server.process.stdin.close()  # what a killed kernel's end of the pipe does
    assert server.process.wait(10) == 0


def test_a_mistake_on_the_command_line_is_said_in_the_log_as_before(starter: str, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as raised:
        forked(tmp_path, "--no-such-flag")
    said = str(raised.value)
    assert "exited before it was ready" in said and "--no-such-flag" in said
    assert "exit code 2" in said  # argparse's code, told by the starter


def test_the_runner_asks_for_a_fork_only_of_what_imports_torch() -> None:
    assert runner.loads_model(runner.server_command())
    assert runner.loads_model(runner.server_command("--precision", "float32", "--max-active", "4"))
    assert runner.loads_model([sys.executable, "-m", "streamlab", "worker", "--redis", "redis://127.0.0.1:1"])
    # A scripted source, a relay and a proxy import no torch started fresh: a fork would give them the starter's.
    assert not runner.loads_model(runner.server_command("--scripted-rate", "20"))
    assert not runner.loads_model(runner.server_command("--upstream=http://127.0.0.1:1"))
    assert not runner.loads_model(runner.proxy_command("--upstream", "1"))


def test_what_the_starter_must_not_fork_starts_fresh(starter: str, tmp_path: Path) -> None:
    # A variable torch reads while it is imported: a fork would keep the starter's value, so it starts fresh.
    env = {**runner._child_env(None), "ATEN_CPU_CAPABILITY": "default"}
    server = start_and_wait(runner.server_command("--scripted-rate", "200", "--db", str(tmp_path / "s.db")), env=env,
                            warm=True)
    try:
        assert isinstance(server.process, subprocess.Popen)
        assert answer(server)
    finally:
        stop_process(server.process)
    # A module it did not preload: fresh too.
    up = start_and_wait([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], warm=True,
                        ready=re.compile(r"(Serving) HTTP on \S+ port (\d+)"))
    try:
        assert isinstance(up.process, subprocess.Popen)
    finally:
        stop_process(up.process)


def test_env_difference_names_what_a_fork_would_get_wrong() -> None:
    own = {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx2", "STREAMLAB_DATA": "/a"}
    assert warm.env_difference({**own, "STREAMLAB_DATA": "/b", "PYTEST_CURRENT_TEST": "x", "JPY_PARENT_PID": "1"},
                               own) is None
    assert warm.env_difference({**own, "ATEN_CPU_CAPABILITY": "avx512"}, own) == "ATEN_CPU_CAPABILITY"
    assert warm.env_difference({k: v for k, v in own.items() if k != "PATH"}, own) == "PATH"
    assert warm.env_difference({**own, "HF_HUB_OFFLINE": "1"}, own) == "HF_HUB_OFFLINE"


def test_children_outlive_a_stopped_starter_and_are_still_stopped(starter: str, tmp_path: Path) -> None:
    saved = os.environ.pop(warm.ENV)
    with runner.warm_starts() as path:  # a second starter, stopped below
        assert path is not None
        server = forked(tmp_path)
    os.environ[warm.ENV] = saved
    try:  # the starter is gone: the child it forked serves on
        assert server.process.poll() is None
        assert answer(server)
    finally:
        code = stop_process(server.process)
    assert code == 1  # ended; with nobody left to say its code, the pidfd told only that it ended


def test_the_starter_counts_the_cpu_of_the_children_it_reaped(starter: str, tmp_path: Path) -> None:
    before = warm.ask_cpu(starter)
    assert before > 0  # its own imports at least
    import psutil

    server = forked(tmp_path)
    try:
        answer(server, tokens=400)  # two seconds of a child streaming
        used = sum(psutil.Process(server.process.pid).cpu_times()[:2])
    finally:
        stop_process(server.process)
    assert warm.ask_cpu(starter) - before >= used  # the child's CPU, as the starter reaped it (and its own since)
    assert warm.ask_cpu(str(Path(starter).with_name("nobody.sock"))) == 0.0


@pytest.mark.model
def test_a_model_server_forked_from_the_starter_says_what_a_fresh_one_says(starter: str, model_cache: None) -> None:
    """The starter imported torch and the model's code, not the weights: each child loads its own, the same way."""
    forked = runner.start_server()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(warm.ENV)
        fresh = runner.start_server()
    try:
        assert isinstance(forked.process, warm.WarmProcess) and isinstance(fresh.process, subprocess.Popen)
        assert answer(forked, tokens=12) == answer(fresh, tokens=12)  # greedy: the same tokens, the same text
    finally:
        forked.stop()
        fresh.stop()


def test_a_chapter_kernel_is_forked_and_runs_its_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run-notebooks' kernels (streamlab.book.warm_kernel): forked, in a session of their own, in the notebook's folder."""
    import nbformat

    from streamlab.book.notebooks import papermill_run
    from streamlab.book.warm_kernel import warm_kernels

    notebook = tmp_path / "probe.ipynb"
    cell = nbformat.v4.new_code_cell("import os, pandas\nprint(os.getppid(), os.getsid(0) == os.getpid(), os.getcwd())")
    parameters = nbformat.v4.new_code_cell("results_path = None", metadata={"tags": ["parameters"]})
    nbformat.write(nbformat.v4.new_notebook(cells=[parameters, cell], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}}), notebook)
    monkeypatch.delenv(warm.ENV, raising=False)  # the session's starter forks no kernel: this one does
    with warm_kernels() as path:
        assert path is not None
        papermill_run(notebook, tmp_path / "out.ipynb", tmp_path, None, timeout=120, progress=False)
        assert warm.ask_cpu(path) > 0
    said = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[-1].outputs[0]["text"].split()
    assert int(said[0]) != os.getpid()  # its parent is the starter, not the process that asked for it
    assert said[1] == "True" and said[2] == str(tmp_path)  # a session of its own; the notebook's folder
