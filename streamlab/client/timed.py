"""A raw-socket client that times every byte and every event: the measuring instrument.

HTTP libraries are built to hide what we want to see: when each byte arrived,
how many bytes framed each piece of text, whether the stream ended with its
end marker or was simply cut. So this client writes its requests by hand,
reads with plain ``recv`` calls, and records what it reads into a ``Trace``
(``streamlab.client.tracing``, whose recorders parse with the same sans-IO modules the
server uses: ``http``, ``sse``, ``websocket``). Every ``recv`` and every
event is stamped with the time since the request was written.

Every request names the server as ``Host: 127.0.0.1:PORT`` (or whatever
``host`` it connected to) and every POST says ``Content-Type:
application/json``; no request sends an ``Origin`` unless asked to (only a
browser's page has one).

    trace = stream_sync(port, "Tell me about ferries", 30)
    trace.first_text, trace.end, trace.ratio

Each coroutine has a ``*_sync`` twin for scripts and notebooks.

This module holds the HTTP side (``/complete``, ``/stream``, the resumable
events, the small JSON requests) and the synchronous twins. The connecting,
reading and request writing it shares with the WebSocket side are in
``streamlab.client.wire``; the WebSocket itself is in
``streamlab.client.timed_websocket``. ``request_body``, ``post_request`` and
``websocket`` are re-exported here, so ``from streamlab.client import timed
as client`` reaches all of them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, TypeVar

from streamlab.net.aio import run_sync
from streamlab.protocol.http_body import IncompleteBody
from streamlab.client.timed_websocket import websocket
from streamlab.client.tracing import ResponseRecorder, Trace, last_id
from streamlab.client.wire import _close, _connect, _head, _host_header, _recv, post_request, request_body

__all__ = [
    "ClientError",
    "Reply",
    "cancel_generation",
    "cancel_generation_sync",
    "complete",
    "complete_sync",
    "create_generation",
    "create_generation_sync",
    "events",
    "events_sync",
    "fetch",
    "fetch_sync",
    "get_json",
    "get_json_sync",
    "post",
    "post_sync",
    "resume",
    "resume_sync",
    "stream",
    "stream_sync",
    "sync_twin",
    "wait_log",
    "wait_log_sync",
    "websocket_sync",
]


class ClientError(Exception):
    """A request answered with an error status."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


# --------------------------------------------------------------------------
# HTTP: /complete and /stream
# --------------------------------------------------------------------------


async def _read_response(
    reader: asyncio.StreamReader,
    reading: ResponseRecorder,
    trace: Trace,
    path: str,
    timeout: float,
    read_size: int,
    stop_after: int | None,
    leave_after: float | None = None,
    on_read: Callable[[], None] | None = None,
) -> None:
    """Read until the response is done, the reader leaves (after N events or S seconds), or EOF.

    ``on_read`` is called after each read is fed to the trace: a reader that acts
    mid-answer (presses stop on a connection of its own) and reads on.
    """
    deadline = trace.sent + timeout
    leave_at = trace.sent + leave_after if leave_after is not None else float("inf")
    while not reading.done:
        data = await _recv(reader, read_size, min(deadline, leave_at))
        if data is None:
            if time.perf_counter() >= leave_at:
                trace.left = True
                break
            raise TimeoutError(f"no complete response from {path} within {timeout} s")
        if not data:
            reading.eof()
            break
        reading.feed(data, trace.got_bytes(len(data)))
        if on_read is not None:
            on_read()
        if stop_after is not None and len(trace.text_events) >= stop_after and not reading.done:
            trace.left = True
            break


async def post(
    port: int,
    path: str,
    body: dict[str, Any],
    *,
    host: str = "127.0.0.1",
    stop_after: int | None = None,
    leave_after: float | None = None,
    timeout: float = 120.0,
    read_size: int = 65536,
    http10: bool = False,
    headers: list[tuple[str, str]] | None = None,
) -> Trace:
    """POST ``body`` as JSON and trace the response, whatever its kind.

    ``stop_after=N`` closes the socket after N text events and
    ``leave_after=S`` S seconds after sending: the reader walking away,
    which only the server's disconnect watch can notice. ``http10`` sends an
    HTTP/1.0 request, as nginx does to its upstreams by default.
    """
    trace = Trace(way=path.strip("/") or "post")
    reading = ResponseRecorder(trace)
    reader, writer = await _connect(host, port, timeout)
    try:
        trace.sent = time.perf_counter()
        writer.write(post_request(port, path, body, host=host, http10=http10, headers=headers))
        await writer.drain()
        await _read_response(reader, reading, trace, path, timeout, read_size, stop_after, leave_after)
    finally:
        await _close(writer)
    trace.finish()
    return trace


