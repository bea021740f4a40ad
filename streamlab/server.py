"""The model server: ``/complete``, ``/stream`` (SSE), ``/ws`` (WebSocket), ``/generations``; bare asyncio.

No web framework: the lesson is the protocol written out. Every byte of
protocol comes from the sans-IO modules (``http``, ``sse``, ``websocket``);
this file is the glue that reads from sockets, writes to them, and decides
what to do when a reader goes away.

That last part is the core lesson. Generating costs compute for every token,
so a server should stop as soon as nobody is reading. How does it know?

- **Watching** (the default): while a response is produced, a task keeps
  reading the connection. For HTTP, a read that returns ``b""`` (EOF) means
  the client closed its end; for a WebSocket, a close frame, a
  ``{"stop": true}`` message or EOF. The generation is stopped within a token.
- **Naive** (``--naive``): nobody reads. The server learns nothing until a
  write fails, and even then it keeps generating to the end, for nobody.
- **Write timeout** (both): a reader that vanished without a word (a phone
  that lost its signal) sends no EOF; only a write that cannot drain for
  ``--write-timeout`` seconds reveals it.

The second lesson is what survives. Every answer is written to a SQLite
``Store`` as it is sent (``--db``), so a reader who comes back, or a server
that was killed, finds the partial text and why it stopped. And
``/generations`` makes an answer a resource that outlives its connection:
its events are kept, numbered, so a reader who drops can reconnect with
``Last-Event-ID`` and resume where it left off, while the model carries on
for a grace period (``--grace``). ``--forget`` is the contrast: a server that
keeps nothing and has to start every reconnect over.

    python -m streamlab serve --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections import OrderedDict, deque
from contextlib import aclosing, asynccontextmanager, redirect_stdout, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

from . import sse
from . import websocket as ws
from .generation import ERROR, Generation, GenerationResult, Piece
from .http import (
    LAST_CHUNK,
    BodyReader,
    HTTPError,
    Request,
    RequestHeadParser,
    encode_chunk,
    error_response,
    json_response,
    response_head,
)
from .store import CLIENT_LEFT as STORED_CLIENT_LEFT
from .store import COMPLETED, INCOMPLETE_REASONS, STREAMING, AnswerWriter, Store, stop_reason_for

MAX_HEAD = 16 * 1024  # a request head larger than this is refused with 431
MAX_BODY = 1 << 20  # a request body larger than this is refused with 413
MAX_PROMPT = 32 * 1024  # bytes of UTF-8
MAX_WS_MESSAGE = 1 << 20  # a WebSocket message larger than this closes with 1009
READ_SIZE = 65536
IDLE_TIMEOUT = 75.0  # seconds a kept-alive connection may wait for its next request
LINGER_SECONDS = 1.0  # how long to keep reading after an error response (see linger_and_close)
WS_CLOSE_WAIT = 2.0  # how long to wait for the peer's CLOSE after sending ours
MAX_LOG_RECORDS = 1000
KEEP_GENERATIONS = 200  # /generations whose events stay in memory for resuming; the oldest ended go first
RETRY_MS = 1000  # SSE "retry:": how soon an EventSource reconnects after a drop
TITLE_CHARS = 60  # a conversation's title: the start of its first message
STATIC = Path(__file__).resolve().parent / "static"
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
STATIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a plain file name: no slash, no leading dot

# How the server learned that it should stop sending: the log's ``stop_signal``.
EOF = "eof"  # a read returned b"": the client closed its end
CLOSE_FRAME = "close_frame"  # a WebSocket CLOSE frame arrived
STOP_MESSAGE = "stop_message"  # the WebSocket client sent {"stop": true}
WRITE_FAILED = "write_failed"  # a write raised: connection reset, broken pipe
WRITE_TIMEOUT = "write_timeout"  # a write could not drain within --write-timeout
PROTOCOL_ERROR = "protocol_error"  # the WebSocket client broke RFC 6455
SERVER_SHUTDOWN = "server_shutdown"  # SIGTERM / SIGINT
CANCEL = "cancel"  # POST /generations/{id}/cancel
GRACE_EXPIRED = "grace_expired"  # a /generations answer went unread for --grace seconds
CLIENT_LEFT = {EOF, CLOSE_FRAME, WRITE_FAILED, WRITE_TIMEOUT, PROTOCOL_ERROR, GRACE_EXPIRED}


# --------------------------------------------------------------------------
# Configuration, requests, log records
# --------------------------------------------------------------------------


@dataclass
class ServerConfig:
    """Everything the command-line flags set (see ``parse_args``)."""

    host: str = "127.0.0.1"
    port: int = 8000
    naive: bool = False
    ping_interval: float = 15.0
    write_timeout: float = 30.0
    accel_header: bool = True
    pauses: dict[int, float] = field(default_factory=dict)
    fail_after: int | None = None
    token_delay: float = 0.0
    allowed_origins: tuple[str, ...] = ()
    db_path: str | None = None  # None: the store's default (STREAMLAB_DATA, else the user's data folder)
    flush_interval: float = 1.0  # seconds of text a crash may lose
    grace: float = 30.0  # seconds a /generations answer runs on with nobody reading
    forget: bool = False  # keep no events: a reconnect to /generations starts over
    keep_generations: int = KEEP_GENERATIONS


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request body (``/complete``, ``/stream``, or a WebSocket message)."""

    prompt: str
    max_tokens: int = 100
    seed: int = 0
    chat: bool = True
    ignore_eos: bool = False
    temperature: float = 0.7
    top_p: float = 0.9
    keep_open: bool = False  # /ws only: after "done", wait for another request instead of closing
    conversation_id: str | None = None  # continue this conversation (None: start a new one)


def _bad(message: str) -> HTTPError:
    return HTTPError(400, message)


def _refuse_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity, which are not JSON.
    raise _bad(f"{name} is not valid JSON")


def _load_json(body: bytes | str) -> Any:
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("the body is not UTF-8") from None
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise _bad(f"the body is not valid JSON: {exc}") from None


def _integer(obj: dict, name: str, default: int, low: int, high: int) -> int:
    value = obj.get(name, default)
    # bool is a subclass of int in Python, but `true` is not a number in JSON.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise _bad(f"{name} must be between {low} and {high}, got {value}")
    return value


def _number(
    obj: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False
) -> float:
    value = obj.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{name} must be a number, got {type(value).__name__}")
    if not (low < value if low_open else low <= value) or value > high:
        interval = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise _bad(f"{name} must be in {interval}, got {value}")
    return float(value)


def _boolean(obj: dict, name: str, default: bool) -> bool:
    value = obj.get(name, default)
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false, got {type(value).__name__}")
    return value


def _prompt(obj: dict) -> str:
    prompt = obj.get("prompt")
    if prompt is None:
        raise _bad("prompt is required")
    if not isinstance(prompt, str):
        raise _bad(f"prompt must be a string, got {type(prompt).__name__}")
    if not prompt:
        raise _bad("prompt must not be empty")
    try:
        size = len(prompt.encode("utf-8"))
    except UnicodeEncodeError:  # JSON may spell a lone surrogate: "\ud800"
        raise _bad("prompt contains a lone surrogate, which is not Unicode text") from None
    if size > MAX_PROMPT:
        raise _bad(f"prompt is {size} bytes, the limit is {MAX_PROMPT}")
    return prompt


def _conversation_id(obj: dict) -> str | None:
    value = obj.get("conversation_id")
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", value):
        raise _bad("conversation_id must be an id returned by this server")
    return value


