"""Shared fixtures: the model cache, and model servers started as real processes.

Starting a server costs a few seconds (importing torch and transformers,
loading the model), so servers are shared: ``servers(*flags)`` starts one
per distinct set of flags for the whole session and stops them all at the
end. Each is also started with ``--exit-on-stdin-eof``, so even a pytest
that is killed takes its servers with it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from streamlab.lab.setups import runner


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n 3 --dist loadgroup`` (make test), the chapters run one after another on one worker.

    Each chapter keeps a model busy for most of its run; two at once on two
    cores would each take twice as long and stretch the timings they print.
    Everything else is spread over the other workers around them: most of it
    waits on sockets and timers, not on the CPU.
    """
    for item in items:
        if item.get_closest_marker("notebook"):
            item.add_marker(pytest.mark.xdist_group("chapters"))


# The reader's own STREAMLAB_DATA, if they set one, before data_folder below replaces it for the session.
READERS_STREAMLAB_DATA = os.environ.get("STREAMLAB_DATA")


@pytest.fixture(scope="session")
def readers_folders() -> list[Path]:
    """Where the reader's own conversations are: their ``STREAMLAB_DATA`` if they set one, and the data
    folder a process with none would use (``$XDG_DATA_HOME/streamlab``, else ``~/.local/share/streamlab``).

    No test may change them (tests/test_notebooks.py checks after each chapter).
    """
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share").expanduser()
    folders = [base / "streamlab"]
    if READERS_STREAMLAB_DATA:
        folders.insert(0, Path(READERS_STREAMLAB_DATA).expanduser())
    return folders


@pytest.fixture(scope="session", autouse=True)
def data_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Anything a test opens at the default store's path lands here, never in the reader's data folder.

    Set in the environment, so processes (and notebook kernels) inherit it:
    ``Store``'s default path is ``$STREAMLAB_DATA/streamlab.db``. The servers
    the runner starts do not even use this one: each has a throwaway folder
    of its own (``streamlab.lab.setups.runner``), so after a chapter this folder is
    as it was (tests/test_notebooks.py checks).
    """
    folder = tmp_path_factory.mktemp("streamlab-data")
    saved = os.environ.get("STREAMLAB_DATA")
    os.environ["STREAMLAB_DATA"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("STREAMLAB_DATA", None)
    else:
        os.environ["STREAMLAB_DATA"] = saved


@pytest.fixture(scope="session", autouse=True)
def warm_servers(data_folder: Path) -> Iterator[str | None]:
    """One warm starter per test process (streamlab.net.warm): the model servers and the chapters' kernels the
    tests start skip the imports, as in ``make run``.

    ``STREAMLAB_WARM=off`` starts every one fresh instead; tests/test_warm.py holds the two to the same behaviour.
    """
    from streamlab.book.warm_kernel import warm_kernels

    with warm_kernels() as path:
        yield path


@pytest.fixture(scope="session")
def model_cache() -> None:
    """Convert the embedded model once, before any server needs it (unless another model is set)."""
    if not os.environ.get("STREAMLAB_MODEL"):
        from streamlab.model.loading import convert_embedded

        convert_embedded()


# Servers shared by many tests see each other's leftovers: a naive generation
# running on for nobody, one held by a buffering proxy until its end. They get
# room for those; admission itself is tested on servers of its own.
SHARED_ROOM = ("--max-active", "8")


def with_room(flags: tuple[str, ...]) -> tuple[str, ...]:
    return flags if "--max-active" in flags else (*flags, *SHARED_ROOM)


@pytest.fixture(scope="session")
def servers(model_cache: None) -> Iterator[Callable[..., runner.RunningServer]]:
    """``servers("--naive")``: a running server with those flags, shared by every test that asks."""
    started: dict[tuple[str, ...], runner.RunningServer] = {}

    def get(*flags: str) -> runner.RunningServer:
        if flags not in started:
            started[flags] = runner.start_server(*with_room(flags))
        return started[flags]

    yield get
    for server in started.values():  # signal them all first: they shut down side by side
        server.process.terminate()
    for server in started.values():
        server.stop()


@pytest.fixture(scope="session")
def server(servers: Callable[..., runner.RunningServer]) -> runner.RunningServer:
    """A server with the default flags (watching mode)."""
    return servers()


@pytest.fixture
def fresh_server(model_cache: None) -> Iterator[Callable[..., runner.RunningServer]]:
    """``fresh_server(*flags)``: a server of this test's own (to kill, signal...), stopped after it."""
    started: list[runner.RunningServer] = []

    def start(*flags: str) -> runner.RunningServer:
        started.append(runner.start_server(*flags))
        return started[-1]

    yield start
    for server in started:
        server.stop()


# --------------------------------------------------------------------------
# In-process servers over a fake model: server behaviour in milliseconds
# --------------------------------------------------------------------------


class InProcess:
    """What the tests use of a server, like ``runner.RunningServer``: ``port``, ``url``, ``logs()``."""

    def __init__(self, server) -> None:  # noqa: ANN001
        self.server = server
        self.port = server.port
        self.url = f"http://127.0.0.1:{server.port}"

    def logs(self) -> list[dict]:
        from streamlab.client import timed as client

        return client.get_json_sync(self.port, "/log")


FAKE_DECODE_SECONDS = 0.004  # per token: fast, yet slow enough that pieces arrive apart


@pytest.fixture(scope="session")
def apps() -> Iterator[Callable[..., InProcess]]:
    """``apps(naive=True)``: an in-process server over a fake model with that config, shared by the session."""
    from contextlib import ExitStack

    from fakes import FakeLM
    from inprocess import serving

    started: dict[tuple, InProcess] = {}
    with ExitStack() as stack:

        def get(decode_seconds: float = FAKE_DECODE_SECONDS, **config) -> InProcess:  # noqa: ANN003
            key = (decode_seconds, *sorted((k, repr(v)) for k, v in config.items()))
            if key not in started:
                lm = FakeLM(decode_seconds=decode_seconds)
                started[key] = InProcess(stack.enter_context(serving(lm, **config)))
            return started[key]

        yield get


@pytest.fixture(scope="session")
def app(apps: Callable[..., InProcess]) -> InProcess:
    """An in-process server over the fake model with the default config."""
    return apps()
