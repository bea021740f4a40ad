"""A warm start: one process that has already imported what our servers need forks each one that is asked for.

``python -m streamlab serve`` spends about 4 s of CPU importing torch and
transformers before it reads a weight, and ``make run`` and ``make test``
start dozens of them. The *starter* (``python -m streamlab.lab.setups.warm_starter``) is a
small single-threaded process that imports them once and then waits on a
Unix socket. Asked to run ``python -m MODULE ARGS``, it forks a child that
runs exactly that, as if it had been started fresh: the asker's argv,
environment, working folder and three standard streams (sent as file
descriptors over the socket). The asker gets a :class:`WarmProcess`, which
behaves like the ``subprocess.Popen`` it replaces: the child's real pid (a
``kill -9`` reaches it, through a pidfd, so never a reused pid), its stdin
and stdout pipes, and ``poll``/``wait`` with the exit code the starter reports
when it reaps the child.

This module is the asker's side; the starter's loop, which imports the
modules it is told to, is ``streamlab.lab.setups.warm_starter``. A start goes
warm only when ``STREAMLAB_WARM`` names a starter's socket (``off``: never),
the command is this very Python running a module the starter preloaded
(``python -m streamlab ...``), and the asker's environment matches the
starter's in everything a library may read while it is imported: only the
names in :data:`PER_PROCESS` may differ (``STREAMLAB_*``, which our code
reads when it runs, and what pytest and Jupyter set per test or per
kernel). Anything else (``ATEN_CPU_CAPABILITY``, ``HF_HUB_OFFLINE``, another
Python) is refused, the reason written to the starter's log, and the asker
starts the process fresh, as before. The starter's last line counts both.

The protocol is one JSON message per ``SOCK_SEQPACKET`` packet: the asker
sends ``{"run": [module, *args], "env": {...}, "cwd": ...}`` with its stdin,
stdout and stderr attached, and reads ``{"pid": N}`` (or ``{"refused":
why}``), then, when the child has ended, ``{"exit": code}`` (negative: the
signal that ended it, as ``Popen.returncode`` has it). ``{"cpu": true}``
answers the CPU seconds of the starter and of every child it has reaped, so
a caller that counts its children's CPU (``run-notebooks``) still can.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from contextlib import suppress
from typing import Any, Sequence

__all__ = ["ENV", "MAX_MESSAGE", "PER_PROCESS", "WarmProcess", "ask_cpu", "env_difference", "start"]

ENV = "STREAMLAB_WARM"  # the starter's socket, for every process that may ask it

# Names that may differ between the asker and the starter: read when our code runs, never while a library is
# imported, or set by pytest and Jupyter per test and per kernel.
PER_PROCESS = ("STREAMLAB_", "PYTEST_", "JPY_", "PYDEVD_", "MPLBACKEND", "CLICOLOR", "CLICOLOR_FORCE", "FORCE_COLOR",
               "TERM", "PAGER", "GIT_PAGER", "COLUMNS", "LINES", "_",
               "TORCHINDUCTOR_CACHE_DIR")  # torch sets it in a process that compiled, and reads it at each compile
MAX_MESSAGE = 1 << 20


def _per_process(name: str) -> bool:
    return any(name == prefix or (prefix.endswith("_") and name.startswith(prefix)) for prefix in PER_PROCESS)


def _value(env: dict[str, str], name: str) -> object:
    value = env.get(name)
    if name == "PYTHONPATH" and value is not None:  # the same folders, one said twice: the same imports
        return tuple(dict.fromkeys(folder for folder in value.split(os.pathsep) if folder))
    return value


def env_difference(asked: dict[str, str], own: dict[str, str]) -> str | None:
    """The names whose values would differ in a forked child from a fresh one (comma-separated), or None."""
    names = [name for name in sorted(set(asked) | set(own))
             if not _per_process(name) and _value(asked, name) != _value(own, name)]
    return ", ".join(names) or None


# --- the asker's side -----------------------------------------------------------------------------------------


class WarmProcess:
    """A child the starter forked, seen from the process that asked for it: what ``subprocess.Popen`` offers."""

    def __init__(self, args: Sequence[str], conn: socket.socket, pid: int, stdin: Any, stdout: Any) -> None:
        self.args = list(args)
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = None
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._pidfd = os.pidfd_open(pid)
        self._lock = threading.RLock()

    def _ended(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` for the child's end (and the starter's word of its code); True once it has."""
        with self._lock:
            if self.returncode is not None:
                return True
            watched = [self._pidfd] if self._conn is None else [self._conn, self._pidfd]
            if not select.select(watched, [], [], timeout)[0]:
                return False
            # The starter's word came, or the child is gone and the word is on its way (the starter reaps at once).
            if self._conn is not None and select.select([self._conn], [], [], 5.0)[0]:
                said = self._conn.recv(MAX_MESSAGE)
                if said:
                    self.returncode = int(json.loads(said)["exit"])
                    self._close()
                    return True
                self._conn.close()  # the starter went before its child did: only the pidfd can tell now
                self._conn = None
            if select.select([self._pidfd], [], [], timeout)[0]:
                self.returncode = 1  # it ended, and nobody is left to say its code
                self._close()
                return True
            return False

    def _close(self) -> None:
        if self._conn is not None:
            with suppress(OSError):
                self._conn.close()
            self._conn = None
        if self._pidfd >= 0:
            with suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = -1

    def poll(self) -> int | None:
        self._ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with suppress(ProcessLookupError, OSError):  # a pidfd: never a pid the system gave someone else since
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"<WarmProcess pid={self.pid} returncode={self.returncode}>"


