"""The warm starter's side (``python -m streamlab.lab.setups.warm_starter``): import once, then fork on request.

What it is for, and the asker's side of the protocol: ``streamlab.net.warm``. This
process is single-threaded on purpose (a fork copies only the thread that calls
it): one selector over the socket, the askers, stdin (its end: whoever started
it is gone, and it goes) and a wake-up pipe that SIGCHLD writes to, so that
each ended child is reaped at once and its asker told its exit code.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import traceback
from contextlib import suppress
from typing import Any, Sequence

from streamlab.net.warm import MAX_MESSAGE, env_difference

__all__ = ["Starter", "main"]


class Starter:
    """The forking loop: one thread, a selector over the socket, the askers, stdin and a wake-up pipe for SIGCHLD."""

    def __init__(self, path: str, modules: Sequence[str], own_env: dict[str, str]) -> None:
        self.modules = set(modules)
        self.own_env = own_env
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(128)
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.children: dict[int, socket.socket | None] = {}
        self.askers: set[socket.socket] = set()
        self.reaped_cpu = 0.0
        self.counts = {"warm": 0, "refused": 0}

    def serve(self) -> int:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped: the count below is still said
        try:
            return self._loop()
        finally:
            print(f"streamlab warm starter: {self.counts['warm']} forked, {self.counts['refused']} started fresh",
                  file=sys.stderr, flush=True)

    def _loop(self) -> int:
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "reap")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    with suppress(OSError):
                        conn, _ = self.listener.accept()
                        self.askers.add(conn)
                        self.selector.register(conn, selectors.EVENT_READ, "asker")
                elif key.data == "reap":
                    with suppress(OSError):
                        os.read(self.wake_r, 4096)
                    self.reap()
                elif key.data == "stdin":
                    if not os.read(sys.stdin.fileno(), 4096):  # whoever started us is gone
                        return 0
                else:
                    self.answer(key.fileobj)  # type: ignore[arg-type]

    def drop(self, conn: socket.socket) -> None:
        with suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        self.askers.discard(conn)
        conn.close()

    def answer(self, conn: socket.socket) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            self.drop(conn)  # the asker went; its child (if any) lives on, reaped below
            for pid, owner in self.children.items():
                if owner is conn:
                    self.children[pid] = None
            return
        try:
            asked = json.loads(data)
            if asked.get("cpu"):
                conn.send(json.dumps({"cpu": self.cpu()}).encode())
                return
            why = self.refusal(asked, fds)
            if why:
                self.counts["refused"] += 1
                print(f"streamlab warm starter: started fresh instead: {why}", file=sys.stderr, flush=True)
                conn.send(json.dumps({"refused": why}).encode())
                return
            pid = os.fork()
            if pid == 0:
                self.become(asked, fds, conn)  # never returns
            self.counts["warm"] += 1
            self.children[pid] = conn
            self.selector.unregister(conn)  # nothing more to read from it: it waits for our word
            conn.send(json.dumps({"pid": pid}).encode())
        except (OSError, ValueError) as exc:
            with suppress(OSError):
                conn.send(json.dumps({"refused": f"{type(exc).__name__}: {exc}"}).encode())
        finally:
            for fd in fds:
                with suppress(OSError):
                    os.close(fd)

    def refusal(self, asked: dict[str, Any], fds: list[int]) -> str | None:
        run, env = asked.get("run") or [], asked.get("env") or {}
        if len(fds) != 3:
            return "no stdin, stdout and stderr came with the request"
        if not run or run[0] not in self.modules:
            return f"module {run[0] if run else None!r} is not one this starter preloaded"
        differs = env_difference(env, self.own_env)
        return f"the starter's environment differs in {differs}" if differs else None

    def reap(self) -> None:
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reaped_cpu += usage.ru_utime + usage.ru_stime
            conn = self.children.pop(pid, None)
            if conn is not None:
                with suppress(OSError):
                    conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                self.askers.discard(conn)
                conn.close()

    def cpu(self) -> float:
        import resource

        own = resource.getrusage(resource.RUSAGE_SELF)
        return self.reaped_cpu + own.ru_utime + own.ru_stime

    def become(self, asked: dict[str, Any], fds: list[int], conn: socket.socket) -> None:
        """In the forked child: drop the starter's state, take the asker's streams, folder and env, run the module."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.selector.close()
            for sock in (self.listener, conn, *self.askers, *(c for c in self.children.values() if c)):
                with suppress(OSError):
                    sock.close()
            for fd in (self.wake_r, self.wake_w):
                with suppress(OSError):
                    os.close(fd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            if asked.get("session"):
                os.setsid()  # a process group of its own: what signals its group reaches only it and its children
            os.chdir(asked.get("cwd") or "/")
            os.environ.clear()
            os.environ.update(asked["env"])
            _fresh_stdio(unbuffered=bool(os.environ.get("PYTHONUNBUFFERED")))
            module, *args = asked["run"]
            sys.argv = [module, *args]
            _name_process(" ".join([module, *args[:1]]))
            code = _run_module(module)
        except BaseException:  # noqa: BLE001 - whatever happened, the child must not return into the starter
            with suppress(Exception):
                traceback.print_exc()
        finally:
            os._exit(code)


def _fresh_stdio(*, unbuffered: bool) -> None:
    """Standard streams on the file descriptors the asker sent, buffered as a fresh Python's would be."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.open(0, "rb", closefd=False), encoding="utf-8",
                                                 errors="strict")
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
        stream = io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace" if fd == 2 else "strict",
                                  line_buffering=fd == 2 and not unbuffered, write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _name_process(name: str) -> None:
    """What ``ps -o comm`` and ``top`` show for the child (15 bytes): its command, not the starter's."""
    import ctypes

    with suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(15, name.replace("streamlab", "sl").encode()[:15], 0, 0, 0)


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_module(module: str) -> int:
    """``python -m module``'s life in this process: run it, then what the interpreter does on its way out."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would
        traceback.print_exc()
        code = 1
    with suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads finish, as at a normal exit
    with suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    return code


def _preload(spec: str) -> None:
    """``module`` or ``module:function``: import it (and call the function), before any child is forked."""
    module, _, function = spec.partition(":")
    loaded = importlib.import_module(module)
    if function:
        getattr(loaded, function)()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamlab.lab.setups.warm_starter", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on (a path that does not exist)")
    parser.add_argument("--preload", action="append", default=[], metavar="MODULE[:FUNCTION]",
                        help="import this (and call the function) once, before any fork; repeatable")
    parser.add_argument("--module", action="append", default=[], metavar="NAME",
                        help="a module children may run as python -m NAME (default: streamlab)")
    args = parser.parse_args(argv)
    own_env = dict(os.environ)  # before anything is imported: what the children's env is compared with
    for spec in args.preload:
        _preload(spec)
    # What is imported now stays as it is in every child: out of the collector's sight, a child's collections do
    # not walk (and copy, page by page, on writing their counts) the starter's objects.
    gc.freeze()
    starter = Starter(args.socket, args.module or ["streamlab"], own_env)
    print(f"streamlab warm starter: ready on {args.socket} (pid {os.getpid()})", flush=True)
    return starter.serve()


if __name__ == "__main__":
    sys.exit(main())
