"""A real ``Server`` in this process, over a fake model: server behaviour tested in milliseconds.

The server runs on its own event loop in a thread, so the tests talk to it
exactly as outside clients do (raw sockets, httpx, websockets), on a free
port of 127.0.0.1, and it is always shut down on the way out.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from contextlib import contextmanager
from typing import Any, Iterator

try:
    from fakes import FakeLM
except ImportError:
    FakeLM = None

from streamlab.server import Server, ServerConfig


@contextmanager
def serving(lm: Any = None, **config: Any) -> Iterator[Server]:
    """``with serving(max_active=2) as server:`` a started server (``server.port``), stopped afterwards."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="inprocess-server", daemon=True)
    thread.start()
    folder = tempfile.mkdtemp(prefix="streamlab-inprocess-")
    config.setdefault("db_path", os.path.join(folder, "streamlab.db"))
    server = Server(lm if lm is not None else FakeLM(), ServerConfig(port=0, **config))
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
        server.loop = loop  # type: ignore[attr-defined]  # for tests that must run something on it
        yield server
    finally:
        if server._listener is not None:
            asyncio.run_coroutine_threadsafe(server.shutdown(), loop).result(20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def on_loop(server: Server, coroutine: Any, timeout: float = 10) -> Any:
    """Run a coroutine on the server's loop (to read its state safely) and return its result."""
    return asyncio.run_coroutine_threadsafe(coroutine, server.loop).result(timeout)  # type: ignore[attr-defined]
