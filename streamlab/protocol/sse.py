"""Server-Sent Events, written out: encode events, parse an event stream.

An event stream (``Content-Type: text/event-stream``) is UTF-8 text made of
*lines*. Lines of the form ``field: value`` build up an event; a blank line
sends it ("dispatches" it, in the words of the WHATWG HTML standard, section
9.2 "Server-sent events"). A line that starts with ``:`` is a comment, which
servers send as a keep-alive so that idle proxies and load balancers do not
close the connection.

Everything here works on bytes and never touches a socket ("protocol without
I/O", like h11 and wsproto): the asyncio server, the raw-socket client and the
proxy all share these few functions, and the tests feed them plain byte
strings.

    >>> encode_event("Hello\\nworld", event="delta", id="7")
    b'event: delta\\nid: 7\\ndata: Hello\\ndata: world\\n\\n'
    >>> EventStreamParser().feed(b'data: Hi\\n\\n')
    [Event(data='Hi', event='message', id='', retry=None)]
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

__all__ = [
    "DONE",
    "MAX_LINE",
    "Event",
    "EventStreamParser",
    "ProtocolError",
    "encode_comment",
    "encode_done",
    "encode_event",
    "is_event_stream",
    "parse_events",
]

#: OpenAI-style end marker. The SSE format itself has no notion of "the
#: answer is complete": a stream that simply stops looks the same as a stream
#: that was cut off. Sending an explicit last event lets a client tell the two
#: apart (see PITFALLS.md, "A stream that ends without its end marker").
DONE = "[DONE]"

#: The longest line the parser buffers, in characters (after UTF-8 decoding,
#: line ending not counted): 1 MiB, like python-websockets' ``max_size``.
#: The format itself has no limit, but a parser must keep the unfinished line
#: until its line ending comes, so a peer that never sends a newline (a broken
#: upstream, a hostile one, or a binary file served as text/event-stream)
#: would otherwise make the buffer grow until the process runs out of memory.
#: Real events are far shorter: a token's worth of text, or a JSON chunk of a
#: few hundred bytes.
MAX_LINE = 1 << 20

# A retry value is a reconnection delay in milliseconds. Browsers read it
# into a 64-bit integer and ignore one that overflows (Chromium's
# ToUInt64Strict); so do we, which also keeps int() away from strings over
# the 4300 digits it refuses to convert.
_MAX_RETRY = (1 << 64) - 1

# The event-stream grammar knows exactly three line endings: CRLF, LF and a
# lone CR. ``str.splitlines()`` would be wrong here: it also splits on
# U+2028, U+0085, form feed, vertical tab and more, which are ordinary
# characters inside an SSE data line.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _split_lines(text: str) -> list[str]:
    """Split on exactly the line endings an event stream recognises."""
    return _LINE_BREAK.split(text)


def _field(name: str, value: str) -> str:
    """One ``name: value`` line.

    The parser strips exactly one space after the colon, so always writing
    one keeps a value that itself starts with a space intact.
    """
    return f"{name}: {value}\n" if value else f"{name}:\n"


def encode_event(
    data: str | None = None,
    *,
    event: str | None = None,
    id: str | None = None,  # noqa: A002 - the field is called "id" in the spec
    retry: int | None = None,
) -> bytes:
    """Encode one event as the bytes to write to the response body.

    Multi-line ``data`` becomes several ``data:`` lines, because a newline
    inside a line would end it; the client joins them back with ``\\n``. The
    blank line at the end is what makes the client deliver the event, so a
    server must write it (and flush) for the reader to see anything.

    ``event`` and ``id`` cannot be split that way: a line break in them would
    end the field early and let the rest be read as a new field (the SSE
    version of header injection), so they are refused. An ``id`` containing
    NUL would be silently ignored by every client, so it is refused too.
    ``retry`` tells the client how many milliseconds to wait before
    reconnecting. ``data=None`` writes no data line: such an event only sets
    ``id`` or ``retry`` and is never delivered to the application.
    """
    lines: list[str] = []
    if event is not None:
        if "\r" in event or "\n" in event:
            raise ValueError("an SSE event name cannot contain CR or LF")
        lines.append(_field("event", event))
    if id is not None:
        if "\r" in id or "\n" in id or "\0" in id:
            raise ValueError("an SSE id cannot contain CR, LF or NUL")
        lines.append(_field("id", id))
    if retry is not None:
        if isinstance(retry, bool) or not isinstance(retry, int) or retry < 0:
            raise ValueError("retry must be a non-negative integer (milliseconds)")
        lines.append(_field("retry", str(retry)))
    if data is not None:
        if "\n" in data or "\r" in data:
            lines.extend(_field("data", line) for line in _split_lines(data))
        else:  # one line (nearly every event): no need to split it
            lines.append(_field("data", data))
    lines.append("\n")  # the blank line: "dispatch the event now"
    return "".join(lines).encode("utf-8")


def encode_comment(text: str = "") -> bytes:
    """Encode a comment, e.g. ``b": ping\\n\\n"``.

    Clients ignore comments, which is exactly why they make a good
    keep-alive: the bytes reset every idle timer on the path (nginx, load
    balancers) without the application seeing an event. The trailing blank
    line is not needed by the format, but it keeps the stream at an event
    boundary, so a comment can be written between any two events.
    """
    body = "".join(f": {line}\n" if line else ":\n" for line in _split_lines(text))
    return (body + "\n").encode("utf-8")


def encode_done() -> bytes:
    """The end-of-answer marker event, ``data: [DONE]``."""
    return encode_event(DONE)


class ProtocolError(Exception):
    """The stream broke a limit the parser keeps (a line over ``max_line``).

    The event-stream format itself has no syntax errors: the WHATWG
    algorithm makes sense of any bytes (invalid UTF-8 becomes U+FFFD,
    unknown fields are ignored). What it cannot survive is unbounded input,
    so this is raised only for that. After it, the parser is unusable:
    every later ``feed`` raises it again, and the caller should drop the
    connection (and may reconnect, as ``EventSource`` would).
    """


@dataclass(frozen=True)
class Event:
    """One dispatched event, as a browser's ``EventSource`` would deliver it.

    ``id`` is the *last event ID string* at the moment the event was
    dispatched (a browser's ``MessageEvent.lastEventId``): ids are sticky, so
    an event without an ``id:`` line carries the id of an earlier one. That
    is the value a client sends back in ``Last-Event-ID`` when it
    reconnects. ``retry`` is the reconnection delay sent *with this
    event* (``None`` when the event had no valid ``retry:`` line); the
    parser's own ``retry`` attribute keeps the latest value.
    """

    data: str
    event: str = "message"
    id: str = ""
    retry: int | None = None


class EventStreamParser:
    """Incremental event-stream parser following the WHATWG rules.

    Bytes arrive from the network in arbitrary pieces: a piece may end in
    the middle of a UTF-8 character, between the CR and the LF of a line
    ending, or halfway through a field name. ``feed`` therefore keeps what it
    cannot interpret yet and returns only the events that are complete.

    Attributes a client can inspect:

    - ``last_event_id``: the spec's *last event ID string*, to send as
      ``Last-Event-ID`` when reconnecting (none at all when it is empty). An
      ``id:`` line only fills the *last event ID buffer*
      (``last_event_id_buffer``); the string takes the buffer's value when a
      blank line ends the block. So an id in a block the stream cut off
      before its blank line is never reported: its event was never
      delivered (web-platform-tests' ``format-data-before-final-empty-line``).
    - ``retry``: the latest reconnection time in milliseconds, or ``None``.
    - ``comments`` / ``last_comment``: how many comment lines were seen and
      the text of the latest one, which is how a test observes keep-alives.
    - ``pending``: whether an event has started but not been dispatched;
      true after ``close()`` means the stream was truncated mid-event.

    ``max_line`` bounds the line being buffered (see ``MAX_LINE``); a longer
    line raises ``ProtocolError`` as soon as it passes the limit, whether it
    arrives in one piece or byte by byte.

    ``last_event_id``: the id a reconnecting client already holds (the one
    it sent as ``Last-Event-ID``). Both values start from it, as browsers
    do, so events of the new connection that carry no ``id:`` keep it.
    """

    def __init__(self, *, max_line: int = MAX_LINE, last_event_id: str = "") -> None:
        self.max_line = max_line
        # A stateful decoder: it keeps the first bytes of a character that is
        # split across two network reads instead of turning them into U+FFFD.
        # Bytes that are really invalid still become U+FFFD, as the spec says.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_stream_start = True  # a BOM may only appear here
        # The current line, not yet terminated, kept as the pieces that came
        # in (joined once, when its line ending arrives: appending to one
        # string would copy it on every read and make slow input quadratic).
        self._line_parts: list[str] = []
        self._line_length = 0
        self._skip_lf = False  # the previous chunk ended with CR: a LF next is part of it
        self._closed = False
        self._error: ProtocolError | None = None

        # The buffers of the spec's "interpret an event stream" algorithm
        # (the data buffer as a list of lines, joined with LF on dispatch).
        self._data: list[str] = []
        self._event_type = ""
        self._event_retry: int | None = None
        self._in_event = False  # a field line arrived since the last blank line

        self.last_event_id_buffer = last_event_id  # set by an id: line
        self.last_event_id = last_event_id  # the buffer's value at the last blank line
        self.retry: int | None = None
        self.comments = 0
        self.last_comment: str | None = None

    @property
    def pending(self) -> bool:
        """True when part of an event has arrived but not its blank line."""
        partial = self._line_parts and not self._line_parts[0].startswith(":")
        return bool(self._in_event or partial)

    def feed(self, data: bytes) -> list[Event]:
        """Consume the next piece of the stream; return the events it completed.

        Raises ``ProtocolError`` when a line grows past ``max_line``; events
        completed earlier in the same piece are then not returned.
        """
        if self._closed:
            raise RuntimeError("feed() after close()")
        if self._error is not None:
            raise self._error
        try:
            return self._consume(self._decoder.decode(data))
        except ProtocolError as err:
            self._error = err
            raise

    def close(self) -> list[Event]:
        """Signal end of stream.

        The spec discards an event whose blank line never came, so this
        always returns an empty list. It is still worth calling: afterwards
        ``pending`` tells whether the server stopped in the middle of an
        event, i.e. the stream was truncated.
        """
        if not self._closed:
            # Flush the decoder: an incomplete character at EOF becomes U+FFFD
            # and counts as part of an unfinished line.
            tail = self._decoder.decode(b"", final=True)
            if tail:
                self._line_parts.append(tail)
            self._closed = True
        return []

    def _consume(self, text: str) -> list[Event]:
        if self._at_stream_start and text:
            # One U+FEFF at the very start of the stream is a byte order mark,
            # not content. Anywhere else it is an ordinary character.
            self._at_stream_start = False
            if text.startswith("\ufeff"):
                text = text[1:]
        if self._skip_lf and text:
            # We already ended a line at a CR that closed the previous chunk.
            # If this chunk starts with LF, that LF belonged to the same
            # CRLF and must not end a second (blank!) line.
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]

        events: list[Event] = []
        # Only the new text is searched: the unfinished line cannot hold a
        # line break, or it would have been finished already.
        pieces = _LINE_BREAK.split(text)
        # Every piece but the last ended with a line break; the last one is
        # an unfinished line that waits for more bytes.
        tail = pieces.pop()
        for piece in pieces:
            self._check_length(self._line_length + len(piece))
            if self._line_parts:
                self._line_parts.append(piece)
                line = "".join(self._line_parts)
                self._line_parts, self._line_length = [], 0
            else:
                line = piece
            event = self._process_line(line)
            if event is not None:
                events.append(event)
        if tail:
            # Checked before buffering: the buffer never holds more than max_line.
            self._check_length(self._line_length + len(tail))
            self._line_parts.append(tail)
            self._line_length += len(tail)
        # A CR at the very end may be the first half of CRLF. We end the line
        # right away (no waiting: a lone CR is a complete line ending) and
        # remember to drop a LF that may start the next chunk.
        if text.endswith("\r"):
            self._skip_lf = True
        return events

    def _check_length(self, length: int) -> None:
        if length > self.max_line:
            raise ProtocolError(f"line of over {self.max_line} characters without a line ending")

    def _process_line(self, line: str) -> Event | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            comment = line[1:]
            self.last_comment = comment[1:] if comment.startswith(" ") else comment
            return None
        self._in_event = True
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]  # exactly one space, never more
        if name == "event":
            self._event_type = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self.last_event_id_buffer = value
        elif name == "retry":
            # Only plain ASCII digits count; "1e3", "-5" or " 5" are ignored.
            # So are values that do not fit in 64 bits, as browsers do.
            if value and value.isascii() and value.isdigit():
                digits = value.lstrip("0") or "0"
                if len(digits) <= 20 and int(digits) <= _MAX_RETRY:
                    self.retry = self._event_retry = int(digits)
        # Any other field name is ignored, so the format can grow.
        return None

    def _dispatch(self) -> Event | None:
        # The first step of the spec's "dispatch the event", taken for every
        # blank line, even one that delivers nothing: the id becomes the one
        # a reconnect sends back.
        self.last_event_id = self.last_event_id_buffer
        lines, event_type, retry = self._data, self._event_type, self._event_retry
        self._data, self._event_type, self._event_retry = [], "", None
        self._in_event = False
        if not lines:
            # e.g. a block with only "id:" or "retry:" lines: it updates the
            # parser state but is not delivered as an event.
            return None
        # The spec appends each value and a LF, then drops the last LF.
        data = "\n".join(lines)
        return Event(data=data, event=event_type or "message", id=self.last_event_id, retry=retry)


def is_event_stream(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` says ``text/event-stream``, as ``EventSource`` checks it.

    The MIME type's essence counts, case-insensitively; its parameters do
    not (``text/event-stream;`` and ``; charset=windows-1252`` are both an
    event stream, always read as UTF-8: web-platform-tests'
    ``format-mime-trailing-semicolon`` and ``format-utf-8``). Anything else
    (``text/x-bogus``, ``x bogus``, none at all) makes a browser fail the
    connection without reconnecting (``format-mime-valid-bogus``,
    ``format-mime-bogus``).
    """
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip(" \t").lower() == "text/event-stream"


def parse_events(data: bytes) -> list[Event]:
    """Parse a complete event stream held in memory (e.g. a recorded body)."""
    parser = EventStreamParser()
    events = parser.feed(data)
    events.extend(parser.close())
    return events
