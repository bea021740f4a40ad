"""The wire, shown (chapter 2): a raw event stream as it arrives, a WebSocket upgrade and one masked frame.

Every other experiment reads the wire through a parser and keeps what the
bytes mean. This one keeps the bytes. ``sse_wire`` opens a plain socket, asks
for a generation's events the way a browser's ``EventSource`` does, and keeps
every ``recv`` with the time it arrived: the status line, the head, each
chunk with its hex size, the ``retry:``, ``id:``, ``event:`` and ``data:``
lines, the ``: ping`` comments in a silence, the zero-size chunk at the end.
``websocket_wire`` does the same for ``/ws``: the key it sent, the
``Sec-WebSocket-Accept`` the server answered and the one we compute, and its
own first frame (the request, masked as every client must) and the server's
first frame, each laid out field by field (``protocol.anatomy``).

The explanations (``HEAD_WHY``, ``FRAME_WHY``) live here with the code that
shows them, so the chapter's tables and the tests read the same words.
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from streamlab.client.timed import _get_head, create_generation
from streamlab.client.wire import _close, _connect, _host_header, _recv
from streamlab.net.aio import run_sync
from streamlab.protocol import sse
from streamlab.protocol import websocket as ws
from streamlab.protocol import websocket_handshake
from streamlab.protocol.anatomy import Chunk, FrameLayout, frame_layout, split_chunks, visible
from streamlab.protocol.http_head import Response, ResponseHeadParser

__all__ = [
    "FRAME_WHY",
    "HEAD_WHY",
    "Read",
    "SSEWire",
    "WebSocketWire",
    "code_listing",
    "code_without_docstring",
    "print_read",
    "sse_wire",
    "sse_wire_sync",
    "websocket_wire",
    "websocket_wire_sync",
]

#: Why each field of our event stream's head is there (lowercased names).
HEAD_WHY = {
    "content-type": "what makes the body an event stream: a browser's EventSource refuses any other type, "
                    "and the charset says the lines are UTF-8",
    "cache-control": "no-store: no cache may keep a copy of the stream (no-cache alone would let one store it and "
                     "serve it again after checking back with the server); "
                     "no-transform: no hop may rewrite it (a gzip middleware would buffer it into one late block)",
    "x-accel-buffering": "nginx's own header: pass each write on at once instead of filling a buffer first "
                         "(chapter 6 measures what happens without it)",
    "transfer-encoding": "chunked: the length is not known when the head leaves, so each write travels as a "
                         "chunk with its size in front, and a chunk of size 0 ends the body",
    "connection": "close: this server closes the connection after this body, and says so, so that a client "
                  "that pools connections does not send its next request down this one",
    "x-generation-id": "ours: the generation to read again after a drop (GET /generations/{id}/events)",
    "x-request-id": "ours: the record of this request in the server's /log",
    "x-conversation-id": "ours: the conversation this answer belongs to",
    "x-message-id": "ours: the stored message this answer is written into",
}

#: What each field of a WebSocket frame header says (RFC 6455 section 5.2).
FRAME_WHY = {
    "FIN": "1: this frame is the whole message (0 would mean more fragments follow)",
    "RSV1-3": "reserved for extensions; 0 unless one was agreed in the handshake",
    "opcode": "the frame's type: 1 text, 2 binary, 8 close, 9 ping, 10 pong, 0 a continuation",
    "MASK": "1 on every frame from a client, 0 on every frame from a server",
    "payload length": "7 bits: 0-125 is the length itself; 126 or 127 say a 16- or 64-bit length follows",
    "masking key": "4 random bytes, new for each frame: the payload is XORed with them, byte i with key[i % 4]",
    "payload": "the message, as sent (masked) and as meant",
}


@dataclass(frozen=True)
class Read:
    """One ``recv``: when it returned (seconds after the request was written) and its bytes."""

    t: float
    data: bytes


def print_read(read: Read, number: int | None = None) -> None:
    """Print one read as a reader can see it: its time, its size, each line with its CR and LF written out."""
    label = f"read {number}, " if number is not None else ""
    print(f"+{read.t:6.3f} s  {label}{len(read.data)} bytes")
    for line in visible(read.data):
        print(f"          {line}")


def _split_head(raw: bytes) -> tuple[bytes, bytes]:
    end = raw.find(b"\r\n\r\n")
    if end < 0:
        return raw, b""
    return raw[: end + 4], raw[end + 4 :]


def _arrival_times(reads: list[Read], offset: int, ends: list[int]) -> list[float]:
    """The time the byte at each position of ``ends`` (counted from ``offset`` in the joined reads) arrived."""
    times, at, index = [], 0, 0
    bounds = []
    for read in reads:
        at += len(read.data)
        bounds.append((at, read.t))
    for end in ends:
        position = offset + end
        while index < len(bounds) - 1 and bounds[index][0] < position:
            index += 1
        times.append(bounds[index][1])
    return times


@dataclass
class SSEWire:
    """A raw event-stream response: the request we wrote, every read, and the response laid out."""

    request: bytes
    reads: list[Read]
    head: Response | None = None
    head_bytes: bytes = b""
    chunks: list[Chunk] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)
    leftover: bytes = b""

    @classmethod
    def from_reads(cls, request: bytes, reads: list[Read]) -> SSEWire:
        raw = b"".join(r.data for r in reads)
        head_bytes, body = _split_head(raw)
        parser = ResponseHeadParser()
        head = parser.feed(head_bytes) if body or head_bytes.endswith(b"\r\n\r\n") else None
        chunks, leftover = split_chunks(body) if head is not None and head.header("transfer-encoding") else ([], body)
        ends, at = [], 0
        for chunk in chunks:
            at += len(chunk.wire)
            ends.append(at)
        times = _arrival_times(reads, len(head_bytes), ends)
        return cls(request, reads, head, head_bytes, chunks, times, leftover)

    @property
    def status_line(self) -> str:
        return self.head_bytes.split(b"\r\n", 1)[0].decode("latin-1")

    @property
    def body(self) -> bytes:
        """The event stream itself: the chunks' data joined."""
        return b"".join(c.data for c in self.chunks)

    @property
    def events(self) -> list[sse.Event]:
        return sse.parse_events(self.body)

    def field_rows(self) -> list[dict[str, str]]:
        """The head, a row per field, each with why it is there."""
        lines = self.head_bytes.decode("latin-1").split("\r\n")[1:]
        fields = [line.partition(":") for line in lines if line]
        return [{"field": name, "value": value.strip(), "why it is there": HEAD_WHY.get(name.lower(), "")}
                for name, _, value in fields]

    def chunk_rows(self) -> list[dict[str, Any]]:
        """Each chunk: when it arrived, its size line as sent, its size, and which SSE lines it carries."""
        rows = []
        for chunk, t in zip(self.chunks, self.chunk_times):
            rows.append({"arrived (s)": t, "size line": chunk.size_line.decode("ascii").replace("\r\n", "\\r\\n"),
                         "size (bytes)": chunk.size, "lines": ", ".join(line_kinds(chunk.data)) or "end of body"})
        return rows

    def line_kinds(self) -> set[str]:
        """Every kind of line the stream used: ``data``, ``id``, ``event``, ``retry``, ``comment``."""
        return set(line_kinds(self.body))

    @property
    def ended(self) -> bool:
        """Whether the body ended with its zero-size chunk."""
        return bool(self.chunks) and self.chunks[-1].size == 0