def parse_generation_request(body: bytes | str) -> GenerationRequest:
    """Validate a request strictly; raise ``HTTPError(400)`` with a message that names the field.

    Strict because a loose server teaches clients bad habits: ``"max_tokens":
    "100"`` or ``true`` would work here and break elsewhere. Unknown keys are
    ignored, so clients can send fields meant for other servers.
    """
    obj = _load_json(body)
    if not isinstance(obj, dict):
        raise _bad(f"the request must be a JSON object, got {type(obj).__name__}")
    return GenerationRequest(
        prompt=_prompt(obj),
        max_tokens=_integer(obj, "max_tokens", 100, 1, 4096),
        seed=_integer(obj, "seed", 0, 0, 2**63 - 1),
        chat=_boolean(obj, "chat", True),
        ignore_eos=_boolean(obj, "ignore_eos", False),
        temperature=_number(obj, "temperature", 0.7, 0.0, 2.0),
        top_p=_number(obj, "top_p", 0.9, 0.0, 1.0, low_open=True),
        keep_open=_boolean(obj, "keep_open", False),
        conversation_id=_conversation_id(obj),
    )


@dataclass
class LogRecord:
    """What ``GET /log`` shows for one generation request: how it ended, and why.

    ``tokens`` counts generated tokens (live while it runs); ``pieces_sent``
    counts text pieces written to the client (1 for ``/complete``, once its
    body is written). ``stop_reason`` is the generation's own (eos,
    max_tokens, stopped, error); ``stop_signal`` is how the server learned to
    stop sending, the first one that came, and ``tokens_at_stop`` the token
    count at that moment (how far it ran on after being told is ``tokens``
    minus that). ``stored_reason`` is what the store recorded (see
    ``store.stop_reason_for``); ``conversation_id`` and ``message_id`` find
    the answer there. ``generation_id`` names the ``/generations`` resource a
    request served (None for the others): with ``--forget`` one resource can
    cost several generations, and their tokens add up.
    """

    id: str
    path: str
    prompt_tokens: int = 0
    tokens: int = 0
    pieces_sent: int = 0
    stop_reason: str | None = None
    stop_signal: str | None = None
    client_left: bool = False
    said_stop: bool = False
    done: bool = False
    started: float = field(default_factory=time.time)
    ended: float | None = None
    naive: bool = False
    error: str | None = None
    tokens_at_stop: int | None = None
    stored_reason: str | None = None
    conversation_id: str | None = None
    message_id: str | None = None
    generation_id: str | None = None

    def count_tokens(self, tokens: int) -> None:
        """Called from the generation thread after every token (an int store is atomic)."""
        self.tokens = tokens


@dataclass(frozen=True)
class Turn:
    """The user's side of one exchange, committed before anything is generated.

    ``prompt_ids`` is the whole conversation in the chat template when the
    request continued one (None: the prompt alone).
    """

    conversation_id: str
    user_message_id: str
    prompt_ids: list[int] | None = None


@dataclass(eq=False)
class Job:
    """One generation request: the running ``Generation``, its log record, and its answer in the store."""

    generation: Generation
    record: LogRecord
    answer: AnswerWriter
    over: asyncio.Event = field(default_factory=asyncio.Event)  # set once record and answer are final


def _json(obj: Any) -> str:
    # ensure_ascii=False: "é" travels as 2 UTF-8 bytes, not as the 6 of "\u00e9".
    return json.dumps(obj, ensure_ascii=False)


def _error_body(status: int, message: str) -> dict:
    return {"error": {"status": status, "message": message}}


def _framing(http10: bool) -> tuple[Callable[[bytes], bytes], bytes]:
    """How to wrap each write of a streamed body, and how to end it.

    HTTP/1.1 bodies are chunked; HTTP/1.0 has no chunked coding, so the
    body is the bytes as they are, ending when the connection closes.
    """
    if http10:
        return (lambda data: data), b""
    return encode_chunk, LAST_CHUNK


def _ids(job: Job) -> dict[str, str | None]:
    """Where the answer is stored: what a client needs to continue the conversation or read it back."""
    return {"conversation_id": job.record.conversation_id, "message_id": job.record.message_id}


def _id_headers(job: Job) -> list[tuple[str, str]]:
    return [("X-Request-Id", job.record.id), ("X-Conversation-Id", job.record.conversation_id or "")]


