"""The ways a hop forwards a response body: bytes in, bytes to write out, no sockets.

Every hop of chapters 6, 10 and 12 is one forwarding loop (``proxy.py``)
with a different forwarder in it, so what makes one hop differ from another
is here, where a test can feed it plain byte strings:

- ``BlockBuffer``: the worst buffering hop, whole blocks only;
- ``PassThrough``: every byte at once, what ``X-Accel-Buffering: no`` asks for;
- ``WholeResponse``: a runtime that hands the response over when it is done;
- ``CuttingForwarder``: a hop with a clock or a limit that ends an event
  stream *cleanly*, after N whole events, with the zero-length chunk;
- ``compress.Gzip``: a compressing middleware.

A forwarder sees the body de-chunked (the proxy reads the upstream's
framing with ``BodyReader``) and returns what to write: the proxy frames the
client's side as the forwarder's ``headers`` say, close-delimited unless a
forwarder asks for chunked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Protocol

from streamlab.hops.compress import Gzip, accepts_gzip, no_transform
from streamlab.protocol import sse
from streamlab.protocol.http_body import LAST_CHUNK, BodyReader, encode_chunk
from streamlab.protocol.http_head import Request, Response

__all__ = [
    "DEFAULT_BLOCK",
    "EXECUTION_LIMIT",
    "BlockBuffer",
    "CuttingForwarder",
    "EventSplitter",
    "Forwarder",
    "PassThrough",
    "WholeResponse",
    "choose_forwarder",
    "cut_event",
    "forwarder_for",
    "is_event_stream",
]

DEFAULT_BLOCK = 8192  # the original write-up's block; nginx's buffers are a page (4 or 8 KiB)
EXECUTION_LIMIT = "execution_limit"


class Forwarder(Protocol):
    """What the proxy's forwarding loop asks of a forwarder.

    ``headers`` are added to the client's head (and replace the upstream's
    of the same name); ``holds_head`` keeps even the head back until the
    first write; ``ended`` says the forwarder has ended the body itself, so
    the loop stops reading the upstream and closes it.
    """

    label: str
    headers: Sequence[tuple[str, str]]
    holds_head: bool
    ended: bool

    def feed(self, data: bytes) -> list[bytes]: ...

    def finish(self) -> bytes: ...


class _Holding:
    """A forwarder that holds bytes back: what it holds, and the rest handed over when the body ends."""

    headers: Sequence[tuple[str, str]] = ()
    holds_head = False
    ended = False

    def __init__(self) -> None:
        self._held = bytearray()

    @property
    def held(self) -> int:
        """Bytes received but not yet forwarded."""
        return len(self._held)

    def finish(self) -> bytes:
        """The body ended: return what is still held (maybe nothing)."""
        rest = bytes(self._held)
        self._held.clear()
        return rest


class BlockBuffer(_Holding):
    """Forward a body only in whole blocks: the worst buffering hop.

    Bytes are held until ``block`` of them are there; what is left when the
    body ends goes out with ``finish()``. An answer shorter than one block
    therefore reaches the reader in one piece, at the very end, however
    early the server sent its first word.
    """

    def __init__(self, block: int = DEFAULT_BLOCK) -> None:
        if block < 1:
            raise ValueError("block must be at least 1 byte")
        super().__init__()
        self.block = block
        self.label = f"buffering block={block}"

    def feed(self, data: bytes) -> list[bytes]:
        """Take body bytes; return the full blocks to write now (often none)."""
        self._held += data
        full = len(self._held) // self.block * self.block
        blocks = [bytes(self._held[i : i + self.block]) for i in range(0, full, self.block)]
        del self._held[:full]
        return blocks


class PassThrough:
    """Forward every byte as soon as it arrives: what ``X-Accel-Buffering: no`` asks for."""

    label = "passthrough"
    headers: Sequence[tuple[str, str]] = ()
    holds_head = False
    ended = False
    held = 0

    def feed(self, data: bytes) -> list[bytes]:
        return [bytes(data)] if data else []

    def finish(self) -> bytes:
        return b""


class WholeResponse(_Holding):
    """Hold the whole response, head included, and send it when it ends: a runtime that buffers.

    Some function runtimes collect what the handler returns and hand it to
    the platform's front door only when the handler is done: the reader's
    first event is the answer's end, whatever the handler streamed.
    """

    label = "whole response"
    holds_head = True

    def feed(self, data: bytes) -> list[bytes]:
        self._held += data
        return []


_AFTER_LINE_BREAK = re.compile(rb"(?<=[\r\n])")


class EventSplitter:
    """Cut the raw bytes of an event stream where its events end, as the SSE parser sees it.

    A hop that passes "whole events" must know where one ends, and that is
    the parser's business, not a regular expression's (three line endings,
    CRLF split across reads, comments, fields without data). Bytes are fed
    to ``sse.EventStreamParser`` a line at a time; wherever the parser is
    back between events, the bytes since the last such place are a block,
    returned with the events it dispatched (none, for a comment). What is
    not yet a block is ``held``. A line longer than the parser allows is no
    event stream: from there on everything passes as one block per feed,
    dispatching nothing.
    """

    def __init__(self) -> None:
        self._parser: sse.EventStreamParser | None = sse.EventStreamParser()
        self._held = bytearray()

    @property
    def held(self) -> int:
        """Bytes of a block not yet complete."""
        return len(self._held)

    def feed(self, data: bytes) -> list[tuple[bytes, list[sse.Event]]]:
        """Take stream bytes; return each block they completed, with its events."""
        if self._parser is None:
            return [(bytes(data), [])] if data else []
        blocks = []
        events: list[sse.Event] = []
        lines = _AFTER_LINE_BREAK.split(data)
        for i, line in enumerate(lines):
            self._held += line
            try:
                events += self._parser.feed(line)
            except sse.ProtocolError:
                self._parser = None
                blocks.append((bytes(self._held) + b"".join(lines[i + 1 :]), []))
                self._held.clear()
                break
            if line.endswith((b"\r", b"\n")) and not self._parser.pending:
                blocks.append((bytes(self._held), events))
                self._held.clear()
                events = []
        return blocks

    def rest(self) -> bytes:
        """The stream ended: the bytes of the block it left unfinished."""
        rest = bytes(self._held)
        self._held.clear()
        return rest


def _every_event(event: sse.Event) -> bool:
    return True


class CuttingForwarder:
    """Pass an event stream on in whole events; after ``cut_after`` of them, end the body cleanly.

    What a platform with a time limit, or a proxy that gives up, does to a
    stream: the reader gets the head, whole events, then the zero-length
    chunk, a body that is well formed and complete as far as HTTP can tell.
    Only the missing terminator (``end``, ``finish_reason`` and ``[DONE]``,
    ``message_stop``) gives the cut away. The body goes out chunked for that
    reason: a close-delimited body has no clean end to forge.

    An event split across reads is held until it is whole (``EventSplitter``),
    so the cut never falls inside one. ``counts`` says which events count
    towards the cut (every event by default; chapter 10 counts those that
    carry text); comments never do.
    """

    headers: Sequence[tuple[str, str]] = (("Transfer-Encoding", "chunked"),)
    holds_head = False

    def __init__(self, cut_after: int, counts: Callable[[sse.Event], bool] | None = None) -> None:
        if cut_after < 1:
            raise ValueError("cut_after must be at least 1 event")
        self.cut_after = cut_after
        self.counts = counts or _every_event
        self.label = f"cutting after={cut_after}"
        self.counted = 0
        self.ended = False  # the cut was made: nothing more is forwarded
        self._events = EventSplitter()
        self._finished = False

    @property
    def held(self) -> int:
        """Bytes of an event not yet complete."""
        return self._events.held

    def feed(self, data: bytes) -> list[bytes]:
        """Take body bytes; return one chunk of the whole events among them, ending the body at the cut."""
        if self.ended:
            return []
        ready = bytearray()
        for block, events in self._events.feed(data):
            ready += block
            self.counted += sum(1 for event in events if self.counts(event))
            if self.counted >= self.cut_after:
                self.ended = True
                return [encode_chunk(bytes(ready)) + LAST_CHUNK]
        return [encode_chunk(bytes(ready))] if ready else []

    def finish(self) -> bytes:
        """The upstream's body ended first: what is held, then the last chunk (nothing, after a cut)."""
        if self.ended or self._finished:
            return b""
        self._finished = True
        return encode_chunk(self._events.rest()) + LAST_CHUNK


