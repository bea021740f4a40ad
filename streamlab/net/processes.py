"""Child processes, for every layer that starts one: a free port, the ready line, stopping, the open-files limit.

The lab starts our own programs (``python -m streamlab serve``, ``proxy``,
``platform``, ``worker``) and outside ones (redis-server, llama.cpp's server,
the rival servers); the hops start nginx; the server raises its own limit on
open files. What they share is here, once:

- ``find_program``: an installed program, on PATH or where Debian puts system programs (``/usr/sbin``);
- ``free_port``: a port that was free a moment ago (``--port 0`` is better where a program takes it);
- ``start_and_wait``: start a command and wait for its ready line (``READY_LINE``: the ``listening on URL``
  that ``serving.serve_until_signalled`` prints), its stdout drained for as long as it lives, its stderr in a log;
  forked by a warm starter (``streamlab.net.warm``) where one runs and the command may be, else started fresh;
- ``stop_process``: SIGTERM (and stdin EOF), wait, then SIGKILL, to the process or its whole group;
- ``die_with_parent``: a ``preexec_fn`` that has Linux stop the child when its parent dies;
- ``raise_open_files_limit``: every connection is a file descriptor, and the usual soft limit is 1,024.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from streamlab.net.warm import start as start_warm

__all__ = ["READY_LINE", "Started", "die_with_parent", "find_program", "free_port", "log_tail", "raise_open_files_limit",
           "start_and_wait", "stop_process"]

READY_LINE = re.compile(r"listening on (http://[^\s:/]+:(\d+))")


# Where system programs live that a user's PATH may leave out (/usr/sbin is on root's, not on everyone's).
SYSTEM_FOLDERS = ("/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin", "/sbin", "/bin")


def find_program(name: str, *also: str) -> str | None:
    """``name``'s executable: on PATH, else in :data:`SYSTEM_FOLDERS`, else at one of ``also``; None if nowhere."""
    found = shutil.which(name)
    if found:
        return found
    for candidate in (*(os.path.join(folder, name) for folder in SYSTEM_FOLDERS), *also):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (prefer ``--port 0`` where possible: no race)."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def die_with_parent() -> None:
    """A ``preexec_fn``: in the child, before exec, have Linux SIGTERM it when its parent dies, even by SIGKILL.

    ``PR_SET_PDEATHSIG``: a daemon we start (redis-server, llama.cpp's server)
    goes with a killed kernel instead of running on for nobody. Elsewhere it
    does nothing.
    """
    import ctypes

    with suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def raise_open_files_limit(needed: int | None = None) -> int:
    """Raise this process's soft limit on open files toward ``needed`` (default: the hard limit); return it.

    Every connection is a file descriptor, on both ends, and the usual soft
    limit (1,024) would refuse the thousand-and-first reader with ``EMFILE``
    long before a server's ``--max-connections``. The hard limit is as far
    as a process may go.
    """
    try:
        import resource
    except ImportError:  # not on this platform
        return needed or 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if needed is None else needed
    if want == resource.RLIM_INFINITY:
        want = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    return soft


def stop_process(process: subprocess.Popen, timeout: float = 10.0, *, group: bool = False) -> int | None:
    """Ask politely (SIGTERM and stdin EOF), wait ``timeout``, then insist (SIGKILL); return the exit code.

    ``group``: the SIGKILL goes to the process's whole group (one started with
    ``start_new_session=True``), so no child it left behind (nginx's workers)
    keeps its port.
    """
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    if process.stdin is not None:
        try:
            process.stdin.close()
        except OSError:
            pass
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        if group:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        return process.wait(timeout)


def wait_for_port(process: subprocess.Popen, port: int, timeout: float,
                  answers: Callable[[socket.socket], bool] | None = None) -> str | None:
    """Until something on 127.0.0.1:``port`` accepts a connection (and, with ``answers``, answers right).

    None once it does; else why not, ``"exited"`` (the process ended first)
    or ``"timeout"``: the caller says it in its own words, with its own log.
    For the programs that announce nothing on stdout (redis-server, nginx).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return "exited"
        with suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            if answers is None or answers(sock):
                return None
        time.sleep(0.02)
    return "timeout"


def log_tail(path: Path, last: int = 4000) -> str:
    """The last ``last`` bytes of a log file, as text ("" when there is none)."""
    try:
        return path.read_bytes()[-last:].decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass
class Started:
    """A command that printed its ready line: the process, the URL and port it named, what it has said so far."""

    process: subprocess.Popen
    url: str
    port: int
    stdout_lines: list[str]  # every line of its stdout, kept as it comes for as long as it lives
    log_path: Path  # its stderr


def _pump_stdout(process: subprocess.Popen, lines: list[str], found: queue.Queue, ready: re.Pattern) -> None:
    """Read the child's stdout for as long as it lives: report the ready line, keep the rest.

    Draining it matters even after readiness: a child whose stdout pipe fills
    up blocks on its next print.
    """
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        lines.append(line)
        match = ready.search(line)
        if match:
            found.put((match.group(1), int(match.group(2))))
    found.put(None)  # EOF: the process closed stdout, most likely by exiting


def start_and_wait(
    cmd_args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    name: str = "streamlab",
    ready: re.Pattern = READY_LINE,
    ready_timeout: float = 180.0,
    started: Callable[[subprocess.Popen], None] | None = None,
    warm: bool = False,
) -> Started:
    """Start ``cmd_args`` and wait for the line ``ready`` matches (its groups: a URL and its port).

    Its stdin is a pipe we hold open (a child that watches for EOF there goes
    when we do), its stderr a temporary log file (``Started.log_path``).
    ``started`` is called with the process as soon as it exists. ``warm``: a
    warm starter may fork it (``streamlab.net.warm``), where one runs. If the
    process exits or stays silent too long, it is stopped and the
    ``RuntimeError`` carries the tail of its stderr, which is where the reason is.
    """
    log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
    try:
        # Forked by a warm starter where asked, one runs and it may (streamlab.net.warm), else started fresh.
        process = (
            (start_warm(cmd_args, env=env, stderr_fd=log.fileno()) if warm else None)
            or subprocess.Popen(list(cmd_args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env))
    finally:
        log.close()
    if started is not None:
        started(process)
    lines: list[str] = []
    found: queue.Queue = queue.Queue()
    threading.Thread(target=_pump_stdout, args=(process, lines, found, ready), daemon=True).start()
    try:
        said = found.get(timeout=ready_timeout)
        why = "exited before it was ready" if said is None else ""
    except queue.Empty:
        said, why = None, f"was not listening after {ready_timeout:.0f} s"
    if said is None:
        code = stop_process(process)
        raise RuntimeError(
            f"{' '.join(cmd_args)} {why} (exit code {code}).\n"
            f"--- stderr (tail) ---\n{log_tail(Path(log.name), 4000)}"
        )
    url, port = said
    return Started(process, url, port, lines, Path(log.name))
