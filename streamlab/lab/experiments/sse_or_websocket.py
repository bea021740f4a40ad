"""SSE or WebSocket, on evidence (chapter 6): through nginx, after a drop, and when the reader says stop.

Three experiments, each a function that runs against a live server and
returns plain rows:

- ``through_nginx``: the same small answer over ``/stream`` and over ``/ws``
  through real nginx, once with its default proxy settings for ``/ws`` and
  once with the three lines a WebSocket needs (``proxy_http_version 1.1``,
  ``proxy_set_header Upgrade $http_upgrade``, ``proxy_set_header Connection
  "upgrade"``). The status each client got and what it read.
- ``after_a_drop``: the connection is lost after a few pieces. The event
  stream's reader reconnects with ``Last-Event-ID``, as every ``EventSource``
  does by itself; the WebSocket's reader must have been written to reconnect
  (``websocket_reconnect``, the code it needs at the least) and, with nothing
  to resume from, asks again: the tokens generated in all say what each cost.
- ``stop_rounds``: a reader who stops mid-answer, each way: a stop message
  on the WebSocket; a cancel request beside a resumable event stream (which
  outlives its connection, so closing it cannot mean stop); closing a
  ``/stream`` connection. Time from the stop to the last piece the reader
  got and to the end of the answer, tokens generated after the stop.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from streamlab.client.timed import (
    _get_head,
    _read_response,
    cancel_generation,
    create_generation,
    post,
    resume,
    wait_log,
)
from streamlab.client.timed_websocket import websocket
from streamlab.client.tracing import ResponseRecorder, Trace
from streamlab.client.wire import _close, _connect
from streamlab.hops.nginx import run_nginx
from streamlab.net.aio import run_sync

__all__ = [
    "UPGRADE_LINES",
    "after_a_drop",
    "stop_rounds",
    "stop_summary",
    "through_nginx",
    "websocket_reconnect",
    "ws_location",
]

#: What a WebSocket behind nginx needs: HTTP/1.1 upstream (1.0, the default, has no Upgrade), and the two
#: hop-by-hop headers passed on by hand (nginx drops Upgrade and writes its own Connection otherwise).
UPGRADE_LINES = ('proxy_http_version 1.1;', 'proxy_set_header Upgrade $http_upgrade;',
                 'proxy_set_header Connection "upgrade";')


def ws_location(upstream_port: int, upgrade: bool) -> str:
    """An exact-match ``location = /ws`` (it wins over any prefix location): nginx's defaults, or with the upgrade."""
    lines = [f"proxy_pass http://127.0.0.1:{upstream_port};", *(UPGRADE_LINES if upgrade else ())]
    return "location = /ws {\n" + "".join(f"    {line}\n" for line in lines) + "}"


def _what_it_saw(trace: Trace) -> str:
    if trace.status == 101:
        state = "the done message" if trace.complete else "no done message"
        return f"101, {len(trace.text_events)} pieces and {state}"
    if trace.status == 200:
        return f"200, {len(trace.text_events)} events and {'[DONE]' if trace.complete else 'no [DONE]'}"
    error = trace.error if isinstance(trace.error, str) else (trace.error or {}).get("message", "")
    return f"{trace.status}: {error}" if error else f"{trace.status}"


async def _through_one(port: int, body: dict[str, Any]) -> tuple[Trace, Trace]:
    sse = await post(port, "/stream", body)
    extra = {k: v for k, v in body.items() if k not in ("prompt", "max_tokens")}
    ws_trace = await websocket(port, body["prompt"], body["max_tokens"], extra=extra)
    return sse, ws_trace


def through_nginx(upstream_port: int, body: dict[str, Any]) -> list[dict[str, Any]]:
    """``/stream`` and ``/ws`` through nginx, defaults then the upgrade lines: a row per setting."""
    rows = []
    for label, upgrade in (("defaults", False), ("defaults + the 3 upgrade lines", True)):
        with run_nginx(upstream_port, extra=ws_location(upstream_port, upgrade)) as ngx:
            sse, ws_trace = run_sync(_through_one(ngx.port, body))
        rows.append({
            "nginx for /ws": label,
            "event stream status": sse.status, "event stream complete": sse.complete,
            "event stream, the client saw": _what_it_saw(sse),
            "WebSocket status": ws_trace.status, "WebSocket complete": ws_trace.complete,
            "WebSocket, the client saw": _what_it_saw(ws_trace),
        })
    return rows