def _title(prompt: str) -> str:
    """A conversation's title for a list of them: its first message, on one line, cut short."""
    line = " ".join(prompt.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "\u2026"


def _numbered_event(number: int, name: str, data: Any, *, retry: int | None = None) -> bytes:
    """One SSE event with ``id: number``: the id is what a reader sends back to resume after it."""
    event = None if name == "message" else name
    return sse.encode_event(_json(data), event=event, id=str(number), retry=retry)


def _last_event_id(request: Request) -> int | None:
    """The ``Last-Event-ID`` of a reconnecting ``EventSource``: None when absent or not one of ours.

    A value we never sent (not a plain number) is treated as absent, so the
    reader gets the whole stream again rather than an error it cannot act on.
    """
    value = (request.header("last-event-id") or "").strip()
    return int(value) if re.fullmatch(r"[0-9]{1,18}", value) else None


@dataclass(eq=False)
class GenerationResource:
    """A ``POST /generations`` answer: its request, its run, and its events, kept for replay.

    ``events[i]`` is the event with id ``i + 1``, as ``(name, data)``: the
    pieces are ``message`` events, the last one is ``end`` or ``error``.
    Readers ``follow`` the list, each from its own place, and wait on
    ``changed`` for more: any number of them can read at once, and one that
    reconnects picks up after the last id it saw. With ``--forget`` nothing
    is kept: ``job`` is the run of the latest reader, and ends with it.
    """

    id: str
    req: GenerationRequest
    turn: Turn
    job: Job | None = None
    events: list[tuple[str, Any]] = field(default_factory=list)
    ended: bool = False
    subscribers: int = 0
    grace_timer: asyncio.TimerHandle | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.job is not None and not self.job.record.done

    def add(self, name: str, data: Any, *, last: bool = False) -> None:
        """Keep one more event and wake every reader waiting for it."""
        self.events.append((name, data))
        self.ended = self.ended or last
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def follow(self, after: int, ping_interval: float) -> AsyncIterator[tuple[int, str, Any] | None]:
        """Every event after id ``after`` as ``(id, name, data)``, kept ones first, then live ones.

        ``None`` after ``ping_interval`` seconds without an event: the
        caller's cue for a keep-alive comment.
        """
        number = after
        while True:
            while number < len(self.events):
                name, data = self.events[number]
                number += 1
                yield number, name, data
            if self.ended:
                return
            try:
                await asyncio.wait_for(self.changed.wait(), ping_interval if ping_interval > 0 else None)
            except asyncio.TimeoutError:
                yield None


# --------------------------------------------------------------------------
# Pieces, or a ping when it has been quiet too long
# --------------------------------------------------------------------------


async def pieces_or_pings(generation: Generation, interval: float) -> AsyncIterator[Piece | None]:
    """Yield each piece as it is made, or ``None`` after ``interval`` seconds of silence.

    ``None`` is the caller's cue to send a keep-alive (an SSE comment, a
    WebSocket ping) so that proxies and load balancers, which close
    connections idle for 60-100 s, keep this one open while the model thinks.
    The wait for the next piece is a task that survives the timeout: waiting
    with ``wait_for`` would cancel it, and with it the stream of pieces.
    """
    pieces = generation.pieces()
    next_piece = asyncio.ensure_future(anext(pieces, None))
    try:
        while True:
            done, _ = await asyncio.wait({next_piece}, timeout=interval if interval > 0 else None)
            if not done:
                yield None
                continue
            piece = next_piece.result()
            if piece is None:
                return
            yield piece
            next_piece = asyncio.ensure_future(anext(pieces, None))
    finally:
        next_piece.cancel()
        with suppress(asyncio.CancelledError):
            await next_piece
        await pieces.aclose()


# --------------------------------------------------------------------------
# One TCP connection
# --------------------------------------------------------------------------


class ClientGone(Exception):
    """A write could not be completed: the client reset, closed, or stopped reading."""

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.signal = signal


class ClientConnection:
    """An accepted connection: buffered reads, writes bounded by a timeout.

    ``buffer`` holds bytes read but not yet parsed: the start of a body after
    its head, or a next request that a keep-alive client sent early.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, write_timeout: float
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.write_timeout = write_timeout
        self.buffer = b""
        self.bytes_sent = 0
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Send each small write at once. Nagle's algorithm would hold a
            # 20-byte event back until the previous one is acknowledged.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def read(self, timeout: float | None = None) -> bytes:
        """The next bytes from the client (``b""`` at EOF), buffered ones first."""
        if self.buffer:
            data, self.buffer = self.buffer, b""
            return data
        return await asyncio.wait_for(self.reader.read(READ_SIZE), timeout)

    async def read_head(self) -> Request | None:
        """The next request head, or None when the client closes (or idles) between requests."""
        parser = RequestHeadParser(max_head=MAX_HEAD)
        while True:
            try:
                data = await self.read(IDLE_TIMEOUT)
            except asyncio.TimeoutError:
                return None
            if not data:
                return None
            request = parser.feed(data)
            if request is not None:
                self.buffer = parser.rest
                return request

    async def read_body(self, request: Request, max_body: int = MAX_BODY) -> bytes:
        """The whole request body; a too-large ``Content-Length`` is refused before reading it."""
        body = BodyReader.for_request(request, max_body=max_body)  # raises 413 right here
        if body.done:
            return b""
        if (request.header("expect") or "").lower() == "100-continue":
            # curl waits for this before sending a body over 1 KiB.
            await self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        parts = body.feed(self.buffer)
        self.buffer = b""
        while not body.done:
            data = await asyncio.wait_for(self.reader.read(READ_SIZE), IDLE_TIMEOUT)
            if not data:
                raise ClientGone(EOF)
            parts += body.feed(data)
        self.buffer = body.rest
        return b"".join(parts)

    async def send(self, data: bytes) -> None:
        """Write and wait until the kernel took the bytes, at most ``write_timeout`` seconds.

        ``drain`` waits only when asyncio's buffer is full, i.e. when the
        client stopped reading long enough to fill its socket buffers. A
        client that vanished without closing never sends EOF or a reset: this
        timeout is the only way to notice it.
        """
        if self.writer.transport.is_closing():
            raise ClientGone(WRITE_FAILED)
        self.writer.write(data)
        try:
            await asyncio.wait_for(self.writer.drain(), self.write_timeout or None)
        except asyncio.TimeoutError:
            self.writer.transport.abort()
            raise ClientGone(WRITE_TIMEOUT) from None
        except ConnectionError:
            raise ClientGone(WRITE_FAILED) from None
        self.bytes_sent += len(data)

    def send_nowait(self, data: bytes) -> None:
        """Queue a small write (a pong) without waiting; the next ``send`` drains it."""
        if not self.writer.transport.is_closing():
            self.writer.write(data)
            self.bytes_sent += len(data)

    async def watch_for_eof(self, on_eof: Callable[[], None]) -> None:
        """Read until EOF, then call ``on_eof``: the client closed its end, nobody is reading.

        Bytes that arrive meanwhile are kept: they are a keep-alive client's
        next request, not a goodbye.
        """
        while len(self.buffer) <= MAX_HEAD + MAX_BODY:
            try:
                data = await self.reader.read(READ_SIZE)
            except ConnectionError:
                data = b""
            if not data:
                on_eof()
                return
            self.buffer += data

    async def linger_and_close(self) -> None:
        """Close after an error response without destroying it.

        Closing a socket with unread bytes in its receive buffer makes the
        kernel send a reset, which can discard our response before the client
        reads it. So: stop writing, read and drop for a moment, then close
        (nginx calls this a lingering close).
        """
        with suppress(OSError, RuntimeError, asyncio.TimeoutError):
            if self.writer.can_write_eof():
                self.writer.write_eof()
            deadline = time.monotonic() + LINGER_SECONDS
            while (left := deadline - time.monotonic()) > 0:
                if not await asyncio.wait_for(self.reader.read(READ_SIZE), left):
                    break
        await self.close()

    async def close(self) -> None:
        self.writer.close()
        with suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)

    def abort(self) -> None:
        self.writer.transport.abort()


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------

Handler = Callable[..., Awaitable[bool]]


@asynccontextmanager
async def in_background(coroutine: Any) -> AsyncIterator[None]:
    """Run ``coroutine`` as a task for the duration of the ``with`` block, then cancel it."""
    task = asyncio.create_task(coroutine)
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


async def until_client_leaves(client: ClientConnection, work: Awaitable[None]) -> bool:
    """Run ``work`` while watching for EOF; stop it when the client leaves. True if it finished.

    For a reader of a kept generation: its leaving must end its own relay
    at once (so the grace period starts counting) without stopping the
    generation, which other readers, or the same one reconnecting, still want.
    """
    task = asyncio.ensure_future(work)
    left = False

    def on_eof() -> None:
        nonlocal left
        left = True
        task.cancel()

    async with in_background(client.watch_for_eof(on_eof)):
        try:
            await task
        except asyncio.CancelledError:
            if not left:  # we are being cancelled ourselves (server shutdown)
                raise
    return not left


def _route_pattern(pattern: str) -> re.Pattern:
    """``/log/{id}`` → a regex with a named group per ``{name}``."""
    parts = re.split(r"\{(\w+)\}", pattern)
    regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
    return re.compile(regex)


class Server:
    """Routes, generations and their log, behind one listening socket.

    ``routes`` maps a path pattern to ``{method: handler}``; a handler is
    ``async (client, request, **path_params) -> bool`` and returns whether
    the connection may carry another request. Adding a route is adding an
    entry.
    """

    def __init__(self, lm: Any, config: ServerConfig | None = None) -> None:
        self.lm = lm
        self.config = config or ServerConfig()
        self.routes: dict[str, dict[str, Handler]] = {
            "/complete": {"POST": self.complete},
            "/stream": {"POST": self.stream},
            "/ws": {"GET": self.websocket},
            "/log": {"GET": self.get_log},
            "/log/{id}": {"GET": self.get_log_record},
            "/health": {"GET": self.health},
            "/generations": {"POST": self.create_generation},
            "/generations/{id}": {"GET": self.get_generation},
            "/generations/{id}/events": {"GET": self.generation_events},
            "/generations/{id}/cancel": {"POST": self.cancel_generation},
            "/conversations": {"GET": self.get_conversations},
            "/conversations/{id}": {"GET": self.get_conversation},
            "/": {"GET": self.index},
            "/static/{name}": {"GET": self.static},
            "/static/{folder}/{name}": {"GET": self.static},
        }
        self.log: OrderedDict[str, LogRecord] = OrderedDict()
        self.jobs: set[Job] = set()
        self.generations: OrderedDict[str, GenerationResource] = OrderedDict()
        self._store: Store | None = None  # opened by start()
        self._ids = itertools.count(1)
        self._connections: dict[asyncio.Task, ClientConnection] = {}
        self._listener: asyncio.AbstractServer | None = None
        self.port = 0

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> int:
        """Open the store, close what a crash left open, bind and listen; return the port."""
        self._store = Store(self.config.db_path, flush_interval=self.config.flush_interval)
        recovered = self._store.recover_interrupted()
        print(
            f"streamlab: store {self._store.path}: {recovered} answer(s) left streaming by a crash"
            " marked interrupted",
            file=sys.stderr,
            flush=True,
        )
        self._listener = await asyncio.start_server(
            self._on_connect, self.config.host, self.config.port, limit=READ_SIZE
        )
        self.port = self._listener.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the server has not been started: no store is open")
        return self._store

    async def shutdown(self) -> None:
        """Stop every generation, stop listening, close every connection.

        Streams get a moment to send their end event (stopped within one
        token); idle keep-alive connections are simply closed.
        """
        for job in list(self.jobs):
            self.stop_job(job, SERVER_SHUTDOWN)
        if self._listener is not None:
            self._listener.close()
        tasks = list(self._connections)
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for task, client in list(self._connections.items()):
            client.abort()
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for job in list(self.jobs):  # let the threads see their stop flag and return
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(job.generation.wait(), 2.0)
        producers = [r.task for r in self.generations.values() if r.task is not None and not r.task.done()]
        if producers:  # kept generations write their ending (interrupted) to the store
            await asyncio.wait(producers, timeout=2.0)
        if self._store is not None:
            self._store.close()  # whatever is still being written is closed as interrupted

    # -- connections -----------------------------------------------------------

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = ClientConnection(reader, writer, self.config.write_timeout)
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = client
        try:
            await self._serve_connection(client)
        except (ClientGone, ConnectionError, asyncio.TimeoutError):
            pass
        finally:
            del self._connections[task]
            client.abort()

    async def _serve_connection(self, client: ClientConnection) -> None:
        """Requests one after another on the same connection, while both sides keep it alive."""
        while True:
            try:
                request = await client.read_head()
            except HTTPError as err:
                await self._refuse(client, err.status, err.message)
                return
            if request is None:
                await client.close()
                return
            if not await self._dispatch(client, request):
                await client.close()
                return

    async def _dispatch(self, client: ClientConnection, request: Request) -> bool:
        """Find the handler and run it; turn refusals into JSON error responses."""
        try:
            methods, params = self._match(request.path)
            handler = methods.get(request.method)
            if handler is None:
                allow = [("Allow", ", ".join(sorted(methods)))]
                await self._refuse(client, 405, f"{request.method} is not allowed on {request.path}", allow)
                return False
            return await handler(client, request, **params)
        except (HTTPError, ws.HandshakeError) as err:
            await self._refuse(client, err.status, err.message, getattr(err, "headers", ()))
        except (ClientGone, ConnectionError):
            pass
        except Exception:  # noqa: BLE001 - a bug must not take the server down
            traceback.print_exc(file=sys.stderr)
            await self._refuse(client, 500, "internal server error")
        return False

    def _match(self, path: str) -> tuple[dict[str, Handler], dict[str, str]]:
        for pattern, methods in self.routes.items():
            match = _route_pattern(pattern).fullmatch(path)
            if match:
                return methods, match.groupdict()
        raise HTTPError(404, f"no route for {path}")

    async def _refuse(self, client: ClientConnection, status: int, message: str, headers: Any = ()) -> None:
        if client.bytes_sent == 0:  # once a response has started, an error can only cut it
            with suppress(ClientGone):
                await client.send(error_response(status, message, headers))
        await client.linger_and_close()

    async def _respond_json(
        self, client: ClientConnection, request: Request, obj: Any, headers: Any = (), *, status: int = 200
    ) -> bool:
        keep_alive = request.keep_alive()
        headers = list(headers) + ([] if keep_alive else [("Connection", "close")])
        await client.send(json_response(status, obj, headers))
        return keep_alive

    # -- generations -------------------------------------------------------------

    def new_id(self) -> str:
        return str(next(self._ids))

    def begin_turn(self, req: GenerationRequest) -> Turn:
        """Commit the user's message, before anything is generated, and build the prompt.

        A crash can then lose (part of) an answer, never the question. A
        request naming a ``conversation_id`` continues that conversation
        (404 if there is none); with ``chat`` the model is shown all of it,
        so that it answers in context. Otherwise a new conversation begins.
        """
        store = self.store
        conversation_id = req.conversation_id or store.new_conversation(title=_title(req.prompt))
        try:
            user = store.add_user_message(conversation_id, req.prompt)
        except KeyError:
            raise HTTPError(404, f"no conversation {conversation_id!r}") from None
        continued = req.conversation_id is not None and req.chat
        prompt_ids = self.history_prompt(conversation_id) if continued else None
        return Turn(conversation_id, user.id, prompt_ids)

    def history_prompt(self, conversation_id: str) -> list[int] | None:
        """The conversation so far (this turn's message last) in the model's chat template.

        ``as_chat_messages`` marks every incomplete answer as cut off, and
        why: fed back unmarked, a truncated answer reads to the model as
        everything it meant to say. None when the model has no chat template.
        """
        tokenizer = self.lm.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            return None
        messages = self.store.as_chat_messages(conversation_id)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def start_job(
        self,
        path: str,
        req: GenerationRequest,
        request_id: str | None = None,
        *,
        turn: Turn | None = None,
        generation_id: str | None = None,
    ) -> Job:
        """Commit the user's turn (unless given), open the answer's row, start the generation thread."""
        turn = turn or self.begin_turn(req)
        record = LogRecord(
            id=request_id or self.new_id(),
            path=path,
            naive=self.config.naive,
            conversation_id=turn.conversation_id,
            generation_id=generation_id,
        )
        generation = Generation(
            self.lm,
            req.prompt,
            prompt_ids=turn.prompt_ids,
            max_tokens=req.max_tokens,
            seed=req.seed,
            chat=req.chat,
            ignore_eos=req.ignore_eos,
            temperature=req.temperature,
            top_p=req.top_p,
            pauses=self.config.pauses,
            fail_after=self.config.fail_after,
            token_delay=self.config.token_delay,
            on_token=record.count_tokens,
        )
        record.prompt_tokens = len(generation.prompt_ids)
        answer = self.store.begin_answer(turn.conversation_id)
        record.message_id = answer.message_id
        self.log[record.id] = record
        while len(self.log) > MAX_LOG_RECORDS:
            self.log.popitem(last=False)
        job = Job(generation, record, answer)
        self.jobs.add(job)
        generation.start()
        return job

    def keep(self, job: Job, piece: Piece) -> None:
        """Add a piece to the stored answer as it leaves the server (written at most every flush interval).

        The server's copy is the record, never the client's: the client may
        be gone, or may not tell the truth.
        """
        job.answer.append(piece.text, piece.tokens)

    def stop_job(self, job: Job, signal: str) -> None:
        """Note why the reader is gone (the first signal wins) and, unless naive, stop generating.

        The generation checks its stop flag before every token, so it ends
        within one token. A naive server notes the signal and carries on.
        """
        record = job.record
        if record.stop_signal is None:
            record.stop_signal = signal
            record.tokens_at_stop = record.tokens
        record.client_left |= signal in CLIENT_LEFT
        record.said_stop |= signal == STOP_MESSAGE
        if not self.config.naive or signal == SERVER_SHUTDOWN:
            job.generation.stop(signal)

    async def finish(self, job: Job) -> None:
        """Wait for the generation thread to end (a naive one runs on), then close the record and the answer.

        ``done`` is set last, so whoever waits for it (``client.wait_log``)
        finds the store already final.
        """
        result = await job.generation.wait()
        record = job.record
        record.tokens = result.tokens
        record.stop_reason = result.stop_reason
        record.error = result.error
        record.stored_reason = self.stored_reason(job, result)
        job.answer.finish(record.stored_reason, error=result.error)
        record.ended = time.time()
        record.done = True
        self.jobs.discard(job)
        job.over.set()

    def stored_reason(self, job: Job, result: GenerationResult) -> str:
        """The stop reason to store: the generation's ending joined with how the server learned to stop.

        One case needs more: a naive server whose model finished *after*
        its reader left. The model completed, but what was sent, and stored,
        is only part of it.
        """
        reason = stop_reason_for(result.stop_reason, job.record.stop_signal)
        if reason == COMPLETED and job.answer.text != result.text:
            return STORED_CLIENT_LEFT
        return reason

    @asynccontextmanager
    async def watching(self, client: ClientConnection, job: Job) -> AsyncIterator[None]:
        """While the response is produced, read the connection: EOF means the reader left.

        HTTP/1.1 gives a server no other sign. The read returns ``b""`` the
        moment the client's FIN arrives, usually long before a write would
        fail. A naive server skips this and learns only from a failed write.
        """
        if self.config.naive:
            yield
            return
        async with in_background(client.watch_for_eof(lambda: self.stop_job(job, EOF))):
            yield

    # -- routes ------------------------------------------------------------------

    async def complete(self, client: ClientConnection, request: Request) -> bool:
        """``POST /complete``: generate it all, then send one JSON body with a Content-Length.

        Nothing is written until the end, so the reader waits for the whole
        answer, and the only way to notice one who gave up is to watch for EOF.
        """
        req = parse_generation_request(await client.read_body(request))
        job = self.start_job(request.path, req)
        headers = _id_headers(job)
        try:
            async with self.watching(client, job):
                result = await self._collect(job)
            if job.record.client_left:
                return False
            if result.stop_reason == ERROR:
                await client.send(error_response(500, f"generation failed: {result.error}", headers))
                return False
            body = {
                "text": result.text,
                "tokens": result.tokens,
                "stop_reason": result.stop_reason,
                "id": job.record.id,
                "conversation_id": job.record.conversation_id,
                "message_id": job.record.message_id,
            }
            keep_alive = await self._respond_json(client, request, body, headers)
            job.record.pieces_sent = 1
            return keep_alive
        except ClientGone as gone:
            self.stop_job(job, gone.signal)
            return False
        finally:
            await self.finish(job)

    async def _collect(self, job: Job) -> GenerationResult:
        """Keep each piece as it is made: nothing is sent before the end, but a crash must not lose it all."""
        async for piece in job.generation.pieces():
            self.keep(job, piece)
        return await job.generation.wait()

    def _stream_head(self, http10: bool, extra: list[tuple[str, str]]) -> bytes:
        headers = [
            ("Content-Type", "text/event-stream; charset=utf-8"),
            # no-transform: no proxy may compress or rewrite it (gzip buffers ~32 KiB).
            ("Cache-Control", "no-cache, no-transform"),
            *extra,
        ]
        if self.config.accel_header:
            headers.append(("X-Accel-Buffering", "no"))  # nginx: pass each write on at once
        if http10:
            # HTTP/1.0 has no chunked coding: the body ends when we close.
            headers.append(("Connection", "close"))
        return response_head(200, headers, chunked=not http10)

    async def stream(self, client: ClientConnection, request: Request) -> bool:
        """``POST /stream``: one Server-Sent Event per piece, as soon as it exists.

        HTTP/1.1 bodies are chunked; an HTTP/1.0 request (nginx's default to
        its upstreams) gets a body that ends when the connection closes.
        """
        req = parse_generation_request(await client.read_body(request))
        job = self.start_job(request.path, req)
        http10 = request.version == "HTTP/1.0"
        frame, end_of_body = _framing(http10)
        try:
            async with self.watching(client, job):
                await client.send(self._stream_head(http10, _id_headers(job)))
                await self._send_pieces(client, job, frame)
            await self._send_ending(client, job, frame, end_of_body)
        except ClientGone as gone:
            self.stop_job(job, gone.signal)
        finally:
            await self.finish(job)
        ok = job.record.stop_signal is None and job.record.stop_reason != ERROR
        return ok and not http10 and request.keep_alive()

    async def _send_pieces(
        self, client: ClientConnection, job: Job, frame: Callable[[bytes], bytes], *, numbered: bool = False
    ) -> int:
        """One event per piece, and a ``: ping`` comment in the silences; return how many pieces were sent.

        Every event is one write: a ping can never land inside an event.
        ``numbered`` gives each event an ``id:`` (1, 2, ...), and the first a
        ``retry:``, as ``/generations`` streams have.
        """
        async with aclosing(pieces_or_pings(job.generation, self.config.ping_interval)) as items:
            async for piece in items:
                if piece is None:
                    await client.send(frame(sse.encode_comment("ping")))
                    continue
                data = {"text": piece.text}
                number = job.record.pieces_sent + 1
                retry = RETRY_MS if number == 1 else None
                if numbered:
                    event = _numbered_event(number, "message", data, retry=retry)
                else:
                    event = sse.encode_event(_json(data))
                await client.send(frame(event))
                job.record.pieces_sent = number
                self.keep(job, piece)
        return job.record.pieces_sent

    async def _send_ending(
        self, client: ClientConnection, job: Job, frame: Callable[[bytes], bytes], end_of_body: bytes
    ) -> None:
        """``end`` with the stop reason, then ``[DONE]``; or an ``error`` event and no ``[DONE]``."""
        result = await job.generation.wait()
        if result.stop_reason == ERROR:
            # No [DONE]: a client must not mistake a failed answer for a complete one.
            error = _error_body(500, f"generation failed: {result.error}")
            await client.send(frame(sse.encode_event(_json(error), event="error")) + end_of_body)
            return
        end = {"stop_reason": result.stop_reason, "tokens": result.tokens, **_ids(job)}
        await client.send(frame(sse.encode_event(_json(end), event="end")))
        await client.send(frame(sse.encode_done()) + end_of_body)

    async def websocket(self, client: ClientConnection, request: Request) -> bool:
        """``GET /ws``: check the upgrade and its Origin, answer 101, then speak frames."""
        if not self.origin_allowed(request.header("origin"), request.header("host")):
            raise HTTPError(403, f"origin {request.header('origin')!r} is not allowed")
        key = ws.validate_upgrade_request(request.method, dict(request.headers))
        request_id = self.new_id()
        await client.send(ws.server_handshake_response(key, [("X-Request-Id", request_id)]))
        await WebSocketSession(self, client, request_id).run()
        return False

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """Browsers attach cookies to WebSocket requests and apply no CORS, so the server must check.

        No Origin: not a browser (curl, a script), which could send any
        Origin anyway. Otherwise the page must come from this very host:port,
        or from an origin allowed with ``--allowed-origin``.
        """
        if origin is None:
            return True
        if origin in self.config.allowed_origins:
            return True
        parts = urlsplit(origin)
        return bool(host) and parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()

    async def get_log(self, client: ClientConnection, request: Request) -> bool:
        """``GET /log``: every generation request, how it ended, and how the server noticed."""
        return await self._respond_json(client, request, [asdict(r) for r in self.log.values()])

    async def get_log_record(self, client: ClientConnection, request: Request, id: str) -> bool:  # noqa: A002
        """``GET /log/{id}``: one record (the id is in each response's X-Request-Id)."""
        record = self.log.get(id)
        if record is None:
            raise HTTPError(404, f"no request with id {id!r}")
        return await self._respond_json(client, request, asdict(record))

    async def health(self, client: ClientConnection, request: Request) -> bool:
        """``GET /health``: up, which model, which mode."""
        return await self._respond_json(
            client, request, {"ok": True, "model": self.lm.name, "naive": self.config.naive}
        )

    # -- generations as resources --------------------------------------------------

    def _resource(self, id: str) -> GenerationResource:  # noqa: A002
        resource = self.generations.get(id)
        if resource is None:
            raise HTTPError(404, f"no generation {id!r}")
        return resource

    async def create_generation(self, client: ClientConnection, request: Request) -> bool:
        """``POST /generations``: start an answer that outlives its connection; ``201`` says where to read it.

        The model starts at once, in the background: the reader may take a
        moment to connect, or drop and come back, and nothing is lost in
        between. (With ``--forget`` nothing starts until a reader connects.)
        """
        req = parse_generation_request(await client.read_body(request))
        resource = GenerationResource(uuid.uuid4().hex, req, self.begin_turn(req))
        self._remember(resource)
        if not self.config.forget:
            self._run_kept(resource)
        body = {
            "id": resource.id,
            "conversation_id": resource.turn.conversation_id,
            "message_id": resource.job.record.message_id if resource.job else None,
            "events": f"/generations/{resource.id}/events",
        }
        headers = [("Location", f"/generations/{resource.id}"), *self._resource_headers(resource)]
        return await self._respond_json(client, request, body, headers, status=201)

    def _remember(self, resource: GenerationResource) -> None:
        """Keep a new resource; past ``keep_generations``, forget the oldest that no longer run."""
        self.generations[resource.id] = resource
        excess = len(self.generations) - self.config.keep_generations
        if excess > 0:
            over = [g for g, r in self.generations.items() if not r.running and r is not resource]
            for generation_id in over[:excess]:
                del self.generations[generation_id]

    def _resource_headers(self, resource: GenerationResource) -> list[tuple[str, str]]:
        headers = [("X-Generation-Id", resource.id), ("X-Conversation-Id", resource.turn.conversation_id)]
        if resource.job is not None:
            headers.append(("X-Request-Id", resource.job.record.id))
        return headers

    def _run_kept(self, resource: GenerationResource) -> None:
        """Start the generation and the task that keeps its events; grace runs until a reader comes."""
        resource.job = self.start_job(
            "/generations", resource.req, turn=resource.turn, generation_id=resource.id
        )
        resource.task = asyncio.create_task(self._produce(resource))
        self._start_grace(resource)

    async def _produce(self, resource: GenerationResource) -> None:
        """Turn each piece into a kept, numbered event and store it, whether anyone reads or not."""
        job = resource.job
        assert job is not None
        try:
            async for piece in job.generation.pieces():
                self.keep(job, piece)
                job.record.pieces_sent += 1
                resource.add("message", {"text": piece.text})
        finally:
            await self.finish(job)
            self._cancel_grace(resource)
            name, data = self._ending(job)
            resource.add(name, data, last=True)

    def _ending(self, job: Job) -> tuple[str, dict]:
        """A ``/generations`` stream's last event: ``end`` (how it ended, where it is stored) or ``error``."""
        result, record = job.generation.result, job.record
        assert result is not None
        ending = {
            "stop_reason": result.stop_reason,
            "stored_reason": record.stored_reason,
            "tokens": result.tokens,
            "incomplete": record.stored_reason in INCOMPLETE_REASONS,
            **_ids(job),
        }
        if result.stop_reason == ERROR:
            return "error", {**_error_body(500, f"generation failed: {result.error}"), **ending}
        return "end", ending

    def _start_grace(self, resource: GenerationResource) -> None:
        """Nobody is reading: unless a reader comes within ``--grace`` seconds, stop generating for nobody."""
        if resource.running and resource.job is not None:
            loop = asyncio.get_running_loop()
            resource.grace_timer = loop.call_later(
                self.config.grace, self.stop_job, resource.job, GRACE_EXPIRED
            )

    def _cancel_grace(self, resource: GenerationResource) -> None:
        if resource.grace_timer is not None:
            resource.grace_timer.cancel()
            resource.grace_timer = None

    async def generation_events(
        self, client: ClientConnection, request: Request, id: str  # noqa: A002
    ) -> bool:
        """``GET /generations/{id}/events``: the answer as numbered Server-Sent Events, resumable.

        A GET with no body, so a browser's ``EventSource`` can read it. A
        reader that reconnects with ``Last-Event-ID: N`` (an EventSource does
        so by itself after a drop) gets the events after N: the kept ones at
        once, then the live ones; nothing is generated again. One that already
        had the last event gets ``204``, the only answer that stops an
        EventSource from reconnecting for ever.
        """
        resource = self._resource(id)
        if self.config.forget:
            return await self._events_afresh(client, request, resource)
        after = _last_event_id(request)
        if after is not None and resource.ended and after >= len(resource.events):
            keep_alive = request.keep_alive()
            headers = [("Cache-Control", "no-cache")] + ([] if keep_alive else [("Connection", "close")])
            await client.send(response_head(204, headers))
            return keep_alive
        http10 = request.version == "HTTP/1.0"
        frame, end_of_body = _framing(http10)
        await client.send(self._stream_head(http10, self._resource_headers(resource)))
        resource.subscribers += 1
        self._cancel_grace(resource)
        try:
            finished = await until_client_leaves(client, self._relay(client, resource, after or 0, frame))
        finally:
            resource.subscribers -= 1
            if resource.subscribers == 0:
                self._start_grace(resource)
        if finished:
            await client.send(end_of_body)
        return False  # the stream is over: close, so the reader sees its end

    async def _relay(
        self,
        client: ClientConnection,
        resource: GenerationResource,
        after: int,
        frame: Callable[[bytes], bytes],
    ) -> None:
        """Send every event after id ``after``, kept then live, to the last; the first carries ``retry:``."""
        retry: int | None = RETRY_MS
        async with aclosing(resource.follow(after, self.config.ping_interval)) as events:
            async for item in events:
                if item is None:
                    await client.send(frame(sse.encode_comment("ping")))
                    continue
                number, name, data = item
                await client.send(frame(_numbered_event(number, name, data, retry=retry)))
                retry = None

    async def _events_afresh(
        self, client: ClientConnection, request: Request, resource: GenerationResource
    ) -> bool:
        """``--forget``: nothing was kept, so every reader, reconnecting or not, gets a new generation.

        Same prompt and seed, so the same text, from event 1, paid for again.
        The run is tied to this connection as on ``/stream``: when the reader
        leaves, generation stops.
        """
        path = f"/generations/{resource.id}/events"
        job = self.start_job(path, resource.req, turn=resource.turn, generation_id=resource.id)
        resource.job = job
        http10 = request.version == "HTTP/1.0"
        frame, end_of_body = _framing(http10)
        sent = 0
        try:
            async with self.watching(client, job):
                await client.send(self._stream_head(http10, self._resource_headers(resource)))
                sent = await self._send_pieces(client, job, frame, numbered=True)
        except ClientGone as gone:
            self.stop_job(job, gone.signal)
        finally:
            await self.finish(job)
        if job.record.stop_signal is None:
            name, data = self._ending(job)
            retry = RETRY_MS if sent == 0 else None
            await client.send(frame(_numbered_event(sent + 1, name, data, retry=retry)) + end_of_body)
        return False

    async def cancel_generation(
        self, client: ClientConnection, request: Request, id: str  # noqa: A002
    ) -> bool:
        """``POST /generations/{id}/cancel``: the user pressed stop. Answers once generation has stopped.

        The reader's connection may be gone (a closed tab), so stopping is a
        request of its own, not a message on the stream.
        """
        resource = self._resource(id)
        await client.read_body(request)  # a body, if any, says nothing the URL does not
        job = resource.job
        if job is not None and resource.running:
            self.stop_job(job, CANCEL)
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(job.over.wait(), 5.0)
        body = {"id": resource.id, "status": self._status(resource)}
        return await self._respond_json(client, request, body)

    def _status(self, resource: GenerationResource) -> str:
        """``waiting`` (``--forget``, before any reader), ``running`` or ``done``."""
        if resource.job is None:
            return "waiting"
        return "running" if resource.running else "done"

    async def get_generation(self, client: ClientConnection, request: Request, id: str) -> bool:  # noqa: A002
        """``GET /generations/{id}``: how far it has come, its text so far, how it ended."""
        resource = self._resource(id)
        job = resource.job
        record = job.record if job is not None else LogRecord(id="", path="")
        body = {
            "id": resource.id,
            "conversation_id": resource.turn.conversation_id,
            "message_id": record.message_id,
            "status": self._status(resource),
            "text": job.answer.text if job is not None else "",
            "tokens": record.tokens,
            "stop_reason": record.stop_reason,
            "stored_reason": record.stored_reason,
            "incomplete": record.stored_reason in INCOMPLETE_REASONS if record.done else None,
            "events": len(resource.events),
        }
        return await self._respond_json(client, request, body)

    # -- stored conversations ------------------------------------------------------

    async def get_conversations(self, client: ClientConnection, request: Request) -> bool:
        """``GET /conversations``: every stored conversation, newest first, for a history list."""
        items = [
            {"id": c.id, "title": c.title or self._first_words(c.id), "created": c.created}
            for c in reversed(self.store.conversations())
        ]
        return await self._respond_json(client, request, items)

    def _first_words(self, conversation_id: str) -> str | None:
        """A title for a conversation stored without one: its first user message, cut short."""
        first = next((m for m in self.store.history(conversation_id) if m.role == "user"), None)
        return _title(first.content) if first is not None else None

    async def get_conversation(
        self, client: ClientConnection, request: Request, id: str  # noqa: A002
    ) -> bool:
        """``GET /conversations/{id}``: every message, with why each answer ended.

        An answer still being generated shows its text so far, from memory:
        the file lags up to one flush interval behind.
        """
        conversation = self.store.conversation(id)
        if conversation is None:
            raise HTTPError(404, f"no conversation {id!r}")
        live = {job.answer.message_id: job.answer for job in self.jobs}
        messages = []
        for m in self.store.history(id):
            writer = live.get(m.id) if m.status == STREAMING else None
            content, tokens = (writer.text, writer.tokens) if writer is not None else (m.content, m.tokens)
            messages.append({
                "id": m.id,
                "role": m.role,
                "content": content,
                "status": m.status,
                "stop_reason": m.stop_reason,
                "incomplete": m.incomplete,
                "tokens": tokens,
            })
        body = {
            "id": conversation.id,
            "title": conversation.title,
            "created": conversation.created,
            "messages": messages,
        }
        return await self._respond_json(client, request, body)

    # -- the browser page ----------------------------------------------------------

    async def index(self, client: ClientConnection, request: Request) -> bool:
        """``GET /``: the browser page, ``static/index.html``."""
        return await self._send_static(client, request, "index.html")

    async def static(
        self, client: ClientConnection, request: Request, name: str, folder: str | None = None
    ) -> bool:
        """``GET /static/{name}`` (or ``/static/{folder}/{name}``): a file of ``streamlab/static``."""
        parts = (name,) if folder is None else (folder, name)
        return await self._send_static(client, request, *parts)

    async def _send_static(self, client: ClientConnection, request: Request, *parts: str) -> bool:
        """Serve a file of the static folder, and nothing outside it.

        The routes already refuse a ``/`` inside a part (``%2F`` too: the
        path is decoded before matching). Each part must also be a plain
        name (no ``..``, no hidden file), the file of a known type, and still
        inside the folder once symbolic links are followed. ``no-cache``
        makes a browser revalidate, so an edited page shows on the next reload.
        """
        path = STATIC.joinpath(*parts)
        content_type = STATIC_TYPES.get(path.suffix.lower())
        plain = all(STATIC_NAME.fullmatch(part) and ".." not in part for part in parts)
        inside = STATIC.resolve() in path.resolve().parents
        if not plain or content_type is None or not path.is_file() or not inside:
            raise HTTPError(404, f"no file {'/'.join(parts)!r}")
        body = path.read_bytes()
        keep_alive = request.keep_alive()
        headers = [
            ("Content-Type", content_type),
            ("Cache-Control", "no-cache"),
            ("X-Content-Type-Options", "nosniff"),
        ] + ([] if keep_alive else [("Connection", "close")])
        await client.send(response_head(200, headers, content_length=len(body)) + body)
        return keep_alive


# --------------------------------------------------------------------------
# A WebSocket connection
# --------------------------------------------------------------------------


def _is_stop(text: str) -> bool:
    try:
        message = json.loads(text)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("stop") is True


class WebSocketSession:
    """One WebSocket after its 101: a request message in, ``{"text"}`` messages out.

    Everything the client says arrives as frames on this one connection: a
    ping to answer, ``{"stop": true}``, a close frame, or EOF. In watching
    mode a task reads them while a generation streams; in naive mode nobody
    reads while generating, so pings go unanswered and stops go unheard.
    """

    def __init__(self, server: Server, client: ClientConnection, first_id: str) -> None:
        self.server = server
        self.client = client
        self.conn = ws.Connection(client=False, max_message=MAX_WS_MESSAGE)
        self.inbox: deque[str] = deque()  # request messages not yet served
        self.job: Job | None = None
        self.ended = False  # the peer closed, left or broke the protocol: read no more
        self.eof = False
        self.close_with: tuple[int, str] = (1000, "")
        self.next_id: str | None = first_id  # announced in the 101's X-Request-Id

    async def run(self) -> None:
        try:
            while (text := await self.next_message()) is not None:
                if not await self.answer(text):
                    break
        except ClientGone:
            self.ended = self.eof = True
        await self.close()

    # -- reading -----------------------------------------------------------------

    async def next_message(self) -> str | None:
        """The next request message, answering pings meanwhile; None once the peer is gone."""
        while not self.inbox:
            if self.ended:
                return None
            await self.receive()
        return self.inbox.popleft()

    async def receive(self) -> None:
        """Read once from the socket and act on every event it completes."""
        try:
            data = await self.client.read()
        except ConnectionError:
            data = b""
        if not data:
            self.eof = True
            self.lost(EOF)
            return
        try:
            events = self.conn.receive(data)
        except ws.ProtocolError as err:
            self.close_with = (err.code, err.reason)
            self.lost(PROTOCOL_ERROR)
            return
        for event in events:
            self.handle(event)

    def handle(self, event: ws.WebSocketEvent) -> None:
        """Act on one event at once (no awaiting, so a cancelled watcher loses nothing)."""
        if isinstance(event, ws.Ping):
            if not self.conn.close_sent:
                self.client.send_nowait(self.conn.send_pong(event.payload))
        elif isinstance(event, ws.CloseReceived):
            code = event.code if ws.is_valid_close_code(event.code) else 1000
            self.close_with = (code, "")  # echo the peer's code, as RFC 6455 suggests
            self.lost(CLOSE_FRAME)
        elif isinstance(event, ws.BinaryMessage):
            self.close_with = (int(ws.CloseCode.UNSUPPORTED_DATA), "binary messages are not supported")
            self.lost(PROTOCOL_ERROR)
        elif isinstance(event, ws.TextMessage):
            if not _is_stop(event.text):
                self.inbox.append(event.text)
            elif self.job is not None:
                self.server.stop_job(self.job, STOP_MESSAGE)

    def lost(self, signal: str) -> None:
        """The peer will send nothing more: stop reading, and stop its generation."""
        self.ended = True
        if self.job is not None:
            self.server.stop_job(self.job, signal)

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Read frames while the answer streams: pings, stop, close, EOF (not in naive mode)."""
        if self.server.config.naive:
            yield
            return

        async def watch() -> None:
            while not self.ended:
                await self.receive()

        async with in_background(watch()):
            yield

    # -- answering ---------------------------------------------------------------

    async def send_json(self, obj: Any) -> None:
        await self.client.send(self.conn.send_text(_json(obj)))

    def take_id(self) -> str:
        request_id, self.next_id = self.next_id, None
        return request_id or self.server.new_id()

    async def answer(self, text: str) -> bool:
        """Serve one request message; True if the client asked to keep the socket open for more."""
        try:
            req = parse_generation_request(text)
            job = self.server.start_job("/ws", req, self.take_id())
        except HTTPError as err:  # a bad request, or a conversation_id we do not have
            await self.send_json(_error_body(err.status, err.message))
            self.close_with = (int(ws.CloseCode.POLICY_VIOLATION), "bad request")
            return False
        self.job = job
        try:
            async with self.watching():
                await self._send_pieces(job)
        except ClientGone as gone:
            self.server.stop_job(job, gone.signal)
            self.ended = self.eof = True
        finally:
            self.job = None
            await self.server.finish(job)
        if self.ended:
            return False
        result = job.generation.result
        assert result is not None
        if result.stop_reason == ERROR:
            error = _error_body(500, f"generation failed: {result.error}")
            await self.send_json({**error, "id": job.record.id, **_ids(job)})
            self.close_with = (int(ws.CloseCode.INTERNAL_ERROR), "generation failed")
            return False
        done = {"done": True, "stop_reason": result.stop_reason, "tokens": result.tokens, "id": job.record.id}
        await self.send_json({**done, **_ids(job)})
        return req.keep_open

    async def _send_pieces(self, job: Job) -> None:
        async with aclosing(pieces_or_pings(job.generation, self.server.config.ping_interval)) as items:
            async for piece in items:
                if self.ended:  # the peer sent CLOSE: no more data frames
                    return
                if piece is None:
                    await self.client.send(self.conn.send_ping(b"keepalive"))
                else:
                    await self.client.send(self.conn.send_text(_json({"text": piece.text})))
                    job.record.pieces_sent += 1
                    self.server.keep(job, piece)

    # -- closing -----------------------------------------------------------------

    async def close(self) -> None:
        """The closing handshake: send CLOSE (echoing theirs), await theirs briefly, close TCP."""
        if not self.eof and not self.conn.close_sent:
            code, reason = self.close_with
            with suppress(ClientGone):
                await self.client.send(self.conn.send_close(code, reason))
            if not self.conn.close_received:
                await self._await_peer_close()
        await self.client.close()

    async def _await_peer_close(self) -> None:
        deadline = time.monotonic() + WS_CLOSE_WAIT
        while not self.conn.close_received and (left := deadline - time.monotonic()) > 0:
            try:
                data = await self.client.read(left)
            except (asyncio.TimeoutError, ConnectionError):
                return
            if not data:
                return
            with suppress(ws.ProtocolError):  # after an error the stream is past reading
                self.conn.receive(data)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m streamlab serve", description="Serve the model over HTTP, SSE and WebSocket."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument(
        "--model",
        default=None,
        help="Hugging Face id or folder (default: STREAMLAB_MODEL or the embedded model)",
    )
    p.add_argument("--naive", action="store_true", help="never watch for departed clients")
    p.add_argument(
        "--ping-interval", type=float, default=15.0, help="keep-alive after this many silent seconds (0: off)"
    )
    p.add_argument(
        "--write-timeout",
        type=float,
        default=30.0,
        help="give up on a write after this many seconds (0: never)",
    )
    p.add_argument("--no-accel-header", action="store_true", help="omit 'X-Accel-Buffering: no'")
    p.add_argument("--pause-after", type=int, default=None, metavar="N", help="go silent after token N ...")
    p.add_argument("--pause-seconds", type=float, default=0.0, metavar="S", help="... for S seconds")
    p.add_argument(
        "--fail-after", type=int, default=None, metavar="N", help="fail every generation after N tokens"
    )
    p.add_argument(
        "--token-delay", type=float, default=0.0, metavar="S", help="extra seconds per token (a slower model)"
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow this WebSocket Origin (repeatable)",
    )
    p.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (the parent died)"
    )
    p.add_argument(
        "--db",
        default=None,
        metavar="PATH",
        help="SQLite file of conversations (default: $STREAMLAB_DATA/streamlab.db, else your data folder)",
    )
    p.add_argument(
        "--flush-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="write partial answers to the file at most every S seconds (what a crash may lose)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="S",
        help="stop a /generations answer nobody has read for S seconds",
    )
    p.add_argument(
        "--forget",
        action="store_true",
        help="keep no /generations events: every reconnect generates the answer again",
    )
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    pauses = (
        {args.pause_after: args.pause_seconds}
        if args.pause_after is not None and args.pause_seconds > 0
        else {}
    )
    return ServerConfig(
        host=args.host,
        port=args.port,
        naive=args.naive,
        ping_interval=args.ping_interval,
        write_timeout=args.write_timeout,
        accel_header=not args.no_accel_header,
        pauses=pauses,
        fail_after=args.fail_after,
        token_delay=args.token_delay,
        allowed_origins=tuple(args.allowed_origin),
        db_path=args.db,
        flush_interval=args.flush_interval,
        grace=args.grace,
        forget=args.forget,
    )


def _on_stdin_eof(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Call ``callback`` when stdin closes: a parent that dies closes our stdin and takes us along."""

    def wait_for_eof() -> None:
        # os.read, not sys.stdin: a thread blocked inside the buffered reader
        # holds its lock, and the interpreter aborts on that lock at exit.
        with suppress(OSError):
            while os.read(sys.stdin.fileno(), 4096):
                pass
        with suppress(RuntimeError):  # the loop may already be closed
            loop.call_soon_threadsafe(callback)

    threading.Thread(target=wait_for_eof, name="stdin-eof", daemon=True).start()


async def serve(lm: Any, config: ServerConfig, *, exit_on_stdin_eof: bool = False) -> int:
    """Listen until SIGINT, SIGTERM (or stdin EOF); then stop everything and return 0."""
    server = Server(lm, config)
    await server.start()
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    if exit_on_stdin_eof:
        _on_stdin_eof(loop, stopping.set)
    # The runner waits for exactly this line.
    print(f"streamlab: listening on {server.url}", flush=True)
    await stopping.wait()
    await server.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m streamlab serve``: load the model once, then serve."""
    from .model import load_model

    args = parse_args(argv)
    with redirect_stdout(sys.stderr):  # stdout carries one line only: the one the runner waits for
        lm = load_model(args.model)
    print(
        f"streamlab: model {lm.name} on {lm.device} (loaded in {lm.load_seconds:.1f} s)",
        file=sys.stderr,
        flush=True,
    )
    return asyncio.run(serve(lm, config_from_args(args), exit_on_stdin_eof=args.exit_on_stdin_eof))


if __name__ == "__main__":
    sys.exit(main())
