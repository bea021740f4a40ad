"""The book and the tests never write into the reader's own conversations.

A reader's store is ``$STREAMLAB_DATA/streamlab.db``, else
``~/.local/share/streamlab/streamlab.db``: the page's sidebar lists what is in
it. Each test here points both at folders of its own, holding a store as a
reader's would, starts servers the ways ``make run``'s steps do (the runner,
the replicas, the browser's screenshot, the report, the book, run-notebooks),
and then asserts that both folders are exactly as they were, file for file and
mtime for mtime, and that each server's throwaway store went when it stopped.

No model here but where a step loads one (the browser's screenshot): the
servers answer from the scripted source, so the whole file takes seconds.
The chapters themselves are held to the same by ``tests/test_notebooks.py``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamlab.client import timed as client
from streamlab.lab.setups import runner
from streamlab.server.store.database import Store

SCRIPTED = ("--scripted-rate", "500")  # no model: a server up in a second or two
pytestmark = pytest.mark.timeout(180)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (and every folder, as size -1): its size and mtime in nanoseconds."""
    if not folder.exists():
        return {}
    seen = {}
    for path in sorted(folder.rglob("*")):
        stat = path.stat()
        seen[str(path.relative_to(folder))] = (-1 if path.is_dir() else stat.st_size, stat.st_mtime_ns)
    return seen


@dataclass
class ReadersData:
    """The two folders a reader's conversations can be in, and what they held before the test."""

    data: Path  # $STREAMLAB_DATA
    home_data: Path  # ~/.local/share/streamlab, under a $HOME of this test's own
    before: dict[str, dict[str, tuple[int, int]]]

    def assert_untouched(self) -> None:
        now = {str(folder): snapshot(folder) for folder in (self.data, self.home_data)}
        assert now == self.before, "a server wrote into the reader's data folder"


@pytest.fixture
def readers_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReadersData]:
    """``STREAMLAB_DATA`` and ``HOME`` pointed at this test's folders, each holding a reader's store already."""
    from streamlab.model.loading import default_cache_dir

    monkeypatch.setenv("STREAMLAB_CACHE", str(default_cache_dir()))  # the converted model, wherever HOME goes
    data, home = tmp_path / "data", tmp_path / "home"
    home_data = home / ".local" / "share" / "streamlab"
    for folder in (data, home_data):
        with Store(folder / "streamlab.db") as store:
            store.add_user_message(store.new_conversation("mine"), "a conversation of the reader's own")
    monkeypatch.setenv("STREAMLAB_DATA", str(data))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    yield ReadersData(data, home_data, {str(f): snapshot(f) for f in (data, home_data)})


def talk_to(server: runner.RunningServer, readers_data: ReadersData) -> Path:
    """One answer, so the server writes its store; where that store is (its throwaway folder)."""
    trace = client.stream_sync(server.port, "Say hello.", 5)
    assert trace.status == 200 and trace.text
    readers_data.assert_untouched()
    assert server.data_dir is not None, "a server started without --db has a store of its own"
    stored = server.data_dir / "streamlab.db"
    with Store(stored) as store:
        assert len(store.conversations()) == 1  # it wrote there, and nowhere else
    return server.data_dir


def test_start_server_and_serve_give_each_server_a_store_that_goes_with_it(readers_data: ReadersData):
    running = runner.start_server(*SCRIPTED)
    try:
        first = talk_to(running, readers_data)
    finally:
        running.stop()
    with runner.serve(*SCRIPTED) as server:
        second = talk_to(server, readers_data)
    assert first != second
    assert not first.exists() and not second.exists()
    readers_data.assert_untouched()


def test_servers_started_together_and_replicas_each_have_their_own(readers_data: ReadersData):
    from streamlab.lab.setups.replicas import start_replicas

    started = [*runner.start_servers({"one": SCRIPTED, "two": [*SCRIPTED, "--naive"]}).values(), *start_replicas(2)]
    try:
        folders = [talk_to(server, readers_data) for server in started]
    finally:
        for server in started:
            server.stop()
    assert len(set(folders)) == 4 and not any(folder.exists() for folder in folders)
    readers_data.assert_untouched()


def test_a_server_given_db_uses_that_file_and_keeps_it(readers_data: ReadersData, tmp_path: Path):
    """What chapter 7 does to start a server again on the store a killed one left."""
    db = tmp_path / "kept" / "chat.sqlite"
    running = runner.start_server(*SCRIPTED, "--db", str(db))
    try:
        assert running.data_dir is None
        client.stream_sync(running.port, "Say hello.", 5)
    finally:
        running.kill()
    again = runner.start_server(*SCRIPTED, f"--db={db}")
    again.stop()
    with Store(db) as store:
        assert len(store.conversations()) == 1
    readers_data.assert_untouched()


def test_a_killed_server_s_store_goes_too(readers_data: ReadersData):
    running = runner.start_server(*SCRIPTED)
    folder = talk_to(running, readers_data)
    running.kill()
    assert not folder.exists()
    readers_data.assert_untouched()


def test_an_in_process_server_s_store_goes_when_it_is_shut_down(readers_data: ReadersData):
    from fakes import FakeLM

    with runner.serve_in_process(FakeLM("Hello there.")) as server:
        client.stream_sync(server.port, "Say hello.", 5)
        folder = Path(server.config.db_path).parent
        assert (folder / "streamlab.db").exists()
    assert not folder.exists()
    readers_data.assert_untouched()


def test_run_notebooks_gives_its_kernels_a_data_folder_of_their_own(readers_data: ReadersData, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    """Belt and braces: a chapter that opened the default store would find a throwaway one, gone after the run."""
    from streamlab.book import notebooks

    seen = []

    def execute(notebook: Path, **_: object) -> dict:
        seen.append(Path(os.environ["STREAMLAB_DATA"]))
        with Store() as store:  # the default store, as a kernel would open it
            store.new_conversation("the book's, not the reader's")
        return {"headline": f"{notebook.stem}: done"}

    monkeypatch.setattr(notebooks, "execute", execute)
    monkeypatch.setattr(notebooks, "proofread", lambda executed, headline: "")
    assert notebooks.main(["--only", "01_", "--out", str(tmp_path / "build")]) == 0
    (folder,) = seen
    assert folder != readers_data.data and not folder.exists()
    assert os.environ["STREAMLAB_DATA"] == str(readers_data.data)
    readers_data.assert_untouched()


def test_the_report_and_the_book_steps_of_make_run_write_no_store(readers_data: ReadersData, tmp_path: Path):
    from streamlab.book import pages, report
    from streamlab.book.notebooks import chapters

    out = tmp_path / "build"
    (out / "notebooks").mkdir(parents=True)
    shutil.copy(chapters()[0], out / "notebooks")
    assert report.main(["--out", str(out), "--screenshot", str(out / "report.png"), "--skip-if-unavailable"]) == 0
    assert pages.main(["--out", str(out)]) == 0
    readers_data.assert_untouched()


@pytest.mark.model
@pytest.mark.browser
def test_the_browser_step_of_make_run_writes_no_store(readers_data: ReadersData, tmp_path: Path, model_cache: None):
    """``python -m streamlab.lab.outside.browser build/screenshot-mid-stream.png --skip-if-unavailable``, as make run types it."""
    from streamlab.lab.outside import browser

    assert browser.main([str(tmp_path / "shot.png"), "--max-tokens", "40", "--pieces", "4",
                         "--skip-if-unavailable"]) == 0
    readers_data.assert_untouched()
