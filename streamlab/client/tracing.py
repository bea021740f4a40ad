"""What one request looked like from the reader's side: a ``Trace``.

A trace holds what a client observed, every ``recv`` with its time and size
and every event the reader got (text, end marker, ping, error, close), with
the properties computed from them: bytes on the wire per byte of text, the
gaps between pieces of text, one row for a table. Times are seconds since the
request was written.

The recorders here turn the bytes a reader received into trace entries, with
no sockets (like the protocol modules they build on): ``ResponseRecorder``
for an HTTP response, plain or an event stream, and ``record_message`` for
one WebSocket message. ``streamlab.client.timed`` does the I/O around them.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from streamlab.protocol import sse
from streamlab.protocol.http_body import BodyReader, IncompleteBody
from streamlab.protocol.http_head import FinalResponseParser, Response

__all__ = ["ResponseRecorder", "Trace", "TraceEvent", "last_id", "record_message"]


@dataclass
class TraceEvent:
    """One event as the reader got it.

    ``t`` is seconds since the request was written; ``kind`` is ``text``,
    ``end``, ``done``, ``ping``, ``error``, ``close``...; ``nbytes`` is the
    event's size as encoded on the wire (an SSE event without its chunk
    framing, a whole WebSocket frame), where known; ``data`` the parsed JSON;
    ``id`` the stream's last event id when it arrived (SSE ids are sticky),
    None on a stream without ids: what a reconnect sends as ``Last-Event-ID``.
    """

    t: float
    kind: str
    text: str = ""
    nbytes: int | None = None
    data: Any = None
    id: str | None = None


@dataclass
class Trace:
    """Everything one request did on the wire, with times relative to ``sent``.

    ``complete`` is True only when the end marker arrived (``[DONE]``, the
    WebSocket ``done`` message, or a whole ``/complete`` body): a connection
    that just closes looks like a finished answer to many clients, and is
    recorded here as truncated. ``left`` is True when this client walked
    away on purpose (``stop_after``, ``leave_after``).

    On an event stream, ``last_event_id`` is the spec's *last event ID
    string* where reading stopped (None when empty): the id of the last
    block a blank line completed, what a reconnect sends as
    ``Last-Event-ID``; an ``id:`` in a block the stream cut off never
    counts. ``retry`` is the latest reconnection time the stream set, in
    milliseconds (None: it set none).
    """

    way: str
    sent: float = 0.0
    chunks: list[tuple[float, int]] = field(default_factory=list)
    events: list[TraceEvent] = field(default_factory=list)
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    request_id: str | None = None
    text: str = ""
    stop_reason: str | None = None
    tokens: int | None = None
    complete: bool = False
    left: bool = False
    error: Any = None
    close_code: int | None = None
    body: bytes = b""
    first_byte: float | None = None
    first_text: float | None = None
    end: float | None = None
    total_bytes: int = 0
    last_event_id: str | None = None
    retry: int | None = None

    @property
    def text_bytes(self) -> int:
        """Bytes of text the reader got, in UTF-8."""
        return len(self.text.encode("utf-8"))

    @property
    def ratio(self) -> float:
        """Bytes on the wire per byte of text: the price of each way of delivering."""
        return self.total_bytes / self.text_bytes if self.text_bytes else float("nan")

    @property
    def text_events(self) -> list[TraceEvent]:
        return [e for e in self.events if e.kind == "text" and e.text]

    def gaps(self) -> list[float]:
        """Seconds between consecutive text events: what the reader feels as stutter."""
        times = [e.t for e in self.text_events]
        return [b - a for a, b in zip(times, times[1:])]

    def summary(self) -> dict[str, Any]:
        """One row for a table."""
        return {
            "way": self.way,
            "status": self.status,
            "first_text_s": self.first_text,
            "end_s": self.end,
            "text_events": len(self.text_events),
            "total_bytes": self.total_bytes,
            "text_bytes": self.text_bytes,
            "ratio": self.ratio,
            "stop_reason": self.stop_reason,
            "complete": self.complete,
        }

    # -- recording (used while reading) ------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self.sent

    def got_bytes(self, nbytes: int) -> float:
        """Record one ``recv``; return its time."""
        t = self.now()
        self.chunks.append((t, nbytes))
        self.total_bytes += nbytes
        if self.first_byte is None:
            self.first_byte = t
        return t

    def got_event(
        self, t: float, kind: str, text: str = "", nbytes: int | None = None, data: Any = None
    ) -> None:
        self.events.append(TraceEvent(t, kind, text, nbytes, data))
        if text:
            self.text += text
            if self.first_text is None:
                self.first_text = t

    def got_end(self, t: float, info: Any) -> None:
        """The end marker, with whatever it says about how the answer ended."""
        if isinstance(info, dict):
            self.stop_reason = info.get("stop_reason", self.stop_reason)
            self.tokens = info.get("tokens", self.tokens)
            self.request_id = info.get("id") or self.request_id
        self.end = t

    def got_error(self, t: float, error: Any, nbytes: int | None = None) -> None:
        self.error = error.get("error", error) if isinstance(error, dict) else error
        self.stop_reason = "error"
        self.got_event(t, "error", nbytes=nbytes, data=error)

    def got_head(self, response: Response) -> None:
        self.status = response.status
        self.headers = dict(response.headers)
        self.request_id = self.headers.get("x-request-id")

    def finish(self) -> None:
        """Reading is over: without an end marker, the answer ended with the last bytes."""
        if self.end is None and self.chunks:
            self.end = self.chunks[-1][0]

    def cut_after(self, pieces: int) -> None:
        """The connection lost right after the reader's ``pieces``-th piece of text, as a failed network loses it.

        One ``recv`` often carries several events (a reader that fell behind,
        a stream that resumes with a backlog); a drop between two of them loses
        the later ones, which never reached the reader. So everything after
        that piece goes: its events and bytes, the end marker, how it ended.
        The last event id is the last one kept, what a reconnect sends.
        """
        texts = [i for i, e in enumerate(self.events) if e.kind == "text" and e.text]
        if len(texts) < pieces or pieces < 1:
            return
        kept = self.events[:texts[pieces - 1] + 1]
        at = kept[-1].t
        self.events = kept
        self.chunks = [c for c in self.chunks if c[0] <= at]
        self.total_bytes = sum(n for _, n in self.chunks)
        self.text = "".join(e.text for e in kept if e.kind == "text")
        ids = [e.id for e in kept if e.id is not None]
        if ids:
            self.last_event_id = ids[-1] or None
        self.complete, self.left, self.end = False, True, None
        self.stop_reason = self.tokens = self.error = self.close_code = None
        self.finish()


def piece_text(data: Any) -> str | None:
    """The text an event carries, in any of the formats the server speaks; None when it carries none.

    streamlab's ``{"text"}``, OpenAI's ``choices[0].delta.content``,
    Anthropic's ``content_block_delta`` with a ``text_delta``, and the
    Responses API's ``response.output_text.delta`` (its other typed events
    carry none: ``response.output_text.done`` repeats the whole text).
    """
    if not isinstance(data, dict):
        return None
    kind = data.get("type")
    if isinstance(kind, str) and kind.startswith("response."):
        return data.get("delta") if kind == "response.output_text.delta" else None
    if isinstance(data.get("text"), str):
        return data["text"]
    choice = _first_choice(data)
    if choice is not None:
        content = (choice.get("delta") or {}).get("content")
        return content if isinstance(content, str) and content else None
    delta = data.get("delta")
    if data.get("type") == "content_block_delta" and isinstance(delta, dict) and delta.get("type") == "text_delta":
        return delta.get("text")
    return None


def whole_text(data: Any) -> str | None:
    """The text of a whole answer: ours (``text``), OpenAI's (``choices[0].message``), Anthropic's (``content``),
    a response's (its ``output`` messages' ``output_text`` parts)."""
    if not isinstance(data, dict):
        return None
    if data.get("object") == "response" and isinstance(data.get("output"), list):
        return "".join(part.get("text", "") for item in data["output"] if isinstance(item, dict)
                       for part in item.get("content") or () if isinstance(part, dict))
    if isinstance(data.get("text"), str):
        return data["text"]
    choice = _first_choice(data)
    if choice is not None:
        return (choice.get("message") or {}).get("content")
    content = data.get("content")
    if isinstance(content, list):
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return None


RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")


def response_ending(response: Any) -> str | None:
    """How a response ended, in its own words: ``completed``, or the reason it is incomplete (``max_output_tokens``)."""
    if not isinstance(response, dict):
        return None
    details = response.get("incomplete_details")
    return details.get("reason") if isinstance(details, dict) and details.get("reason") else response.get("status")


def _first_choice(data: dict) -> dict | None:
    """OpenAI's ``choices[0]``, when the object has one."""
    choices = data.get("choices")
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None