def is_event_stream(response: Response) -> bool:
    """Whether the body is an event stream: the one kind of body a cutting hop can end between events."""
    return (response.header("content-type") or "").strip().lower().startswith("text/event-stream")


def choose_forwarder(response: Response, *, block: int, honor: bool) -> BlockBuffer | PassThrough:
    """Pick the mode for one response, as nginx does: per response, from its head.

    Only the upstream knows that a response is a stream, so it is the one
    that asks, with ``X-Accel-Buffering: no``. Whether the proxy listens is
    its own configuration: nginx does by default, this proxy with ``--honor``.
    """
    if honor and (response.header("x-accel-buffering") or "").strip().lower() == "no":
        return PassThrough()
    return BlockBuffer(block)


class Options(Protocol):
    """The proxy's options a forwarder depends on (``proxy.ProxyConfig`` has them all)."""

    block: int
    honor: bool
    gzip: str
    buffer_response: bool
    cut_after: int | None
    counts: Callable[[sse.Event], bool] | None


def forwarder_for(request: Request, response: Response, config: Options) -> Forwarder:
    """The forwarder for one response, every option of the proxy in one place.

    A buffering runtime holds everything; a cutting hop cuts event streams
    that have a body (other responses pass as they would without it); a
    compressing hop compresses for a reader that accepts gzip, a body not
    already encoded, unless it honours the server's ``Cache-Control:
    no-transform``; else blocks or passthrough.
    """
    if config.buffer_response:
        return WholeResponse()
    if config.cut_after is not None and is_event_stream(response) and BodyReader(response, request.method).mode != "none":
        return CuttingForwarder(config.cut_after, config.counts)
    if (
        config.gzip != "off"
        and accepts_gzip(request)
        and response.header("content-encoding") is None
        and not (config.honor and no_transform(response))
    ):
        return Gzip(flush=config.gzip == "flush")
    if config.block == 1:
        return PassThrough()  # a block of one byte is no buffering: pass whole reads on, not byte by byte
    return choose_forwarder(response, block=config.block, honor=config.honor)


def cut_event(limit: float) -> bytes:
    """The SSE event a platform that says why it cut writes last: ``event: error`` naming the limit.

    Without it, the reader sees the body simply stop, like any truncation;
    with it, a client (ours, the official SDKs) reports an error it can name.
    """
    error = {"type": EXECUTION_LIMIT, "message": f"the function ran for its limit of {limit:g} s", "limit_s": limit}
    return sse.encode_event(json.dumps({"error": error}), event="error")
