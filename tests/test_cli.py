"""A user's mistake at the command line is one line naming what to change, and exit status 2.

Each start-up mistake is made for real, with the real command in a process
of its own: a busy port, a model that is not there, an upstream where
nothing listens, a database path that cannot be one, a chapter or a
parameter that does not exist. Each must print exactly one line on stderr
(besides the lines a command prints as it starts), naming the port, path,
URL or name and the flag or variable that changes it, and never a
traceback; ``STREAMLAB_DEBUG=1`` brings the traceback back.

A dead or silent upstream at request time is a gateway's failure, told as a
gateway tells it (502, 504), with ``/health`` saying so: tested in process.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inprocess import serving
from streamlab import cli
from streamlab.client import timed as client
from streamlab.book import notebooks
from streamlab.net.errors import UserError
from streamlab.server.store import file as store_file
from streamlab.server.answers.sources import UpstreamSource
from streamlab.server.store.database import Store
from streamlab.net.processes import free_port

REPO = Path(__file__).resolve().parents[1]
# Lines a command prints on its way up, before the mistake: not the mistake's own.
PROGRESS = ("streamlab: no model: a scripted source", "streamlab: relaying to", "streamlab: store ")


def streamlab(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "STREAMLAB_DEBUG"}
    environment.update({"HF_HUB_OFFLINE": "1", **(env or {})})
    return subprocess.run([sys.executable, "-m", "streamlab", *args], cwd=REPO, env=environment, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def the_line(done: subprocess.CompletedProcess) -> str:
    """The one line the mistake printed: exit status 2, no traceback, nothing else on stderr but progress."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line and not line.startswith(PROGRESS)]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("streamlab: "), lines[0]
    return lines[0]


# -- python -m streamlab itself ------------------------------------------------------


def test_an_unknown_command_is_one_line_with_the_nearest():
    line = the_line(streamlab("serv"))
    assert "'serv'" in line and "did you mean 'serve'" in line and "run-notebooks" in line


@pytest.mark.parametrize("command", ["run-notebooks", "report", "book", "info"])
def test_help_has_no_raw_backticks_and_tells_of_the_debug_switch(command):
    done = streamlab(command, "--help")
    assert done.returncode == 0 and "``" not in done.stdout
    assert "STREAMLAB_DEBUG=1" in " ".join(done.stdout.split())


def test_a_wrong_flag_is_one_line_not_the_usage():
    line = the_line(streamlab("report", "--outt", "x"))
    assert "--outt" in line and "--help" in line


def longest_flag(command: str, capsys: pytest.CaptureFixture) -> str:
    """The longest long option a command's --help lists (besides --help): one a typo cannot be an abbreviation of."""
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", capsys.readouterr().out)) - {"--help"}
    return max(sorted(flags), key=len)


# Commands that hand their flags to another program, which answers for them: lab's go to JupyterLab.
PASSED_ON = {"lab"}


@pytest.mark.parametrize("command", sorted(set(cli.COMMANDS) - PASSED_ON))
def test_a_misspelt_flag_names_the_nearest_in_one_line(command, capsys):
    flag = longest_flag(command, capsys)
    typo = flag[:3] + flag[4] + flag[3] + flag[5:]  # two letters swapped: --modle for --model
    assert cli.main([command, typo, "x"]) == 2
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and said.startswith(f"streamlab: unrecognized arguments: {typo}")
    assert f"(did you mean {flag}?)" in said and "--help" in said


def test_serve_modle_is_did_you_mean_model(capsys):
    assert cli.main(["serve", "--modle", "x"]) == 2
    assert "did you mean --model?" in capsys.readouterr().err


@pytest.mark.parametrize("command, flag", [("worker", "--redis URL"), ("proxy", "--upstream PORT"),
                                           ("platform", "--max-duration S")])
