"""A private ``redis-server`` for an experiment: a free loopback port, its own folder, nothing saved, stopped by itself.

Debian's ``redis-server`` (``scripts/system-deps.sh`` installs it), started
in the foreground with every setting on the command line: ``--bind
127.0.0.1``, ``--save ''`` and ``--appendonly no`` (an experiment's log lives
in memory only), ``--dir`` a temporary folder of its own. ``run_redis()`` is a
context manager; an ``atexit`` hook stops any server still running when
Python exits, and on Linux the server is told to stop when its parent dies
(even by SIGKILL), so a failed test or a killed kernel leaves none behind.
"""

from __future__ import annotations

import atexit
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from streamlab.net.processes import die_with_parent, find_program, free_port, stop_process, wait_for_port

START_TIMEOUT = 10.0
_RUNNING: set[subprocess.Popen] = set()


class RedisUnavailable(RuntimeError):
    """redis-server is not installed here: callers (tests, the chapter) skip."""


def find_redis() -> str | None:
    return find_program("redis-server")


@dataclass
class RedisProcess:
    port: int
    folder: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def log(self) -> str:
        with suppress(OSError):
            return (self.folder / "redis.log").read_text(errors="replace")
        return ""


def _stop(process: subprocess.Popen) -> None:
    stop_process(process, 5)
    _RUNNING.discard(process)


@atexit.register
def _stop_all() -> None:
    for process in list(_RUNNING):
        _stop(process)


@contextmanager
def run_redis() -> Iterator[RedisProcess]:
    """``with run_redis() as redis:`` a redis-server at ``redis.url`` for the block, stopped and removed after."""
    binary = find_redis()
    if binary is None:
        raise RedisUnavailable("redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)")
    folder = Path(tempfile.mkdtemp(prefix="streamlab-redis-"))
    process: subprocess.Popen | None = None
    try:
        port = free_port()
        args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                "--dir", str(folder), "--logfile", str(folder / "redis.log"), "--daemonize", "no",
                "--protected-mode", "yes"]
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, cwd=folder,
                                   preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
        _RUNNING.add(process)
        running = RedisProcess(port, folder, process)
        _wait_until_ready(running)
        yield running
    finally:
        if process is not None:
            _stop(process)
        shutil.rmtree(folder, ignore_errors=True)


def _pongs(sock: socket.socket) -> bool:
    sock.sendall(b"PING\r\n")
    return sock.recv(64).startswith(b"+PONG")


def _wait_until_ready(redis: RedisProcess) -> None:
    """Until it answers PING with PONG (a bare RESP exchange: no client library needed)."""
    why = wait_for_port(redis.process, redis.port, START_TIMEOUT, answers=_pongs)
    if why == "exited":
        raise RuntimeError(f"redis-server exited with {redis.process.returncode}:\n{redis.log()[-2000:]}")
    if why is not None:
        raise RuntimeError(f"redis-server did not answer on port {redis.port} within {START_TIMEOUT} s")
