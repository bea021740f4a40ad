"""Run the server (or the proxy) as a real process, exactly as a reader would type it.

Chapters and tests start ``python -m streamlab serve ...`` in a subprocess
rather than in their own event loop: a notebook's loop would otherwise share
its time with the server's, and the measurements would measure that. The
process is started with ``--port 0`` (the kernel picks a free port), and it
announces itself with one line on stdout, ``streamlab: listening on URL``,
which is how we know it is ready and where it is.

Every process started here is stopped by its context manager, whatever
happens; and it is started with ``--exit-on-stdin-eof`` with our end of its
stdin held open, so if this Python process dies (a killed kernel), the
server sees EOF on its stdin and exits too.

None of them writes into the reader's own conversations: a process started
here gets a store of its own, a fresh temporary ``STREAMLAB_DATA``
(``RunningServer.data_dir``) removed when it is stopped, unless its command
names a file with ``--db`` (what a chapter does to start a server again on
the same store, after a ``kill -9``) or the caller's ``env`` names a
``STREAMLAB_DATA`` of its own. The page's sidebar lists what the reader said, not what
the book measured. ``python -m streamlab serve`` typed by hand keeps its
store in the data folder, as before.

Starting a command and waiting for its ready line, stopping it, a free port:
``streamlab.net.processes``, which every layer that starts a program shares.
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from streamlab.client.timed import get_json_sync
from streamlab.lab.results.records import REPO
from streamlab.net import warm
from streamlab.net.processes import READY_LINE, log_tail, start_and_wait, stop_process
from streamlab.net.serving import STOP_LISTENER

DATA = "STREAMLAB_DATA"  # the folder of a server's store when no --db names its file
WARM_READY = re.compile(r"(ready) on \S+ \(pid (\d+)\)")  # the warm starter's line (a socket, no URL or port)


@dataclass
class RunningServer:
    """A started process that is listening: where it is, and how to look inside."""

    port: int
    url: str
    process: subprocess.Popen
    args: tuple[str, ...]
    log_path: Path
    stdout_lines: list[str] = field(default_factory=list)
    data_dir: Path | None = None  # its throwaway STREAMLAB_DATA, removed when it stops (None: --db or the caller's)
    shared: SharedProcess | None = None  # one listener of several in one process (``start_servers(one_process=True)``)

    def logs(self) -> list[dict[str, Any]]:
        """The server's ``GET /log``: one record per generation request."""
        return get_json_sync(self.port, "/log")

    def log(self, request_id: str) -> dict[str, Any]:
        """One record of ``GET /log/{id}``."""
        return get_json_sync(self.port, f"/log/{request_id}")

    def stderr(self, last: int = 4000) -> str:
        """The tail of what the process wrote to stderr."""
        return log_tail(self.log_path, last)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; return the exit code. Its throwaway store goes with it.

        One listener of several in a process closes alone (``stop PORT`` on
        the process's stdin; None); the last one stops the process.
        """
        if self.shared is not None and self.shared.others_listen(self, timeout):
            return None
        try:
            return stop_process(self.process, timeout)
        finally:
            self._remove_store()

    def kill(self, timeout: float = 10.0) -> int | None:
        """SIGKILL, as a crash or the OOM killer would: the server gets no chance to write anything.

        Its throwaway store goes too: to start a server again on what the
        killed one left, give both the same ``--db``. A process serving
        several listeners takes them all along.
        """
        self.process.kill()
        try:
            return self.process.wait(timeout)
        finally:
            self._remove_store()

    def _remove_store(self) -> None:
        if self.data_dir is not None and self.process.poll() is not None:
            remove_store(self.data_dir)


class SharedProcess:
    """The listeners one ``serve --also`` process holds: stopping one closes it alone, the last stops the process."""

    def __init__(self) -> None:
        self.listening: list[RunningServer] = []
        self._lock = threading.Lock()

    def others_listen(self, member: RunningServer, timeout: float) -> bool:
        """Close ``member``'s listener alone if another still listens (True); False: it is the last, stop it all."""
        with self._lock:
            if member not in self.listening:
                return bool(self.listening)
            self.listening.remove(member)
            if not self.listening or member.process.poll() is not None or member.process.stdin is None:
                return False
            answered = len(member.stdout_lines)
            try:
                member.process.stdin.write(f"{STOP_LISTENER} {member.port}\n".encode())
                member.process.stdin.flush()
            except OSError:
                return False  # the process is gone already
        said = f"streamlab: stopped {member.port}"
        deadline = time.monotonic() + timeout
        while said not in member.stdout_lines[answered:] and time.monotonic() < deadline:
            if member.process.poll() is not None:
                break
            time.sleep(0.01)
        return True


# Throwaway stores not yet removed, with the process that uses each: at exit, those whose process has ended go
# (a caller that kills a process with os.kill never calls stop()).
_STORES: dict[Path, subprocess.Popen | None] = {}
_STORES_LOCK = threading.Lock()


def names_a_store(cmd_args: Sequence[str]) -> bool:
    """Whether a command line gives its store's file itself (``--db PATH`` or ``--db=PATH``)."""
    return any(arg == "--db" or arg.startswith("--db=") for arg in cmd_args)


def throwaway_store(name: str = "streamlab") -> Path:
    """A fresh temporary folder for one process's ``STREAMLAB_DATA``; ``remove_store`` takes it away."""
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-data-"))
    with _STORES_LOCK:
        _STORES[folder] = None
    return folder


def remove_store(folder: Path) -> None:
    with _STORES_LOCK:
        _STORES.pop(folder, None)
    shutil.rmtree(folder, ignore_errors=True)


@atexit.register
def _remove_ended_stores() -> None:
    with _STORES_LOCK:
        ended = [folder for folder, process in _STORES.items() if process is None or process.poll() is not None]
    for folder in ended:
        remove_store(folder)


def _child_env(env: dict[str, str] | None, data_dir: Path | None = None) -> dict[str, str]:
    merged = dict(os.environ if env is None else env)
    if data_dir is not None:
        merged[DATA] = str(data_dir)
    # The child imports this very streamlab, even when it is not installed.
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), merged.get("PYTHONPATH", "")) if p)
    merged.setdefault("PYTHONUNBUFFERED", "1")
    return merged