async def websocket_reconnect(port: int, prompt: str, max_tokens: int, *, drop_after: int | None = None,
                              retries: int = 3, **kwargs: Any) -> list[Trace]:
    """The reconnect a WebSocket client must write itself: each lost answer, then one asked for again.

    The protocol has no ``Last-Event-ID`` and the browser's ``WebSocket`` no
    ``retry``: noticing that the socket died before the ``done`` message,
    waiting, opening a new one and asking again are all the client's code.
    With nothing on the server to resume from, the new answer starts over.
    ``drop_after`` loses the first connection after that many pieces.
    """
    traces: list[Trace] = []
    for attempt in range(retries + 1):
        lose = drop_after if attempt == 0 else None
        trace = await websocket(port, prompt, max_tokens, drop_after=lose, **kwargs)
        traces.append(trace)
        if trace.complete:
            break
        await asyncio.sleep(0.1 * attempt)  # a back-off, which EventSource's retry: gives the other side for free
    return traces


async def _after_a_drop(port: int, body: dict[str, Any], drop_after: int) -> list[dict[str, Any]]:
    created = await create_generation(port, body)
    first, second = await resume(port, created["id"], drop_after=drop_after)
    kept = await _generation(port, created["id"])
    extra = {k: v for k, v in body.items() if k not in ("prompt", "max_tokens")}
    ws_traces = await websocket_reconnect(port, body["prompt"], body["max_tokens"], drop_after=drop_after, **extra)
    ws_tokens = 0
    for trace in ws_traces:
        ws_tokens += (await wait_log(port, trace.request_id))["tokens"]
    reconnects_sse = [first, second]
    return [
        {"way": "event stream (GET /generations/{id}/events)", "connections": len(reconnects_sse),
         "resumed with": f"Last-Event-ID: {first.events[-1].id if first.events else ''}",
         "pieces read in all": sum(len(t.text_events) for t in reconnects_sse),
         "text the reader put together": first.text + second.text, "whole answer": kept["text"],
         "tokens generated in all": kept["tokens"], "complete": second.complete},
        {"way": "WebSocket (/ws), its own reconnect", "connections": len(ws_traces), "resumed with": "nothing: asked again",
         "pieces read in all": sum(len(t.text_events) for t in ws_traces),
         "text the reader put together": "".join(t.text for t in ws_traces), "whole answer": ws_traces[-1].text,
         "tokens generated in all": ws_tokens, "complete": ws_traces[-1].complete},
    ]


async def _generation(port: int, generation_id: str) -> dict[str, Any]:
    from streamlab.client.timed import get_json

    deadline = time.perf_counter() + 60
    while True:
        state = await get_json(port, f"/generations/{generation_id}")
        if state["status"] not in ("queued", "running") or time.perf_counter() > deadline:
            return state
        await asyncio.sleep(0.05)


def after_a_drop(port: int, body: dict[str, Any], drop_after: int) -> list[dict[str, Any]]:
    """The connection lost after ``drop_after`` pieces, each way: a row each (see the module's docstring)."""
    return run_sync(_after_a_drop(port, body, drop_after))


# --------------------------------------------------------------------------
# Stopping mid-answer
# --------------------------------------------------------------------------


def _stop_row(way: str, trace: Trace, at_stop: float | None, record: dict[str, Any], seen: int,
              replied: float | None = None) -> dict[str, Any]:
    after = trace.text_events[seen:]
    return {
        "way": way,
        "stop to last piece (s)": (after[-1].t - at_stop) if after and at_stop is not None else 0.0,
        # A reader who closed the connection reads no end: it left, and only the server's log says what followed.
        "stop to end of answer (s)": (trace.end - at_stop) if trace.end is not None and at_stop is not None
        and not trace.left else None,
        "stop to cancel reply (s)": (replied - at_stop) if replied is not None and at_stop is not None else None,
        "pieces after the stop": len(after),
        "tokens generated after the stop": record["tokens"] - seen,
        # Of those, what the model had made by the time the stop reached the server (its lead over the reader,
        # and the stop's own way there), and what it made after: the server's promise is a token or two.
        "tokens when the server heard": record.get("tokens_at_stop"),
        "tokens after the server heard": None if record.get("tokens_at_stop") is None
        else record["tokens"] - record["tokens_at_stop"],
        "stop reason": record.get("stop_reason"),
        "noticed by": record.get("stop_signal"),
    }