def _finish_reason(data: Any) -> str | None:
    choice = _first_choice(data) if isinstance(data, dict) else None
    return None if choice is None else choice.get("finish_reason")


def last_id(trace: Trace) -> str | None:
    """What a reconnect after ``trace`` sends as ``Last-Event-ID`` (None: no header at all).

    The stream's last event ID string, as an ``EventSource`` keeps it: set
    by the last *dispatched* block with an ``id:`` (one with no data
    counts too), emptied by an empty ``id:``, never by a block the stream
    cut off before its blank line.
    """
    return trace.last_event_id or None


# --------------------------------------------------------------------------
# Recorders: bytes received in, trace entries out (no sockets)
# --------------------------------------------------------------------------


class ResponseRecorder:
    """Response bytes in, trace entries out: head, then body, then SSE events if it is a stream.

    ``feed(data, t)`` takes what one ``recv`` returned and its time;
    ``eof()`` says the server closed. ``done`` turns True once the body is
    whole; ``raw`` is the body so far, de-chunked and, for a
    ``Content-Encoding: gzip`` body, decompressed as it comes, as a browser
    does (``trace.chunks`` keep the bytes as they crossed the wire).
    """

    def __init__(self, trace: Trace, method: str = "POST", *, last_event_id: str | None = None) -> None:
        self.trace = trace
        self.method = method
        # The id this request sent as Last-Event-ID: an event stream's ids start from it, as a browser's do.
        self.last_event_id = last_event_id
        if last_event_id:
            trace.last_event_id = last_event_id
        self.head = FinalResponseParser()  # "100 Continue" and friends are interim: the real response follows
        self.body: BodyReader | None = None
        self.events: sse.EventStreamParser | None = None
        self.decoder: Any = None
        self.raw = bytearray()
        self.done = False

    def feed(self, data: bytes, t: float) -> None:
        if self.body is None:
            response = self.head.feed(data)
            if response is None:
                return
            data = self.head.rest
            self.trace.got_head(response)
            self.body = BodyReader(response, self.method)
            if (response.header("content-encoding") or "").strip().lower() in ("gzip", "x-gzip"):
                self.decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            # Only a 200 carries events: a browser's EventSource fails any other
            # status without reading its body (wpt request-status-error), and the
            # SDKs raise on the status first.
            if response.status == 200 and sse.is_event_stream(response.header("content-type")):
                self.events = sse.EventStreamParser(last_event_id=self.last_event_id or "")
                self.trace.way = "stream"
        for piece in self.body.feed(data):
            if self.decoder is not None:
                piece = self.decoder.decompress(piece)
            self.raw += piece
            if self.events is not None:
                self._feed_events(piece, t)
        if self.body.done:
            self._body_done(t)

    def _feed_events(self, piece: bytes, t: float) -> None:
        assert self.events is not None
        comments = self.events.comments
        for event in self.events.feed(piece):
            recorded = len(self.trace.events)
            self._on_event(event, t)
            if event.id and len(self.trace.events) > recorded:
                self.trace.events[-1].id = event.id
        for _ in range(self.events.comments - comments):
            self.trace.got_event(t, "ping", data=self.events.last_comment)
        self.trace.last_event_id = self.events.last_event_id or None
        if self.events.retry is not None:
            self.trace.retry = self.events.retry

    def _on_event(self, event: sse.Event, t: float) -> None:
        trace = self.trace
        nbytes = len(sse.encode_event(event.data, event=None if event.event == "message" else event.event))
        if event.event == "message" and event.data == sse.DONE:
            trace.complete = True
            trace.got_event(t, "done", nbytes=nbytes)
            trace.end = t
            return
        try:
            data = json.loads(event.data)
        except ValueError:
            data = event.data
        text = piece_text(data)
        if event.event in RESPONSE_ENDS:  # the Responses API's last event: the final response, how it ended
            response = data.get("response") if isinstance(data, dict) else None
            if event.event == "response.failed":
                trace.got_error(t, (response or {}).get("error") or data, nbytes)
                return
            trace.got_event(t, "end", nbytes=nbytes, data=data)
            trace.got_end(t, {"stop_reason": response_ending(response)})
            trace.complete = True
        elif event.event in ("end", "message_delta"):  # ours; Anthropic's (its stop_reason)
            trace.got_event(t, "end", nbytes=nbytes, data=data)
            trace.got_end(t, data)
        elif event.event == "error" or (isinstance(data, dict) and "error" in data):  # OpenAI's has no name
            trace.got_error(t, data, nbytes)
        elif text is not None:
            trace.got_event(t, "text", text, nbytes, data)
        elif event.event == "message_stop":
            trace.complete = True
            trace.got_event(t, "done", nbytes=nbytes, data=data)
            trace.end = t
        elif _finish_reason(data) is not None:  # OpenAI's last chunk: an empty delta and how it ended
            trace.got_event(t, "end", nbytes=nbytes, data=data)
            trace.got_end(t, data)
        else:
            trace.got_event(t, event.event, nbytes=nbytes, data=data)

    def _body_done(self, t: float) -> None:
        self.done = True
        trace = self.trace
        trace.body = bytes(self.raw)
        if self.events is not None:
            return
        try:
            data = json.loads(trace.body) if trace.body else None
        except ValueError:
            data = trace.body
        text = whole_text(data)
        if trace.status == 200 and text is not None:
            trace.got_event(t, "text", text, len(trace.body), data)
            trace.got_end(t, data)
            trace.complete = True
        elif trace.status is not None and trace.status >= 400:
            trace.got_error(t, data, len(trace.body))

    def eof(self) -> None:
        """The server closed: a close-delimited body ends here; any other is truncated."""
        if self.body is None or self.done:
            return
        try:
            self.body.eof()
        except IncompleteBody:
            return
        self._body_done(self.trace.now())


def record_message(trace: Trace, text: str, nbytes: int, t: float) -> None:
    """One WebSocket text message (``nbytes`` with its frame): a piece, the ``done`` end, or an error."""
    try:
        data = json.loads(text)
    except ValueError:
        data = text
    if not isinstance(data, dict):
        trace.got_event(t, "message", nbytes=nbytes, data=data)
    elif "text" in data:
        trace.got_event(t, "text", data["text"], nbytes, data)
    elif data.get("done"):
        trace.complete = True
        trace.got_event(t, "done", nbytes=nbytes, data=data)
        trace.got_end(t, data)
    elif "error" in data:
        trace.request_id = data.get("id") or trace.request_id
        trace.got_error(t, data, nbytes)
    else:
        trace.got_event(t, "message", nbytes=nbytes, data=data)
