"""Chapter 10's third experiment: a client of the relay (``serve --upstream``) leaves; what does the upstream make?

Behind a relay, the reader's leaving reaches the model only if the relay
passes it on: it must notice its own client gone and close its connection
upstream. ``leave_through`` asks for a known number of tokens, reads a few
pieces and leaves, then reads the upstream's ``/log`` (or, for llama.cpp,
which keeps none, what the relay received and what its log says).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from streamlab.client import timed as client
from streamlab.lab.experiments.api_formats import OPENAI, ROUTES, request_body


async def _new_record(port: int, known: set[str], timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.perf_counter() + timeout
    while True:
        fresh = [r for r in await client.get_json(port, "/log") if r["id"] not in known]
        if fresh:
            return fresh[-1]
        if time.perf_counter() > deadline:
            raise TimeoutError(f"no new request in the /log of port {port}")
        await asyncio.sleep(0.05)


async def leave_through(
    path_label: str,
    port: int,
    *,
    tokens: int,
    leave_after: int,
    upstream_port: int | None = None,
    engine_log: Callable[[], str] | None = None,
    model: str = "default",
    timeout: float = 300.0,
) -> dict[str, Any]:
    """A client asks ``port`` for ``tokens`` tokens (``ignore_eos``) and leaves after ``leave_after`` pieces.

    ``port`` is a relay (or, for the baseline, the upstream itself). A
    streamlab upstream's ``/log`` (``upstream_port``) says how many tokens it
    generated and how it noticed; the relay's, how the relay noticed and what
    it stored. llama.cpp keeps no such record: for it the count is what the
    relay received from it, and its log (``engine_log``) says whether it saw
    the client go ("Disconnected from client").
    """
    body = request_body(OPENAI, tokens, model=model, ignore_eos=True)
    relayed = port != upstream_port
    known_up = {r["id"] for r in await client.get_json(upstream_port, "/log")} if upstream_port else set()
    known_here = {r["id"] for r in await client.get_json(port, "/log")} if relayed else set()
    log_before = len(engine_log()) if engine_log else 0
    trace = await client.post(port, ROUTES[OPENAI], body, stop_after=leave_after, timeout=timeout)
    left_at = time.time()
    row: dict[str, Any] = {"path": path_label, "asked for": tokens, "client read (pieces)": len(trace.text_events),
                           "relay noticed by": None, "relay stored as": None}
    here = None
    if relayed:
        here = await client.wait_log(port, (await _new_record(port, known_here))["id"], timeout=timeout)
        row.update({"relay noticed by": here["stop_signal"], "relay stored as": here["stored_reason"]})
    if upstream_port:
        up = await client.wait_log(upstream_port, (await _new_record(upstream_port, known_up))["id"], timeout=timeout)
        row.update({"upstream generated": up["tokens"], "upstream noticed by": up["stop_signal"],
                    "upstream had made when it noticed": up["tokens_at_stop"],
                    "upstream ran on after the client left (s)": round(max(0.0, up["ended"] - left_at), 2),
                    "counted from": "the upstream's /log"})
    else:
        assert here is not None and engine_log is not None
        await asyncio.sleep(0.5)  # time for the engine to notice and say so in its log
        said = engine_log()[log_before:]
        row.update({"upstream generated": here["tokens"],
                    "upstream noticed by": "disconnect" if "Disconnected from client" in said else None,
                    "upstream had made when it noticed": "not counted",
                    "upstream ran on after the client left (s)": round(max(0.0, here["ended"] - left_at), 2),
                    "counted from": "what the relay received (llama.cpp keeps no /log)"})
    return row


