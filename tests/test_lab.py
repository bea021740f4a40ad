"""``make lab`` opens JupyterLab, as root too: the launcher's command, then real JupyterLabs asked for a notebook.

Each JupyterLab here is started as a reader starts it (``python -m streamlab
lab FOLDER``, or ``make lab`` in a student copy), on a free port of
127.0.0.1, with a token of the test's and Jupyter folders of its own (config,
runtime, data: nothing of the user's is read or written), in a process group
of its own that is stopped however the test ends.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from streamlab import cli
from streamlab.book import jupyter_lab
from streamlab.book.grading import build_student_copy
from streamlab.net.processes import free_port

REPO = Path(__file__).resolve().parents[1]
STARTUP = 90.0  # seconds JupyterLab may take to answer on a busy 2-core machine (about 4 s when quiet)
AS_ROOT = jupyter_lab.is_root()


# --------------------------------------------------------------------------
# The launcher, without starting anything
# --------------------------------------------------------------------------


def test_as_root_the_command_adds_allow_root_once():
    as_root = jupyter_lab.command(Path("notebooks"), ["--port=8890", "--no-browser"], root=True)
    assert as_root == [sys.executable, "-m", "jupyterlab", "--allow-root", "--port=8890", "--no-browser", "notebooks"]
    already = jupyter_lab.command(Path("."), ["--allow-root"], root=True)
    assert already.count("--allow-root") == 1
    assert "--allow-root" not in jupyter_lab.command(Path("."), [], root=False)


def test_the_folder_comes_first_and_every_flag_after_it_goes_to_jupyterlab():
    assert jupyter_lab.split_args([]) == (Path("."), [])
    assert jupyter_lab.split_args(["--no-browser"]) == (Path("."), ["--no-browser"])
    assert jupyter_lab.split_args(["build/exercises", "--port=1", "x"]) == (Path("build/exercises"), ["--port=1", "x"])


def test_main_says_root_in_one_line_and_becomes_jupyterlab(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(jupyter_lab, "is_root", lambda: True)
    assert jupyter_lab.main([str(tmp_path), "--no-browser"], run=lambda path, cmd: ran.append(cmd)) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [jupyter_lab.ROOT_LINE] and "--allow-root" in err[0]
    assert ran == [[sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", str(tmp_path)]]
    monkeypatch.setattr(jupyter_lab, "is_root", lambda: False)
    jupyter_lab.main([str(tmp_path)], run=lambda path, cmd: ran.append(cmd))
    assert capsys.readouterr().err == "" and "--allow-root" not in ran[-1]


def test_a_folder_that_is_not_there_is_one_line(tmp_path, capsys):
    assert cli.main(["lab", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("streamlab: no folder ") and "nope" in err[0]


def test_help_names_the_folder_root_and_the_debug_switch(capsys):
    assert cli.main(["lab", "--help"]) == 0
    out = capsys.readouterr().out
    assert "[FOLDER]" in out and "--allow-root" in out and "STREAMLAB_DEBUG=1" in out and "``" not in out


def test_make_lab_runs_the_launcher_on_the_chapters():
    dry = subprocess.run(["make", "--no-print-directory", "-n", "lab"], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert "-m streamlab lab notebooks/" in dry.stdout.splitlines()[-1]


# --------------------------------------------------------------------------
# Real JupyterLabs
# --------------------------------------------------------------------------


@contextmanager
def jupyterlab(command: Sequence[str], tmp_path: Path) -> Iterator[Path]:
    """Run ``command`` (a JupyterLab launch) in its own process group; yield its stderr file; kill the group after."""
    folders = {name: tmp_path / "jupyter" / name.lower() for name in ("CONFIG", "RUNTIME", "DATA")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    env = {**os.environ, **{f"JUPYTER_{name}_DIR": str(folder) for name, folder in folders.items()},
           "JUPYTER_PLATFORM_DIRS": "1", "IPYTHONDIR": str(tmp_path / "ipython")}
    stderr = tmp_path / "jupyterlab.stderr"
    with stderr.open("wb") as err:
        process = subprocess.Popen(list(command), cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        yield stderr
    finally:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue


def jupyter_flags(port: int, token: str) -> list[str]:
    return [f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1", "--no-browser",
            f"--IdentityProvider.token={token}"]


def get(port: int, path: str, token: str | None, *, until: float = 0.0) -> tuple[int, bytes]:
    """GET ``path``; until ``until`` (a monotonic time), retry while nothing listens yet."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", f"token {token}")
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except OSError:
            if time.monotonic() >= until:
                raise
            time.sleep(0.5)


def asks_for_a_notebook(port: int, token: str, stderr: Path, path: str) -> dict:
    """The notebook at ``path`` through the contents API, once JupyterLab answers; its page answers too."""
    try:
        status, body = get(port, f"/api/contents/{path}?content=1", token, until=time.monotonic() + STARTUP)
    except OSError as err:
        pytest.fail(f"JupyterLab did not answer within {STARTUP:.0f} s ({err}); it wrote:\n"
                    + stderr.read_text(encoding="utf-8", errors="replace")[-3000:])
    assert status == 200, body[:300]
    model = json.loads(body)
    assert model["type"] == "notebook" and model["content"]["cells"], model.get("name")
    page, html = get(port, f"/lab/tree/{path}", token)
    assert page == 200 and b"JupyterLab" in html
    assert get(port, f"/api/contents/{path}", None)[0] == 403, "without the token, nothing"
    return model


def root_lines(stderr: Path) -> list[str]:
    return [line for line in stderr.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.startswith("streamlab lab:")]


@pytest.mark.timeout(180)
def test_python_m_streamlab_lab_opens_the_chapters(tmp_path):
    pytest.importorskip("jupyterlab")
    port, token = free_port(), secrets.token_hex(16)
    command = [sys.executable, "-m", "streamlab", "lab", "notebooks", *jupyter_flags(port, token)]
    with jupyterlab(command, tmp_path) as stderr:
        model = asks_for_a_notebook(port, token, stderr, "01_split_characters.ipynb")
    assert model["name"] == "01_split_characters.ipynb"
    assert root_lines(stderr) == ([jupyter_lab.ROOT_LINE] if AS_ROOT else [])


@pytest.mark.timeout(180)
def test_make_lab_in_the_student_copy_opens_the_copy(tmp_path):
    """The copy on its own, moved out of the course: its Makefile's `make lab` serves its exercises and chapters."""
    pytest.importorskip("jupyterlab")
    copy = tmp_path / "handed-out" / "exercises"
    build_student_copy(copy)
    port, token = free_port(), secrets.token_hex(16)
    command = ["make", "--no-print-directory", "-C", str(copy), "lab", f"PYTHON={sys.executable}",
               "LAB_ARGS=" + " ".join(jupyter_flags(port, token))]
    with jupyterlab(command, tmp_path) as stderr:
        asks_for_a_notebook(port, token, stderr, "ex1_detokenizer.ipynb")
        asks_for_a_notebook(port, token, stderr, "chapters/01_split_characters.ipynb")
        status, body = get(port, "/api/contents/", token)
    names = {item["name"] for item in json.loads(body)["content"]}
    assert status == 200 and "solutions" not in names and {"README.md", "Makefile", "chapters"} <= names
    assert root_lines(stderr) == ([jupyter_lab.ROOT_LINE] if AS_ROOT else [])
