"""A generation that another server makes: stream an OpenAI-compatible upstream, as a drop-in for ``Generation``.

``UpstreamGeneration`` POSTs the request to ``{base_url}/v1/chat/completions``
with ``"stream": true`` and reads the SSE answer as it arrives, one ``Piece``
per chunk whose ``choices[0].delta.content`` is not empty. It runs as a task on
the event loop (the waiting is network I/O, not computation), over the
project's own sans-IO parsers: ``FinalResponseParser``, ``BodyReader``
(chunked, Content-Length or close-delimited) and ``EventStreamParser``.

The abort is propagated: ``stop()`` aborts the connection at once, so the
upstream reads EOF (or a reset) and, if it watches its socket (vLLM, llama.cpp's
server and streamlab do), stops generating for a reader who is gone. A stream that
ends before its ``finish_reason`` or ``[DONE]`` is an error, never a short answer.

A failure here is the upstream's, not ours, and the status our reader gets
says so, as a gateway's does (nginx's): ``gateway_status`` is 504 when the
upstream did not answer in time, 502 when it could not be reached or broke
its answer, and the upstream's own status when it refused the request itself
(a 4xx other than an authentication failure, which is the relay's
configuration, not the reader's request).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Iterable, Mapping
from typing import Any, Callable
from urllib.parse import urlsplit

from streamlab.protocol import endings as stops
from streamlab.model.lifecycle import GenerationResult, Piece
from streamlab.model.generation import PieceQueue, PieceStream
from streamlab.protocol.http_body import BodyReader, IncompleteBody
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import FinalResponseParser
from streamlab.protocol.http_fields import list_tokens
from streamlab.protocol.sse import DONE, EventStreamParser, ProtocolError
from streamlab.protocol.endings import EOS, ERROR, MAX_TOKENS, STOPPED

STOP_SEQUENCE = getattr(stops, "STOP_SEQUENCE", "stop_sequence")
READ_SIZE = 65536
MAX_ERROR_BODY = 65536  # what is read of a non-2xx answer to find its message
AFTER_FINISH_TIMEOUT = 5.0  # after finish_reason, how long to wait for the usage chunk and [DONE]
# The upstream's finish_reason, as our stop reason; any other value is an error.
FINISH_REASONS = {"stop": EOS, "length": MAX_TOKENS, "tool_calls": EOS, "function_call": EOS}


BAD_GATEWAY, GATEWAY_TIMEOUT = 502, 504
# An upstream's refusal that is the relay's doing (its key, its proxy), not the reader's request: a 502 for them.
RELAY_FAULTS = {401, 403, 407}


class UpstreamError(Exception):
    """Why an upstream exchange failed, worded for the result's ``error``; ``status``: what our reader is told."""

    def __init__(self, message: str, status: int = BAD_GATEWAY) -> None:
        super().__init__(message)
        self.status = status


def status_for(upstream_status: int) -> int:
    """What our reader is told when the upstream answered ``upstream_status``: its 4xx, else 502."""
    return upstream_status if 400 <= upstream_status < 500 and upstream_status not in RELAY_FAULTS else BAD_GATEWAY


class _Stopped(Exception):
    """stop() was called: end as STOPPED."""


def chat_completions_url(base_url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, path)`` for ``http://host:port``, with or without a trailing ``/v1``."""
    parts = urlsplit(base_url if "//" in base_url else "http://" + base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {base_url!r}")
    path = parts.path.rstrip("/")
    path = (path if path.endswith("/v1") else path + "/v1") + "/chat/completions"
    return parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), path