def test_a_required_flag_looks_required_and_says_so(command, flag, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    shown = capsys.readouterr().out
    usage = " ".join(shown.split("\n\n")[0].split())
    assert f" {flag} " in usage and f"[{flag}]" not in usage
    help_line = " ".join(shown.split(f"  {flag}", 1)[1].split("\n  -")[0].split())
    assert help_line.endswith("(required)") and "default" not in help_line, help_line


def test_a_missing_required_flag_says_what_it_takes(capsys):
    assert cli.main(["worker"]) == 2
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and "--redis URL, take jobs from" in said


# -- serve: the port and the store before the model ------------------------------------


def test_a_busy_port_is_told_before_any_model_work(tmp_path):
    """The model named cannot load at all: had it been tried first, that would be the error.

    So the port's line proves the order; no database file proves the store was not reached either.
    """
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = streamlab("serve", "--port", str(port),
                         env={"STREAMLAB_DATA": str(tmp_path / "data"), "STREAMLAB_MODEL": "does/not-exist"})
        took = time.monotonic() - started
    line = the_line(done)
    assert line == f"streamlab: port {port} on 127.0.0.1 is in use: pick another with --port (0 picks a free one)"
    assert "does/not-exist" not in done.stderr and "streamlab: model" not in done.stderr
    assert not (tmp_path / "data").exists()  # no store was opened, no folder made
    assert took < 20  # imports only: no model was loaded (the real one takes ~12 s on a clean clone)


def test_a_model_that_is_not_there_is_one_line_without_its_chain(tmp_path):
    done = streamlab("serve", "--port", "0", "--db", str(tmp_path / "m.db"), env={"STREAMLAB_MODEL": "does/not-exist"})
    line = the_line(done)
    assert "'does/not-exist'" in line and "HF_HUB_OFFLINE=1" in line and "--model" in line
    assert "STREAMLAB_MODEL" in line


def test_a_model_folder_that_is_not_there_is_named(tmp_path):
    line = the_line(streamlab("serve", "--port", "0", "--db", str(tmp_path / "m.db"),
                              "--model", str(tmp_path / "no-such-folder")))
    assert f"no model folder {tmp_path / 'no-such-folder'}" in line and "--model" in line


def test_debug_brings_the_traceback_back(tmp_path):
    done = streamlab("serve", "--scripted-rate", "20", "--port", "0", "--db", str(tmp_path),
                     env={"STREAMLAB_DEBUG": "1"})
    assert done.returncode == 2 and "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"streamlab: the store {tmp_path} is a folder")


def test_garbage_in_db_is_named_and_left_as_it_was(tmp_path):
    db = tmp_path / "conversations.db"
    db.write_bytes(b"not sqlite at all\n" * 100)
    before = db.read_bytes(), db.stat().st_mtime_ns
    line = the_line(streamlab("serve", "--scripted-rate", "20", "--port", "0", "--db", str(db)))
    assert line == (f"streamlab: {db} is not a SQLite database (it is left as it was): choose another file with"
                    " --db, or another folder with STREAMLAB_DATA")
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conversations.db"]  # no -wal, no -shm beside it


def test_a_data_folder_that_is_a_file_is_named(tmp_path):
    (tmp_path / "data").write_text("a file where the folder should be")
    line = the_line(streamlab("serve", "--scripted-rate", "20", "--port", "0",
                              env={"STREAMLAB_DATA": str(tmp_path / "data")}))
    assert f"cannot create the store {tmp_path / 'data' / 'streamlab.db'}: {tmp_path / 'data'} is a file" in line
    assert "--db" in line and "STREAMLAB_DATA" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_data_folder_is_named(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        line = the_line(streamlab("serve", "--scripted-rate", "20", "--port", "0",
                                  env={"STREAMLAB_DATA": str(folder)}))
    finally:
        folder.chmod(0o755)
    assert f"its folder {folder} is not writable" in line and "STREAMLAB_DATA" in line


def test_a_read_only_folder_is_worded_with_its_path(tmp_path, monkeypatch):
    """The same wording where the tests run as root (who may write anywhere): SQLite's error, the path's state."""
    path = tmp_path / "ro" / "streamlab.db"
    monkeypatch.setattr(os, "access", lambda p, mode: False)  # the os the store's file check asks
    told = store_file.unusable(path, sqlite3.OperationalError("unable to open database file"))
    assert str(told) == (f"cannot create the store {path}: its folder {path.parent} is not writable: choose another"
                         " file with --db, or another folder with STREAMLAB_DATA")


def test_the_store_raises_a_user_error_that_is_still_a_runtime_error(tmp_path):
    garbage = tmp_path / "x.db"
    garbage.write_text("garbage")
    with pytest.raises(UserError, match="not a SQLite database") as raised:
        Store(garbage)
    assert isinstance(raised.value, RuntimeError)


# -- serve --upstream, and the proxy ------------------------------------------------------


def test_an_upstream_where_nothing_listens_is_named_at_start(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    line = the_line(streamlab("serve", "--upstream", url, "--port", "0", "--db", str(tmp_path / "u.db")))
    assert line.startswith(f"streamlab: nothing listens at {url} (connection refused)") and "--upstream" in line
    assert "--upstream-model" not in line  # naming a model would not help


def test_an_upstream_that_is_not_a_url(tmp_path):
    line = the_line(streamlab("serve", "--upstream", "ftp://example", "--port", "0", "--db", str(tmp_path / "u.db")))
    assert "--upstream ftp://example: not an http(s) URL" in line


def test_the_proxy_on_a_busy_port_is_one_line():
    """The proxy binds through asyncio itself: the entry point words asyncio's error."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = the_line(streamlab("proxy", "--upstream", "8000", "--port", str(port)))
    assert line == f"streamlab: port {port} on 127.0.0.1 is in use: pick another with --port (0 picks a free one)"


# -- at request time: a dead, a silent upstream ------------------------------------------------

GENERATING = {
    "/complete": {"prompt": "Hi", "max_tokens": 5},
    "/stream": {"prompt": "Hi", "max_tokens": 5},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True},
    "/v1/messages": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": False},
}


def error_message(path: str, body: dict) -> str:
    """The message of an error body in the route's own API."""
    if path.startswith("/v1/messages"):
        assert body["type"] == "error"
    return body["error"]["message"]


def test_a_dead_upstream_is_a_502_in_each_api_and_health_says_it_is_down():
    url = f"http://127.0.0.1:{free_port()}"
    with serving(UpstreamSource(url, model="nobody")) as relay:
        for path, body in GENERATING.items():
            reply = client.fetch_sync(relay.port, "POST", path, body=body)
            assert reply.status == 502, (path, reply.status, reply.body)
            error = json.loads(reply.body)
            message = error_message(path, error)
            assert "could not connect to upstream" in message and url.split("//")[1] in message
            if path == "/complete":  # streamlab's own shape: the status, and where the (empty) answer is stored
                assert error["error"]["status"] == 502 and error["conversation_id"] and error["id"]
        health = client.get_json_sync(relay.port, "/health")
    assert health["ok"] is False and health["upstream"]["ok"] is False and health["upstream"]["url"] == url
    assert "connection refused" in health["upstream"]["error"]


def test_a_silent_upstream_is_a_504():
    with socket.socket() as silent:  # accepts (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with serving(UpstreamSource(url, model="nobody", read_timeout=0.3)) as relay:
            for path in ("/complete", "/stream"):
                reply = client.fetch_sync(relay.port, "POST", path, body=GENERATING[path])
                assert reply.status == 504, (path, reply.status, reply.body)
                assert "timed out" in json.loads(reply.body)["error"]["message"]


# -- run-notebooks: refuse what it cannot do, keep what a run did not replace --------------------


def results_folder(out: Path) -> dict[str, bytes]:
    """What a previous run left in ``out``: a chapter's results and the timings, byte for byte."""
    results = out / "results"
    results.mkdir(parents=True)
    (results / "01_split_characters.json").write_text('{"headline": "the last good run", "figures": {}}\n')
    (results / "timings.json").write_text('{"chapters": {"01_split_characters": 12.0}, "total": 12.0}\n')
    return {p.name: p.read_bytes() for p in results.iterdir()}


def snapshot(out: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}


def test_only_a_chapter_that_does_not_exist_changes_nothing(tmp_path):
    results_folder(tmp_path)
    before = snapshot(tmp_path)
    line = the_line(streamlab("run-notebooks", "--only", "nosuchchapter", "--out", str(tmp_path)))
    assert "no chapter matches --only nosuchchapter" in line and "01_split_characters" in line
    assert "12_what_else_sits_between" in line
    assert snapshot(tmp_path) == before  # no report, no timings rewritten


def test_a_misspelt_parameter_changes_nothing(tmp_path):
    results_folder(tmp_path)
    before = snapshot(tmp_path)
    line = the_line(streamlab("run-notebooks", "--only", "01", "-p", "max_tokns=10", "--out", str(tmp_path)))
    assert "'max_tokns' (did you mean 'max_tokens'?)" in line and "generate_tokens" in line
    assert snapshot(tmp_path) == before


def test_a_parameter_without_a_value_is_refused():
    with pytest.raises(UserError, match="give NAME=VALUE"):
        notebooks.parse_parameters(["max_tokens"], {"max_tokens"})
    assert notebooks.parse_parameters(["max_tokens=20", "model_name=Qwen"], {"max_tokens", "model_name"}) == {
        "max_tokens": 20, "model_name": "Qwen"}


def test_a_failing_chapter_keeps_the_last_results_and_names_its_notebook(tmp_path, monkeypatch, capsys):
    kept = results_folder(tmp_path)

    def fails(notebook, executed, results, parameters, *, timeout, progress):
        executed.write_text("{}")  # papermill saves the notebook as far as it ran
        results.write_text('{"headline": "half a run"}')  # a chapter that recorded, then failed
        raise RuntimeError("cell 7 fell over")

    monkeypatch.setattr(notebooks, "papermill_run", fails)
    assert notebooks.main(["--only", "01", "--out", str(tmp_path)]) == 1
    said = capsys.readouterr().err.strip().splitlines()[-1]
    executed = tmp_path / "notebooks" / "01_split_characters.ipynb"
    assert said.startswith("streamlab run-notebooks: chapter 01_split_characters failed: RuntimeError: cell 7 fell")
    assert said.endswith(f"its partly executed notebook: {executed}")
    results = tmp_path / "results"
    assert (results / "01_split_characters.json").read_bytes() == kept["01_split_characters.json"]
    timings = json.loads((results / "timings.json").read_text())
    assert timings["chapters"] == {"01_split_characters": 12.0} and timings["this_run"] == []
    assert timings["failed"]["01_split_characters"]["notebook"] == str(executed)
    assert not list(results.glob(".*"))  # the kept copy is back in place, nothing hidden left over


def test_a_chapter_that_succeeds_replaces_only_its_own(tmp_path, monkeypatch, capsys):
    results_folder(tmp_path)
    (tmp_path / "results" / "timings.json").write_text(json.dumps(
        {"chapters": {"01_split_characters": 12.0, "02_three_ways": 60.0}, "total": 72.0,
         "failed": {"01_split_characters": {"error": "an earlier failure"}}}))

    def succeeds(notebook, executed, results, parameters, *, timeout, progress):
        executed.write_text("{}")
        results.write_text(json.dumps({"headline": "this run", "figures": {}}))

    monkeypatch.setattr(notebooks, "papermill_run", succeeds)
    assert notebooks.main(["--only", "01", "--out", str(tmp_path)]) == 0
    timings = json.loads((tmp_path / "results" / "timings.json").read_text())
    assert set(timings["chapters"]) == {"01_split_characters", "02_three_ways"}
    assert timings["chapters"]["02_three_ways"] == 60.0 and timings["this_run"] == ["01_split_characters"]
    assert timings["failed"] == {}  # it ran since, and did not fail
    assert json.loads((tmp_path / "results" / "01_split_characters.json").read_text())["headline"] == "this run"


def test_report_of_a_folder_that_is_not_there(tmp_path):
    line = the_line(streamlab("report", "--out", str(tmp_path / "nothing")))
    assert f"--out {tmp_path / 'nothing'} is not there" in line