def line_kinds(data: bytes) -> list[str]:
    """The kinds of event-stream lines in ``data``, in order of first appearance (blank lines left out)."""
    kinds: list[str] = []
    for line in data.decode("utf-8", "replace").split("\n"):
        if not line:
            continue
        kind = "comment" if line.startswith(":") else line.partition(":")[0]
        if kind not in kinds:
            kinds.append(kind)
    return kinds


async def _read_to_eof(
    port: int, request: bytes, *, host: str, timeout: float, on_read: Callable[[Read], None] | None
) -> list[Read]:
    reader, writer = await _connect(host, port, timeout)
    reads: list[Read] = []
    try:
        sent = time.perf_counter()
        writer.write(request)
        await writer.drain()
        while True:
            data = await _recv(reader, 65536, sent + timeout)
            if data is None:
                raise TimeoutError(f"the response did not end within {timeout} s")
            if not data:
                return reads
            reads.append(Read(time.perf_counter() - sent, data))
            if on_read is not None:
                on_read(reads[-1])
    finally:
        await _close(writer)


async def sse_wire(
    port: int,
    body: dict[str, Any],
    *,
    host: str = "127.0.0.1",
    timeout: float = 60.0,
    on_read: Callable[[Read], None] | None = None,
) -> SSEWire:
    """Start a generation (``POST /generations``) and read its events raw, to the end of the connection.

    Its events are the numbered, resumable ones: ``retry:`` on the first,
    ``id:`` on each, ``event:`` naming the ending. ``on_read`` is called
    with each read as it arrives (the chapter prints it there and then).
    """
    created = await create_generation(port, body, host=host, timeout=timeout)
    request = _get_head(created["events"], host, port, None)  # what an EventSource writes, plus Connection: close
    reads = await _read_to_eof(port, request, host=host, timeout=timeout, on_read=on_read)
    return SSEWire.from_reads(request, reads)