def _error_message(data: bytes | str) -> str:
    """The message in an error body: OpenAI's ``{"error": {"message"}}``, vLLM's, FastAPI's, or the text."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:500] or "(empty body)"
    if isinstance(obj, dict):
        inner = obj.get("error", obj)
        if isinstance(inner, dict):
            for key in ("message", "detail", "error"):
                if inner.get(key):
                    return str(inner[key])[:500]
        elif inner:
            return str(inner)[:500]
    return text.strip()[:500]


class UpstreamGeneration(PieceStream):
    """One answer streamed from an OpenAI-compatible server, with ``Generation``'s interface.

    Besides it: ``finish_reason`` (the upstream's raw value), ``upstream_status``
    (the status it answered, None before or without an answer), ``usage`` (its
    last usage object), ``closed_upstream_at`` (``perf_counter`` time at which
    ``stop()`` closed the connection before the stream ended), ``url``, and
    ``gateway_status`` (what a reader should be told of a failure that was the
    upstream's: 502, 504 or its own 4xx; None while it runs, after a success,
    a stop, or a failure of our own).
    """

    relayed = True

    def __init__(
        self,
        base_url: str,
        body: dict,
        *,
        on_token: Callable[[int], None] | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 300.0,
        api_key: str | None = None,
        headers: Iterable[tuple[str, str]] | Mapping[str, str] = (),
    ) -> None:
        self.scheme, self.host, self.port, self.path = chat_completions_url(base_url)
        self.url = f"{self.scheme}://{self.host}:{self.port}{self.path}"
        self.body = {**body, "stream": True, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
        self.on_token = on_token
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.api_key = api_key
        self.extra_headers = list(headers.items() if isinstance(headers, Mapping) else headers)
        for name, value in self.extra_headers:
            if any(c in f"{name}{value}" for c in "\r\n\0") or ":" in name:
                raise ValueError(f"invalid header {name!r}")
        self.tokens = 0
        self.prompt_tokens_read = 0
        self.stopped_by: str | None = None
        self.result: GenerationResult | None = None
        self.finish_reason: str | None = None
        self.upstream_status: int | None = None
        self.gateway_status: int | None = None
        self.usage: dict | None = None
        self.closed_upstream_at: float | None = None
        self.done: asyncio.Event | None = None
        self._answered: asyncio.Event | None = None  # set once the upstream's 2xx head is in
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._queue: PieceQueue | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ended = False  # the stream reached its end ([DONE], end of body): closing it is not early
        self._texts: list[str] = []
        self._times: list[float] = []
        self._stop_string: Any = None  # vLLM's choices[0].stop_reason: the stop string that matched

    # -- control: the interface of Generation ----------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> "UpstreamGeneration":
        if self._task is not None:
            return self
        self._loop = loop or asyncio.get_running_loop()
        self._queue, self.done, self._stop_event = PieceQueue(), asyncio.Event(), asyncio.Event()
        self._answered = asyncio.Event()
        self._task = self._loop.create_task(self._run())
        return self

    def stop(self, source: str = "stopped") -> None:
        """Stop reading and close the upstream connection at once (safe to repeat, and from any thread)."""
        self._stop_on_loop(source, self._abort)  # not started yet: the task will see the flag before it connects

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def answered(self) -> None:
        """Wait until the upstream has sent a 2xx head, or the exchange is over (failed or stopped).

        A relay opens its own stream only then, so that an upstream that is
        down, or refuses, can still be told with a status of its own (502,
        504...) rather than as an error inside a 200 stream.
        """
        assert self.done is not None and self._answered is not None, "start() first"
        if self.done.is_set() or self._answered.is_set():
            return
        waits = [asyncio.ensure_future(self.done.wait()), asyncio.ensure_future(self._answered.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _abort(self) -> None:
        assert self._stop_event is not None
        self._stop_event.set()
        if self._writer is not None and not self._ended and not self._writer.transport.is_closing():
            self._writer.transport.abort()  # no FIN handshake, no wait: the upstream sees the end now
            self.closed_upstream_at = time.perf_counter()

    # -- the task --------------------------------------------------------------
    async def _run(self) -> None:
        started = time.perf_counter()
        reason, error, status = ERROR, None, None
        try:
            reason = await self._exchange()
        except _Stopped:
            # Stopped after the upstream said how the answer ended (waiting for usage, [DONE]): that ending stands.
            reason = FINISH_REASONS.get(self.finish_reason or "", STOPPED)
        except asyncio.CancelledError:
            reason, error = STOPPED, "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - any failure ends the stream with a reason
            if self._stopping:
                reason = STOPPED
            elif isinstance(exc, UpstreamError):
                error, status = str(exc), exc.status
            elif isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                error = f"upstream {self.url} timed out: nothing came for {self.read_timeout:g} s"
                status = GATEWAY_TIMEOUT
            elif isinstance(exc, HTTPError):
                error, status = f"malformed answer from upstream {self.url}: {exc.message}", BAD_GATEWAY
            elif isinstance(exc, OSError):
                error, status = f"upstream {self.url} failed: {type(exc).__name__}: {exc}", BAD_GATEWAY
            else:
                error = f"{type(exc).__name__}: {exc}"
        finally:
            if self._stopping:
                self._abort()  # closed_upstream_at, unless the stream had ended
            elif self._writer is not None:
                self._writer.close()  # FIN: after an error or a timeout, the upstream stops too
            self.gateway_status = status if reason == ERROR else None
            self._finish(reason, error, started)

    def _finish(self, reason: str, error: str | None, started: float) -> None:
        usage = self.usage or {}
        if reason not in (STOPPED, ERROR) and isinstance(usage.get("completion_tokens"), int):
            if usage["completion_tokens"] != self.tokens and self.on_token is not None:
                self.on_token(usage["completion_tokens"])
            self.tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens_read = usage["prompt_tokens"]
        self.result = GenerationResult(
            tokens=self.tokens, stop_reason=reason, text="".join(self._texts), error=error,
            prompt_tokens=self.prompt_tokens_read, token_times=self._times, started=started, ended=time.perf_counter(),
        )
        assert self._queue is not None and self.done is not None
        self._queue.put_nowait(None)
        self.done.set()

    def _request(self) -> bytes:
        payload = json.dumps(self.body, ensure_ascii=False).encode("utf-8")
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        lines = [
            f"POST {self.path} HTTP/1.1", f"Host: {host}" + ("" if self.port == default else f":{self.port}"),
            "Content-Type: application/json", "Accept: text/event-stream", "Accept-Encoding: identity",
            f"Content-Length: {len(payload)}", "Connection: close", "User-Agent: streamlab",
        ]
        if self.api_key:
            lines.append(f"Authorization: Bearer {self.api_key}")
        lines += [f"{name}: {value}" for name, value in self.extra_headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload

    async def _connect(self) -> None:
        """Open the connection, racing stop() and the connect timeout."""
        assert self._stop_event is not None
        tls = ssl.create_default_context() if self.scheme == "https" else None
        connecting = asyncio.ensure_future(asyncio.open_connection(self.host, self.port, ssl=tls))
        stopped = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({connecting, stopped}, timeout=self.connect_timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not connecting.done():
                connecting.cancel()
        try:
            self._reader, self._writer = await connecting  # done, or cancelled just above
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and getattr(task, "cancelling", lambda: 0)():
                raise  # our own task is being cancelled, not only the connect
            if self._stopping:
                raise _Stopped from None
            raise UpstreamError(f"could not connect to upstream {self.url} within {self.connect_timeout:g} s",
                                GATEWAY_TIMEOUT) from None
        except OSError as exc:
            if self._stopping:
                raise _Stopped from None
            raise UpstreamError(f"could not connect to upstream {self.url}: {exc.strerror or exc}") from None
        if self._stopping:
            raise _Stopped  # stopped as it connected: the finally of _run closes it

    async def _read(self, timeout: float | None = None) -> bytes:
        assert self._reader is not None
        try:
            data = await asyncio.wait_for(self._reader.read(READ_SIZE), timeout or self.read_timeout)
        except ConnectionError:
            data = b""  # a reset reads as an early end
        if self._stopping:
            raise _Stopped
        return data

    async def _exchange(self) -> str:
        if self._stopping:
            raise _Stopped
        await self._connect()
        assert self._writer is not None
        self._writer.write(self._request())
        await asyncio.wait_for(self._writer.drain(), self.connect_timeout)
        parser = FinalResponseParser()
        response = None
        while response is None:
            data = await self._read()
            if not data:
                raise UpstreamError(f"upstream {self.url} closed the connection without an answer")
            response = parser.feed(data)
        self.upstream_status = response.status
        if 200 <= response.status < 300:
            assert self._answered is not None
            self._answered.set()
        body = BodyReader(response, "POST")
        first = parser.rest
        if not 200 <= response.status < 300:
            raw = b"".join(body.feed(first))
            while not body.done and len(raw) < MAX_ERROR_BODY and (data := await self._read()):
                raw += b"".join(body.feed(data))
            status = f"{response.status} {response.reason}".strip()
            raise UpstreamError(f"upstream answered {status}: {_error_message(raw)}", status_for(response.status))
        coding = [c for c in list_tokens(response.header("content-encoding")) if c != "identity"]
        if coding:
            raise UpstreamError(f"upstream answered with Content-Encoding {', '.join(coding)}, which we did not ask for")
        media = (response.header("content-type") or "").split(";")[0].strip().lower()
        if media == "application/json":
            raise UpstreamError(f"upstream answered {response.status} with application/json, not an event stream")
        events = EventStreamParser()
        data = first
        while True:
            try:
                for event in events.feed(b"".join(body.feed(data))):
                    # Backpressure: while our reader is max_queued pieces behind, read no further;
                    # the upstream's socket buffers fill and its own writes wait.
                    await self._room()
                    if self._event(event):
                        self._ended = True
                        return self._reason()
            except ProtocolError as exc:
                raise UpstreamError(f"upstream event stream broken: {exc}") from None
            if body.done:
                break
            try:
                data = await self._read(min(AFTER_FINISH_TIMEOUT, self.read_timeout) if self.finish_reason else None)
            except asyncio.TimeoutError:
                if self.finish_reason:
                    break  # it said how the answer ended: the usage chunk and [DONE] are extras
                raise
            if not data:
                break
        self._ended = True
        cut = ""
        try:
            body.eof()
        except IncompleteBody as exc:
            cut = f" ({exc})"
        if self.finish_reason is None:
            raise UpstreamError(f"the upstream stream ended without finish_reason or [DONE]{cut}")
        return self._reason()

    def _reason(self) -> str:
        if self.finish_reason is None:
            raise UpstreamError("the upstream sent [DONE] without a finish_reason")
        reason = FINISH_REASONS.get(self.finish_reason)
        if reason is None:
            raise UpstreamError(f"the upstream ended with finish_reason {self.finish_reason!r}")
        if reason == EOS and isinstance(self._stop_string, str):
            return STOP_SEQUENCE  # vLLM names the stop string that matched; others cannot tell it from EOS
        return reason

    def _event(self, event: Any) -> bool:
        """Handle one SSE event; True at ``[DONE]``."""
        if event.data.strip() == DONE:
            return True
        if event.event == "error":
            raise UpstreamError(f"upstream error: {_error_message(event.data)}")
        try:
            chunk = json.loads(event.data)
        except ValueError:
            raise UpstreamError(f"upstream sent an event that is not JSON: {event.data[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise UpstreamError(f"upstream sent an event that is not a JSON object: {event.data[:200]!r}")
        if chunk.get("error"):
            raise UpstreamError(f"upstream error: {_error_message(event.data)}")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
            if isinstance(self.usage.get("prompt_tokens"), int):
                self.prompt_tokens_read = self.usage["prompt_tokens"]
        choices = [c for c in chunk.get("choices") or () if isinstance(c, dict) and c.get("index", 0) == 0]
        if not choices:
            return False
        choice = choices[0]
        content = (choice.get("delta") or {}).get("content")
        if isinstance(content, str) and content:
            now = time.perf_counter()
            self.tokens += 1
            self._texts.append(content)
            self._times.append(now)
            if self.on_token is not None:
                self.on_token(self.tokens)
            assert self._queue is not None
            self.backlog.put()
            self._queue.put_nowait(Piece(content, now, self.tokens))
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
            self._stop_string = choice.get("stop_reason")
        return False
