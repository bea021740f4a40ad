"""How a program that serves runs until it is told to stop, and how a write tells it the peer is gone.

The model server, the proxy and the rival servers are each started as a
child process by the runner, a test or a notebook, which waits for their
``listening on`` line and later sends SIGTERM. A parent that dies sends
nothing: it only closes the child's stdin, so ``--exit-on-stdin-eof``
watches for that, once, here, for all of them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from contextlib import suppress
from typing import Awaitable, Callable, Sequence

__all__ = ["STOP_LISTENER", "ClientGone", "on_stdin_eof", "serve_until_signalled"]


class ClientGone(Exception):
    """A write could not be completed: the client reset, closed, or stopped reading.

    ``signal`` is the stop vocabulary's name for how we found out
    (``streamlab.protocol.endings``: ``write_failed``, ``write_timeout``,
    ``eof``), so whoever catches it can log the reason, not just the fact.
    """

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.signal = signal


def on_stdin_eof(callback: Callable[[], None], loop: asyncio.AbstractEventLoop | None = None,
                 on_line: Callable[[str], None] | None = None) -> None:
    """Call ``callback`` on ``loop`` (the running one by default) when stdin closes.

    A parent that dies closes our stdin and takes us along. The wait is a
    daemon thread because no event loop reads a pipe portably (Windows'
    selector loop cannot), and stdin is rarely read by anything else.
    ``on_line``, if given, is called on the loop with each line read before
    then (a parent's word to a process that serves several listeners).
    """
    loop = loop or asyncio.get_running_loop()

    def call(function: Callable[..., None], *args: str) -> None:
        with suppress(RuntimeError):  # the loop may already be closed
            loop.call_soon_threadsafe(function, *args)

    def wait_for_eof() -> None:
        # os.read, not sys.stdin: a thread blocked inside the buffered reader
        # holds its lock, and the interpreter aborts on that lock at exit.
        # No stdin at all (closed: ValueError; None: AttributeError) reads as EOF, like /dev/null.
        pending = b""
        with suppress(OSError, ValueError, AttributeError):
            while chunk := os.read(sys.stdin.fileno(), 4096):
                if on_line is None:
                    continue
                *lines, pending = (pending + chunk).split(b"\n")
                pending = pending[-4096:]  # a word is a short line: no parent's stream of bytes piles up here
                for line in lines:
                    call(on_line, line.decode("utf-8", "replace").strip())
        call(callback)

    threading.Thread(target=wait_for_eof, name="stdin-eof", daemon=True).start()


STOP_LISTENER = "stop"  # ``stop PORT`` on stdin: a process serving several listeners closes that one


async def serve_until_signalled(url: str | Sequence[str], *, exit_on_stdin_eof: bool = False,
                                stop_one: Callable[[int], Awaitable[bool]] | None = None) -> None:
    """Say where we listen, then wait for SIGINT, SIGTERM (or stdin EOF): the caller then shuts down.

    ``streamlab: listening on URL`` on stdout, one line per listener in the
    order given, is what the runner waits for. With ``stop_one``, a line
    ``stop PORT`` on stdin closes that one listener (``stop_one(port)``:
    False when none listens there), answered ``streamlab: stopped PORT``
    (or ``streamlab: no listener on PORT``) on stdout.
    """
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    stops: set[asyncio.Task] = set()

    async def stop(port: int) -> None:
        said = "stopped" if stop_one is not None and await stop_one(port) else "no listener on"
        print(f"streamlab: {said} {port}", flush=True)

    def told(line: str) -> None:
        word, _, port = line.partition(" ")
        if word == STOP_LISTENER and port.isdigit():
            task = loop.create_task(stop(int(port)))
            stops.add(task)
            task.add_done_callback(stops.discard)

    if exit_on_stdin_eof:
        on_stdin_eof(stopping.set, loop, on_line=told if stop_one is not None else None)
    for each in [url] if isinstance(url, str) else url:
        print(f"streamlab: listening on {each}", flush=True)
    await stopping.wait()
    for task in list(stops):
        with suppress(asyncio.CancelledError, Exception):
            await task