@dataclass
class WebSocketWire:
    """A raw WebSocket exchange: the upgrade both ways, our masked request frame, the server's first frame."""

    key: str
    request: bytes
    response_head: bytes
    status: int
    accept_sent: str | None
    client_frame: bytes
    server_bytes: bytes
    messages: list[str]
    close_code: int | None

    @property
    def accept_computed(self) -> str:
        return websocket_handshake.accept_key(self.key)

    @property
    def accept_matches(self) -> bool:
        return self.accept_sent == self.accept_computed

    @property
    def client_layout(self) -> FrameLayout:
        return frame_layout(self.client_frame)

    @property
    def server_layout(self) -> FrameLayout:
        return frame_layout(self.server_bytes)


def frame_rows(layout: FrameLayout) -> list[dict[str, str]]:
    """A frame, field by field: where it sits, its bits or bytes, its value, and what it says."""
    b0, b1 = layout.header[0], layout.header[1]
    rows = [
        {"field": "FIN", "where": "byte 0, bit 7", "on the wire": f"{b0 >> 7}", "value": str(layout.fin).lower(),
         "what it says": FRAME_WHY["FIN"]},
        {"field": "RSV1-3", "where": "byte 0, bits 6-4", "on the wire": f"{(b0 >> 4) & 7:03b}", "value": str(layout.rsv),
         "what it says": FRAME_WHY["RSV1-3"]},
        {"field": "opcode", "where": "byte 0, bits 3-0", "on the wire": f"{b0 & 0xF:04b}",
         "value": f"{layout.opcode} ({layout.opcode_name})", "what it says": FRAME_WHY["opcode"]},
        {"field": "MASK", "where": "byte 1, bit 7", "on the wire": f"{b1 >> 7}", "value": str(layout.masked).lower(),
         "what it says": FRAME_WHY["MASK"]},
        {"field": "payload length", "where": "byte 1, bits 6-0", "on the wire": f"{b1 & 0x7F:07b}",
         "value": f"{layout.length_field}", "what it says": FRAME_WHY["payload length"]},
    ]
    if layout.extended_length:
        rows.append({"field": "extended length", "where": f"next {len(layout.extended_length)} bytes",
                     "on the wire": layout.extended_length.hex(" "), "value": f"{layout.length} bytes",
                     "what it says": "the payload's real length, big-endian"})
    if layout.masked:
        rows.append({"field": "masking key", "where": "next 4 bytes", "on the wire": layout.mask_key.hex(" "),
                     "value": "", "what it says": FRAME_WHY["masking key"]})
    shown = layout.wire_payload[:12].hex(" ") + (" ..." if layout.length > 12 else "")
    rows.append({"field": "payload", "where": f"the last {layout.length} bytes", "on the wire": shown,
                 "value": _short(layout.payload.decode("utf-8", "replace")), "what it says": FRAME_WHY["payload"]})
    return rows


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def websocket_wire(
    port: int, body: dict[str, Any], *, host: str = "127.0.0.1", path: str = "/ws", timeout: float = 60.0
) -> WebSocketWire:
    """Upgrade ``/ws`` by hand, send ``body`` as one masked text frame, read the answer to the closing handshake."""
    key = websocket_handshake.new_key()
    request = websocket_handshake.client_handshake(_host_header(host, port), path, key)
    reader, writer = await _connect(host, port, timeout)
    deadline = time.perf_counter() + timeout
    conn = ws.Connection(client=True)
    messages: list[str] = []
    close_code = None
    frame = b""
    server_bytes = bytearray()
    try:
        writer.write(request)
        await writer.drain()
        parser, raw, response = ResponseHeadParser(), b"", None
        while response is None:
            data = await _recv(reader, 65536, deadline)
            if not data:
                raise ConnectionError("no answer to the WebSocket upgrade")
            raw += data
            response = parser.feed(data)
        head_bytes, rest = _split_head(raw)
        if response.status == 101:
            frame = conn.send_text(json.dumps(body, ensure_ascii=False))
            writer.write(frame)
            await writer.drain()
            pending = rest
            while not conn.close_received:
                if not pending:
                    pending = await _recv(reader, 65536, deadline)
                    if pending is None:
                        raise TimeoutError(f"the WebSocket answer did not end within {timeout} s")
                    if not pending:
                        break
                server_bytes += pending
                for event in conn.receive(pending):
                    if isinstance(event, ws.TextMessage):
                        messages.append(event.text)
                    elif isinstance(event, ws.Ping):
                        writer.write(conn.send_pong(event.payload))
                    elif isinstance(event, ws.CloseReceived):
                        close_code = event.code
                        if not conn.close_sent:
                            writer.write(conn.send_close(1000))
                pending = b""
    finally:
        await _close(writer)
    return WebSocketWire(key, request, head_bytes, response.status, response.header("sec-websocket-accept"),
                         frame, bytes(server_bytes), messages, close_code)


def code_listing(*objs: Any) -> str:
    """Several functions' real source, docstrings left out, each under a comment naming its module."""
    parts = []
    for obj in objs:
        module = inspect.getmodule(obj)
        where = module.__name__.replace(".", "/") + ".py" if module else "?"
        parts.append(f"# {where}\n" + code_without_docstring(obj))
    return "\n".join(parts)


def code_without_docstring(obj: Any) -> str:
    """``obj``'s real source with its docstring left out: the lines that do the work, for a chapter to show."""
    source = textwrap.dedent(inspect.getsource(obj))
    tree = ast.parse(source)
    node = tree.body[0]
    lines = source.splitlines()
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        doc = body[0]
        del lines[doc.lineno - 1 : doc.end_lineno]
    return "\n".join(lines) + "\n"


def sse_wire_sync(port: int, body: dict[str, Any], **kwargs: Any) -> SSEWire:
    """Synchronous ``sse_wire``, for scripts and notebooks."""
    return run_sync(sse_wire(port, body, **kwargs))


def websocket_wire_sync(port: int, body: dict[str, Any], **kwargs: Any) -> WebSocketWire:
    """Synchronous ``websocket_wire``, for scripts and notebooks."""
    return run_sync(websocket_wire(port, body, **kwargs))