def start_process(
    cmd_args: Sequence[str],
    *,
    ready_timeout: float = 180.0,
    env: dict[str, str] | None = None,
    name: str = "streamlab",
    ready: re.Pattern = READY_LINE,
) -> RunningServer:
    """Start ``cmd_args`` and wait for its ``listening on`` line (or another, ``ready``: a URL and its port).

    stderr goes to a temporary log file (``RunningServer.log_path``). If the
    process exits or stays silent too long, it is stopped and the error
    carries the tail of its stderr, which is where the reason is.

    The process gets a throwaway ``STREAMLAB_DATA`` (``RunningServer.data_dir``,
    removed when it stops) in place of this process's own, unless
    ``cmd_args`` has a ``--db`` or ``env`` chooses another folder (one
    merely copied from ``os.environ`` is the reader's, and is replaced too).
    """
    chosen = names_a_store(cmd_args) or (env is not None and env.get(DATA) not in (None, os.environ.get(DATA)))
    data_dir = None if chosen else throwaway_store(name)

    def started(process: subprocess.Popen) -> None:
        if data_dir is not None:
            with _STORES_LOCK:
                _STORES[data_dir] = process

    try:
        up = start_and_wait(cmd_args, env=_child_env(env, data_dir), name=name, ready=ready,
                            ready_timeout=ready_timeout, started=started, warm=loads_model(cmd_args))
    except BaseException:
        if data_dir is not None:
            _remove_store_if_ended(data_dir)
        raise
    return RunningServer(up.port, up.url, up.process, tuple(cmd_args), up.log_path, up.stdout_lines, data_dir)


def loads_model(cmd_args: Sequence[str]) -> bool:
    """A ``python -m streamlab serve`` with a model (no scripted source, no relay) or a ``worker``: it imports torch.

    Only those are forked by a warm starter (``warm_starts``). The others import no torch when started fresh,
    and a fork would hand them the starter's: hundreds of megabytes more in their memory, and in what a
    chapter measures of them (chapter 11 weighs our scripted server against uvicorn's, per stream).
    """
    if len(cmd_args) < 4 or list(cmd_args[1:3]) != ["-m", "streamlab"]:
        return False
    flags = {arg.split("=")[0] for arg in cmd_args[4:]}
    return cmd_args[3] == "worker" or (cmd_args[3] == "serve" and not flags & {"--scripted-rate", "--upstream"})


def _remove_store_if_ended(folder: Path) -> None:
    """A store whose process never started, or has ended (stopped when it was not ready), goes now."""
    with _STORES_LOCK:
        process = _STORES.get(folder)
    if process is None or process.poll() is not None:
        remove_store(folder)


def server_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamlab", "serve", "--port", "0", "--exit-on-stdin-eof", *args]


def proxy_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamlab", "proxy", "--port", "0", "--exit-on-stdin-eof", *args]


def start_server(
    *args: str, ready_timeout: float = 180.0, env: dict[str, str] | None = None
) -> RunningServer:
    """Start ``python -m streamlab serve --port 0 ARGS``; call ``.stop()`` when done (or use ``serve``)."""
    return start_process(server_command(*args), ready_timeout=ready_timeout, env=env, name="streamlab-serve")