async def _ws_stop(port: int, body: dict[str, Any], stop_after: int) -> dict[str, Any]:
    extra = {k: v for k, v in body.items() if k not in ("prompt", "max_tokens")}
    trace = await websocket(port, body["prompt"], body["max_tokens"], stop_after=stop_after, say_stop=True, extra=extra)
    record = await wait_log(port, trace.request_id)
    # The stop message is written in the same step that read the stop_after-th piece.
    at_stop = trace.text_events[stop_after - 1].t if len(trace.text_events) >= stop_after else None
    return _stop_row("WebSocket, stop message", trace, at_stop, record, stop_after)


async def _sse_cancel(port: int, body: dict[str, Any], stop_after: int, *, timeout: float = 60.0) -> dict[str, Any]:
    created = await create_generation(port, body)
    trace = Trace(way="events")
    reading = ResponseRecorder(trace, "GET")
    reader, writer = await _connect("127.0.0.1", port, timeout)
    cancelling: asyncio.Task | None = None
    at_stop = replied = None

    def press_stop() -> None:  # the stop button: a request of its own, on a new connection
        nonlocal cancelling, at_stop
        if cancelling is None and len(trace.text_events) >= stop_after:
            at_stop = trace.now()
            cancelling = asyncio.ensure_future(cancel_generation(port, created["id"]))

    try:
        trace.sent = time.perf_counter()
        writer.write(_get_head(created["events"], "127.0.0.1", port, None))
        await writer.drain()
        await _read_response(reader, reading, trace, created["events"], timeout, 65536, None, on_read=press_stop)
        if cancelling is not None:
            await cancelling
            replied = trace.now()
    finally:
        await _close(writer)
    trace.finish()
    record = await wait_log(port, trace.request_id)
    return _stop_row("event stream + cancel request", trace, at_stop, record, stop_after, replied)


async def _sse_close(port: int, body: dict[str, Any], stop_after: int) -> dict[str, Any]:
    trace = await post(port, "/stream", body, stop_after=stop_after)
    at_stop = trace.text_events[stop_after - 1].t if len(trace.text_events) >= stop_after else None
    record = await wait_log(port, trace.request_id)
    return _stop_row("/stream, close the connection", trace, at_stop, record, stop_after)


async def _stop_rounds(port: int, body: dict[str, Any], stop_after: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for number in range(rounds):
        # The ways take turns within a round, so a busy spell of the machine lands on each alike.
        for measure in (_ws_stop, _sse_cancel, _sse_close):
            row = await measure(port, body, stop_after)
            rows.append({"round": number + 1, **row})
    return rows


def stop_rounds(port: int, body: dict[str, Any], stop_after: int, rounds: int = 3) -> list[dict[str, Any]]:
    """A reader who stops after ``stop_after`` pieces, each way, ``rounds`` times: a row per way and round."""
    return run_sync(_stop_rounds(port, body, stop_after, rounds))


def stop_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per way: the median and the range over rounds of the stop's times, and the tokens made after it."""
    out = []
    for way in dict.fromkeys(row["way"] for row in rows):
        mine = [row for row in rows if row["way"] == way]
        summary: dict[str, Any] = {"way": way, "rounds": len(mine)}
        for column in ("stop to last piece (s)", "stop to end of answer (s)", "stop to cancel reply (s)"):
            values = [row[column] for row in mine if row[column] is not None]
            if values:
                summary[f"{column[:-4]}, median (s)"] = statistics.median(values)
                summary[f"{column[:-4]}, min (s)"] = min(values)
                summary[f"{column[:-4]}, max (s)"] = max(values)
        tokens = [row["tokens generated after the stop"] for row in mine]
        summary["tokens after the stop, median"] = statistics.median(tokens)
        summary["tokens after the stop, max"] = max(tokens)
        heard = [row["tokens after the server heard"] for row in mine if row["tokens after the server heard"] is not None]
        summary["tokens after the server heard, max"] = max(heard) if heard else None
        summary["noticed by"] = ", ".join(sorted({str(row["noticed by"]) for row in mine}))
        out.append(summary)
    return out