def _module_of(cmd_args: Sequence[str]) -> list[str] | None:
    """``[module, *args]`` of a ``python -m module args`` run by this very Python, else None."""
    if len(cmd_args) >= 3 and cmd_args[0] == sys.executable and cmd_args[1] == "-m":
        return list(cmd_args[2:])
    return None


def start(cmd_args: Sequence[str], *, env: dict[str, str] | None, stderr_fd: int, stdout_fd: int | None = None,
          cwd: str | None = None, new_session: bool = False) -> WarmProcess | None:
    """Have the starter run ``cmd_args``; None when there is none, or it refuses (the caller starts it fresh).

    Its stdin is a pipe (``.stdin``), its stdout one too (``.stdout``) unless ``stdout_fd`` is given, its
    stderr ``stderr_fd``; ``cwd`` its folder (default: ours); ``new_session``: a session and process group of
    its own (``setsid``), as ``Popen(start_new_session=True)`` makes.
    """
    path = os.environ.get(ENV)
    run = _module_of(cmd_args)
    if not path or path == "off" or run is None:  # STREAMLAB_WARM=off: every process fresh
        return None
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(path)
    except OSError:
        return None
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe() if stdout_fd is None else (None, stdout_fd)
    asked = {"run": run, "env": dict(os.environ if env is None else env), "cwd": cwd or os.getcwd(),
             "session": new_session}
    try:
        socket.send_fds(conn, [json.dumps(asked).encode()], [in_r, out_w, stderr_fd])
        said = json.loads(conn.recv(MAX_MESSAGE) or b'{"refused": "the starter closed"}')
    except (OSError, ValueError):
        said = {"refused": "the starter did not answer"}
    finally:
        os.close(in_r)
        if out_r is not None:
            os.close(out_w)
    if "pid" not in said:
        conn.close()
        os.close(in_w)
        if out_r is not None:
            os.close(out_r)
        return None
    stdout = os.fdopen(out_r, "rb") if out_r is not None else None
    return WarmProcess(cmd_args, conn, int(said["pid"]), os.fdopen(in_w, "wb"), stdout)


def ask_cpu(path: str | None = None) -> float:
    """CPU seconds of the starter at ``path`` (default ``$STREAMLAB_WARM``) and the children it reaped; 0 if none."""
    path = path or os.environ.get(ENV)
    if not path:
        return 0.0
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.settimeout(5.0)
            conn.connect(path)
            conn.send(b'{"cpu": true}')
            return float(json.loads(conn.recv(MAX_MESSAGE))["cpu"])
    except (OSError, ValueError, KeyError):
        return 0.0