async def ask(
    port: int,
    path: str,
    prompt: str,
    max_tokens: int = 100,
    *,
    seed: int | None = None,
    chat: bool | None = None,
    ignore_eos: bool | None = None,
    extra: dict[str, Any] | None = None,
    **options: Any,
) -> Trace:
    """POST a generation request to ``path`` (``options`` go to ``post``)."""
    body = request_body(prompt, max_tokens, seed=seed, chat=chat, ignore_eos=ignore_eos, extra=extra)
    return await post(port, path, body, **options)


async def complete(port: int, prompt: str, max_tokens: int = 100, **kwargs: Any) -> Trace:
    """``POST /complete``: the whole answer in one body (keywords as for ``ask``)."""
    return await ask(port, "/complete", prompt, max_tokens, **kwargs)


async def stream(port: int, prompt: str, max_tokens: int = 100, **kwargs: Any) -> Trace:
    """``POST /stream``: one Server-Sent Event per piece (keywords as for ``ask``)."""
    return await ask(port, "/stream", prompt, max_tokens, **kwargs)


# --------------------------------------------------------------------------
# Resumable streams: GET /generations/{id}/events
# --------------------------------------------------------------------------


def _get_head(path: str, host: str, port: int, last_event_id: str | None) -> bytes:
    """The request a browser's ``EventSource`` sends (a reconnect adds ``Last-Event-ID``).

    The id goes out as UTF-8 bytes, as the HTML standard says (an id of
    ``…`` is three bytes on the wire; web-platform-tests' ``format-field-id``).
    An id can hold neither CR, LF nor NUL (an event stream cannot set
    one), so one that does is refused rather than written into the head;
    an empty one sends no header at all, as a browser does.
    """
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {_host_header(host, port)}",
        "Accept: text/event-stream",
        "Cache-Control: no-cache",
        "Connection: close",
    ]
    if last_event_id:
        if any(c in last_event_id for c in "\r\n\0"):
            raise ValueError("a Last-Event-ID cannot hold CR, LF or NUL")
        lines.append(f"Last-Event-ID: {last_event_id.encode('utf-8').decode('latin-1')}")
    return _head(lines)


async def events(
    port: int,
    path: str,
    *,
    last_event_id: str | int | None = None,
    stop_after: int | None = None,
    timeout: float = 120.0,
    host: str = "127.0.0.1",
    read_size: int = 65536,
    trace: Trace | None = None,
    drop_after: int | None = None,
) -> Trace:
    """``GET path`` as an ``EventSource`` would, and trace every event with its ``id``.

    ``trace``: a trace of the caller's own, filled as events arrive (to watch it meanwhile).

    ``last_event_id`` goes out as ``Last-Event-ID``: "I have everything up
    to that one". ``stop_after=N`` closes the connection after the read that
    brought the Nth text event; ``drop_after=N`` loses it right after the Nth
    itself, the rest of that read with it (``Trace.cut_after``).
    The trace is ``complete`` once the ``end`` event arrived. A ``204``
    (the server has nothing more for us) leaves ``status`` 204 and no events.
    """
    trace = trace if trace is not None else Trace(way="events")
    last = None if last_event_id is None else str(last_event_id)
    reading = ResponseRecorder(trace, "GET", last_event_id=last)  # the ids start from the one sent
    reader, writer = await _connect(host, port, timeout)
    try:
        trace.sent = time.perf_counter()
        writer.write(_get_head(path, host, port, last))
        await writer.drain()
        await _read_response(reader, reading, trace, path, timeout, read_size,
                             drop_after if drop_after is not None else stop_after)
    finally:
        await _close(writer)
    trace.way = "events"
    trace.complete = trace.complete or any(e.kind == "end" for e in trace.events)
    trace.finish()
    if drop_after is not None:
        trace.cut_after(drop_after)
    return trace


async def resume(
    port: int, generation_id: str, *, drop_after: int, timeout: float = 120.0, host: str = "127.0.0.1"
) -> tuple[Trace, Trace]:
    """A network blip, as an ``EventSource`` lives it: read, drop, reconnect with ``Last-Event-ID``.

    Reads the generation's events, drops the connection after
    ``drop_after`` text events, reconnects sending the last id it saw, and
    reads to the end. Returns both traces. From a server that keeps its events, the second
    starts right after the first, and their texts join into the whole
    answer; had the first ended before any id, the second starts over.
    """
    path = f"/generations/{generation_id}/events"
    first = await events(port, path, drop_after=drop_after, timeout=timeout, host=host)
    second = await events(port, path, last_event_id=last_id(first), timeout=timeout, host=host)
    return first, second


# --------------------------------------------------------------------------
# Small JSON requests: /health, /log, /generations
# --------------------------------------------------------------------------


