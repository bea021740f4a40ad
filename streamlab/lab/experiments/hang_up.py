"""A ``/complete`` reader who hangs up (chapter 5): what the server goes on making after the reader has left.

A ``/complete`` reader sees nothing before the end, so leaving "after N
pieces" is timed from the server's side, on its ``/log``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from streamlab.client import timed as client
from streamlab.client import wire


async def give_up_on_complete(port: int, body: dict[str, Any], after_tokens: int, *, timeout: float = 120.0,
                              wait: bool = True) -> dict[str, Any]:
    """Send ``POST /complete``, hang up once the server has made ``after_tokens`` tokens.

    A ``/complete`` reader sees nothing before the end, so "leaving after 10
    pieces" has to be timed from the server's side: we watch its ``/log`` for
    our request's token count, then close the socket. Returns the server's
    final record of the request (how many tokens it made in all); with
    ``wait=False``, its record as it was when we hung up (its ``id`` says
    which to ask ``/log`` about later, once a server that runs on has finished).
    """
    known = {r["id"] for r in await client.get_json(port, "/log")}
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(wire.post_request(port, "/complete", body))
    await writer.drain()
    deadline = time.perf_counter() + timeout
    mine: dict[str, Any] | None = None
    while time.perf_counter() < deadline:
        new = [r for r in await client.get_json(port, "/log") if r["id"] not in known]
        mine = new[0] if new else None
        if mine and (mine["tokens"] >= after_tokens or mine["done"]):
            break
        await asyncio.sleep(0.01)
    writer.close()
    if mine is None:
        raise TimeoutError("the server never logged the /complete request")
    return await client.wait_log(port, mine["id"], timeout) if wait else mine


give_up_on_complete_sync = client.sync_twin(give_up_on_complete)
