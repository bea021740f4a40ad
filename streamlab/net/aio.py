"""Run the library's coroutines from scripts and notebooks alike.

Jupyter already runs an event loop, where a plain ``asyncio.run`` refuses to
start; ``nest_asyncio`` lets it nest, so every ``foo_sync`` wrapper works the
same in a script, a test and a notebook cell.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` that also works inside an already-running loop (Jupyter)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import nest_asyncio

    nest_asyncio.apply()
    return asyncio.get_event_loop().run_until_complete(coro)