@dataclass
class Reply:
    """A whole small response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def fetch(
    port: int,
    method: str,
    path: str,
    *,
    body: bytes | dict | None = None,
    headers: list[tuple[str, str]] | None = None,
    host: str = "127.0.0.1",
    timeout: float = 30.0,
) -> Reply:
    """One request, one whole response (any status): for small JSON endpoints and error cases.

    A ``body`` (a dict goes as JSON) is sent as ``Content-Type:
    application/json``. ``headers`` are added to the request; one that
    names a header this client writes itself (``Host``, ``Content-Type``,
    ``Connection``...) replaces it, so an error case can send a wrong one.
    """
    payload = json.dumps(body).encode("utf-8") if isinstance(body, dict) else (body or b"")
    ours = [("Host", _host_header(host, port)), ("Connection", "close")]
    if body is not None:
        ours += [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
    given = list(headers or [])
    replaced = {name.lower() for name, _ in given}
    fields = [(name, value) for name, value in ours if name.lower() not in replaced] + given
    lines = [f"{method} {path} HTTP/1.1"] + [f"{name}: {value}" for name, value in fields]
    reader, writer = await _connect(host, port, timeout)
    trace = Trace(way="fetch")
    reading = ResponseRecorder(trace, method)
    try:
        trace.sent = time.perf_counter()
        writer.write(_head(lines) + payload)
        await writer.drain()
        while not reading.done:
            data = await _recv(reader, 65536, trace.sent + timeout)
            if data is None:
                raise TimeoutError(f"no response to {method} {path} within {timeout} s")
            if not data:
                reading.eof()
                break
            reading.feed(data, trace.got_bytes(len(data)))
    finally:
        await _close(writer)
    if trace.status is None:
        raise ConnectionError(f"{method} {path}: connection closed without a response")
    if not reading.done:
        raise IncompleteBody(f"{method} {path}: response body cut short")
    return Reply(trace.status, trace.headers, bytes(reading.raw))


async def get_json(port: int, path: str, *, host: str = "127.0.0.1", timeout: float = 30.0) -> Any:
    """``GET path`` and decode its JSON; an error status raises ``ClientError``."""
    reply = await fetch(port, "GET", path, host=host, timeout=timeout)
    if reply.status >= 400:
        raise ClientError(reply.status, reply.body.decode("utf-8", "replace"))
    return reply.json()


async def create_generation(
    port: int, body: dict[str, Any], *, host: str = "127.0.0.1", timeout: float = 30.0
) -> dict[str, Any]:
    """``POST /generations``: start an answer; its ``id``, ``conversation_id``, ``message_id``, ``events``."""
    reply = await fetch(port, "POST", "/generations", body=body, host=host, timeout=timeout)
    if reply.status != 201:
        raise ClientError(reply.status, reply.body.decode("utf-8", "replace"))
    return reply.json()


async def cancel_generation(
    port: int, generation_id: str, *, host: str = "127.0.0.1", timeout: float = 30.0
) -> dict[str, Any]:
    """``POST /generations/{id}/cancel``: the stop button; returns ``{"id", "status"}`` once it stopped.

    The URL says it all, but the body is ``{}`` sent as JSON: the server
    refuses any POST that is not ``application/json``.
    """
    path = f"/generations/{generation_id}/cancel"
    reply = await fetch(port, "POST", path, body={}, host=host, timeout=timeout)
    if reply.status >= 400:
        raise ClientError(reply.status, reply.body.decode("utf-8", "replace"))
    return reply.json()


async def wait_log(
    port: int, request_id: str, timeout: float = 60.0, *, host: str = "127.0.0.1", interval: float = 0.05
) -> dict[str, Any]:
    """Poll ``/log/{id}`` until the server has finished with that request.

    The client's view ends when it stops reading; the server's (how many
    tokens it generated, how it noticed) may end a token or a whole answer
    later. This is how an experiment waits for it.
    """
    deadline = time.perf_counter() + timeout
    while True:
        record = await get_json(port, f"/log/{request_id}", host=host)
        if record.get("done"):
            return record
        if time.perf_counter() > deadline:
            raise TimeoutError(f"request {request_id} not done after {timeout} s: {record}")
        await asyncio.sleep(interval)


# --------------------------------------------------------------------------
# Synchronous twins
# --------------------------------------------------------------------------

T = TypeVar("T")


def sync_twin(coroutine_function: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """The same call, run to completion: a script and a notebook cell use it alike."""

    @functools.wraps(coroutine_function)
    def run(*args: Any, **kwargs: Any) -> T:
        return run_sync(coroutine_function(*args, **kwargs))

    name = coroutine_function.__name__
    run.__doc__ = f"Synchronous ``{name}``, for scripts and notebooks.\n\n{coroutine_function.__doc__}"
    return run


post_sync = sync_twin(post)
complete_sync = sync_twin(complete)
stream_sync = sync_twin(stream)
websocket_sync = sync_twin(websocket)
fetch_sync = sync_twin(fetch)
get_json_sync = sync_twin(get_json)
wait_log_sync = sync_twin(wait_log)
events_sync = sync_twin(events)
resume_sync = sync_twin(resume)
create_generation_sync = sync_twin(create_generation)
cancel_generation_sync = sync_twin(cancel_generation)
