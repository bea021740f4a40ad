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
from typing import Callable

__all__ = ["ClientGone", "on_stdin_eof", "serve_until_signalled"]


class ClientGone(Exception):
    """A write could not be completed: the client reset, closed, or stopped reading.

    ``signal`` is the stop vocabulary's name for how we found out
    (``streamlab.protocol.endings``: ``write_failed``, ``write_timeout``,
    ``eof``), so whoever catches it can log the reason, not just the fact.
    """

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.signal = signal


def on_stdin_eof(callback: Callable[[], None], loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Call ``callback`` on ``loop`` (the running one by default) when stdin closes.

    A parent that dies closes our stdin and takes us along. The wait is a
    daemon thread because no event loop reads a pipe portably (Windows'
    selector loop cannot), and stdin is rarely read by anything else.
    """
    loop = loop or asyncio.get_running_loop()

    def wait_for_eof() -> None:
        # os.read, not sys.stdin: a thread blocked inside the buffered reader
        # holds its lock, and the interpreter aborts on that lock at exit.
        # No stdin at all (closed: ValueError; None: AttributeError) reads as EOF, like /dev/null.
        with suppress(OSError, ValueError, AttributeError):
            while os.read(sys.stdin.fileno(), 4096):
                pass
        with suppress(RuntimeError):  # the loop may already be closed
            loop.call_soon_threadsafe(callback)

    threading.Thread(target=wait_for_eof, name="stdin-eof", daemon=True).start()


async def serve_until_signalled(url: str, *, exit_on_stdin_eof: bool = False) -> None:
    """Say where we listen, then wait for SIGINT, SIGTERM (or stdin EOF): the caller then shuts down.

    ``streamlab: listening on URL`` on stdout is the line the runner waits for.
    """
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    if exit_on_stdin_eof:
        on_stdin_eof(stopping.set, loop)
    print(f"streamlab: listening on {url}", flush=True)
    await stopping.wait()
