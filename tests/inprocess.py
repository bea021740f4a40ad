"""A real ``Server`` in this process, over a fake model: server behaviour tested in milliseconds.

The server runs on its own event loop in a thread, so the tests talk to it
exactly as outside clients do (raw sockets, httpx, websockets), on a free
port of 127.0.0.1, and it is always shut down on the way out.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any, Iterator

try:
    from fakes import FakeLM
except ImportError:
    FakeLM = None

from streamlab.lab.setups.runner import serve_in_process
from streamlab.server.app import Server


@contextmanager
def serving(lm: Any = None, **config: Any) -> Iterator[Server]:
    """``with serving(max_active=2) as server:`` a started server (``server.port``), stopped afterwards."""
    with serve_in_process(lm if lm is not None else FakeLM(), **config) as server:
        yield server


def on_loop(server: Server, coroutine: Any, timeout: float = 10) -> Any:
    """Run a coroutine on the server's loop (to read its state safely) and return its result."""
    assert server.loop is not None, "the server has not been started"
    return asyncio.run_coroutine_threadsafe(coroutine, server.loop).result(timeout)


def generation_done(port: int, generation_id: str, timeout: float = 10.0) -> dict:
    """Poll ``GET /generations/{id}`` until its status is ``done``; that state (an AssertionError past ``timeout``)."""
    import time

    from streamlab.client import timed

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = asyncio.run(timed.get_json(port, f"/generations/{generation_id}"))
        if state["status"] == "done":
            return state
        time.sleep(0.05)
    raise AssertionError(f"generation {generation_id} did not end within {timeout} s")