@contextmanager
def serve(
    *args: str, ready_timeout: float = 180.0, env: dict[str, str] | None = None
) -> Iterator[RunningServer]:
    """``with serve("--naive") as server:`` a model server on a free port, stopped on the way out."""
    server = start_server(*args, ready_timeout=ready_timeout, env=env)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def proxy(
    *args: str, ready_timeout: float = 60.0, env: dict[str, str] | None = None
) -> Iterator[RunningServer]:
    """``with proxy("--upstream", url) as p:`` the buffering proxy on a free port, stopped on the way out."""
    running = start_process(
        proxy_command(*args), ready_timeout=ready_timeout, env=env, name="streamlab-proxy"
    )
    try:
        yield running
    finally:
        running.stop()


@contextmanager
def serve_in_process(lm: Any, **config: Any) -> Iterator[Any]:
    """``with serve_in_process(lm, engine="threads") as server:`` a started ``Server`` over ``lm`` in this process.

    ``lm`` is what ``Server`` takes: a loaded model, a fake one, or a token
    source (a wrapper that watches every generation, as
    ``streamlab.lab.experiments.overhead`` uses). The server runs on an event loop of its
    own, in a thread, on a free port of 127.0.0.1 (``server.port``;
    ``server.loop`` is that loop, for ``run_coroutine_threadsafe``), with a
    throwaway store unless ``db_path`` is given (removed with it), and is
    shut down on the way out. No process to start and no model to load
    again: a chapter that has the model already serves it in seconds less
    (the tests serve a fake).
    The server's start-up line (its store, and what it recovered from a
    crash) is for an operator's terminal: in process it is kept in
    ``server.start_log`` rather than printed into the chapter that serves it.
    """
    import asyncio
    import contextlib
    import io

    from streamlab.server.app import Server
    from streamlab.server.config import ServerConfig

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="streamlab-in-process-server", daemon=True)
    thread.start()
    throwaway = None if config.get("db_path") else throwaway_store("streamlab-in-process")
    if throwaway is not None:
        config["db_path"] = str(throwaway / "streamlab.db")
    try:
        server = Server(lm, ServerConfig(port=0, **config))
    except BaseException:
        if throwaway is not None:
            remove_store(throwaway)
        raise
    try:
        with contextlib.redirect_stderr(io.StringIO()) as said:
            asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
        server.start_log = said.getvalue()
        yield server
    finally:
        if server.listening:
            asyncio.run_coroutine_threadsafe(server.shutdown(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        if throwaway is not None:
            remove_store(throwaway)


# --------------------------------------------------------------------------
# Servers a chapter needs, started together
# --------------------------------------------------------------------------


def start_servers(servers: dict[str, Sequence[str]], *, model_name: str | None = None,
                  one_process: bool = False, ready_timeout: float = 180.0) -> dict[str, Any]:
    """Start every server a chapter needs at once (``label -> serve arguments``): label -> running server.

    Each start is seconds of imports and loading the model, so a chapter
    starts its servers once, together, at the top, and stops them at the end.
    ``model_name`` adds ``--model`` to every server that loads one (not to
    ``--upstream`` relays). If one fails, the others are stopped and its error raised.

    ``one_process``: every server a listener of one process that loads the
    model once (``serve --also``), for servers measured one after another:
    they share its CPU, its event loop and its model, and a ``kill()`` takes
    them all. Each still has its own port, store, limits and ``/log``.
    """
    def args(extra: Sequence[str]) -> list[str]:
        relay = "--upstream" in extra or "--scripted-rate" in extra
        return [*extra, *(["--model", model_name] if model_name and not relay else [])]

    if one_process and len(servers) > 1:
        return start_listeners({label: list(extra) for label, extra in servers.items()},
                               model=["--model", model_name] if model_name else [], ready_timeout=ready_timeout)
    return _start_together({label: server_command(*args(extra)) for label, extra in servers.items()}, "streamlab-serve")


def start_listeners(listeners: dict[str, list[str]], *, model: Sequence[str] = (),
                    ready_timeout: float = 180.0) -> dict[str, RunningServer]:
    """One ``python -m streamlab serve`` with a listener per label (the first's flags, then ``--also`` each other's).

    ``model``: the process's own flags (``--model NAME``, a scripted rate...),
    given once. Returns label -> running server, one per listener, all of
    them one process.
    """
    labels = list(listeners)
    first, *others = (listeners[label] for label in labels)
    command = server_command(*first, *model, *(f"--also={shlex.join(extra)}" for extra in others))
    running = start_process(command, ready_timeout=ready_timeout, name="streamlab-serve")
    urls = _all_listening(running, len(labels), ready_timeout)
    shared = SharedProcess()
    members = {}
    for label, url in zip(labels, urls):
        member = replace(running, port=int(url.rsplit(":", 1)[1]), url=url, shared=shared)
        members[label] = member
        shared.listening.append(member)
    return members


def _all_listening(running: RunningServer, count: int, timeout: float) -> list[str]:
    """The URLs of a process's ``count`` listeners, from its ``listening on`` lines (printed one after another)."""
    deadline = time.monotonic() + timeout
    while True:
        urls = [match.group(1) for line in list(running.stdout_lines) if (match := READY_LINE.search(line))]
        if len(urls) >= count:
            return urls[:count]
        if running.process.poll() is not None or time.monotonic() > deadline:
            running.stop()
            raise RuntimeError(f"{' '.join(running.args)} said {len(urls)} of {count} 'listening on' lines"
                               f" (exit code {running.process.poll()}).\n--- stderr (tail) ---\n{running.stderr()}")
        time.sleep(0.01)


def start_proxies(proxies: dict[str, Sequence[str]]) -> dict[str, Any]:
    """Start every ``python -m streamlab proxy`` a chapter needs at once (``label -> proxy arguments``)."""
    return _start_together({label: proxy_command(*extra) for label, extra in proxies.items()}, "streamlab-proxy")


def start_platforms(platforms: dict[str, Sequence[str]]) -> dict[str, Any]:
    """Start every ``python -m streamlab platform`` a chapter needs at once (``label -> platform arguments``)."""
    from streamlab.hops.function_platform import platform_command

    return _start_together({label: platform_command(*extra) for label, extra in platforms.items()}, "streamlab-platform")


def _start_together(commands: dict[str, list[str]], name: str) -> dict[str, Any]:
    """Start each command (one that says ``listening on URL``) in a thread of its own; label -> running process."""
    with ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
        futures = {label: pool.submit(start_process, cmd, name=name) for label, cmd in commands.items()}
        return dict(zip(futures, all_started(futures.values())))


@contextmanager
def serving_in_thread(server: Any, name: str, poll_interval: float = 0.5) -> Iterator[Any]:
    """A ``socketserver`` server (an experiment's page server, a recorder) served by a daemon thread of this
    process while inside; shut down, closed and its thread joined on the way out."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": poll_interval}, name=name,
                              daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# What a warm starter imports before its first fork: the command line, the server, the worker, and the model's code.
WARM_PRELOAD = ("streamlab.cli", "streamlab.server.command", "streamlab.server.resources.worker",
                "streamlab.model.loading:preload_code")


@contextmanager
def warm_starts(ready_timeout: float = 120.0, *, preload: Sequence[str] = WARM_PRELOAD,
                modules: Sequence[str] = ("streamlab",)) -> Iterator[str | None]:
    """While inside, our servers are forked by one warm starter (``streamlab.net.warm``): its socket, or None.

    Set in ``STREAMLAB_WARM``, so the notebook kernels and test workers started
    inside inherit it. Each ``python -m streamlab ...`` started through
    ``start_process`` then skips the seconds of imports, and is otherwise the
    same program; one the starter may not fork (another environment) starts
    fresh. ``preload``: what it imports first; ``modules``: what it may run
    (``run-notebooks`` adds the kernels' own, ``streamlab.book.warm_kernel``).
    Already inside one, or where it cannot start, this does nothing.
    """
    if os.environ.get(warm.ENV):
        yield os.environ[warm.ENV]
        return
    folder = Path(tempfile.mkdtemp(prefix="streamlab-warm-"))
    path = str(folder / "starter.sock")
    cmd = [sys.executable, "-m", "streamlab.lab.setups.warm_starter", "--socket", path,
           *(arg for spec in preload for arg in ("--preload", spec)),
           *(arg for module in modules for arg in ("--module", module))]
    try:
        up = start_and_wait(cmd, env=_child_env(None), name="streamlab-warm", ready=WARM_READY,
                            ready_timeout=ready_timeout)
    except RuntimeError:
        shutil.rmtree(folder, ignore_errors=True)
        yield None
        return
    os.environ[warm.ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(warm.ENV, None)
        stop_process(up.process)
        shutil.rmtree(folder, ignore_errors=True)


def all_started(futures: Iterable[Future]) -> list[Any]:
    """Each future's result: what it started (a running process, or a list or dict of them).

    If any failed, every process the others started is stopped and the first
    error raised: a set-up that starts things at once never leaves half of them behind.
    """
    results, started, failed = [], [], None
    for future in futures:
        try:
            got = future.result()
        except Exception as exc:  # noqa: BLE001 - stop the others, then say which failed
            failed = failed or exc
            continue
        results.append(got)
        started += list(got.values()) if isinstance(got, dict) else list(got) if isinstance(got, list) else [got]
    if failed is not None:
        for running in started:
            running.stop()
        raise failed
    return results
