"""web-platform-tests' event-stream cases (``eventsource/format-*``), as a table our parser and client run.

web-platform-tests (web-platform-tests/wpt) is the suite every browser runs
to agree on the web platform; its ``eventsource/`` folder checks
``EventSource``. Each ``format-*`` test there has a server script answer
one fixed stream (``resources/message.py`` writes the ``message`` it is
given, then ``newline``, two LFs unless ``none``, then one more LF) and
asserts what the page receives: each event's ``data``, its type, its
``lastEventId``, and the reconnection that follows. Here each case is that
stream, byte for byte, with what the WHATWG algorithm ("interpret an
event stream", HTML section 9.2.6) makes of it:

- ``events``: ``(type, data, lastEventId)`` of every event dispatched;
- ``last_event_id``: the *last event ID string* once the stream ends,
  what a reconnect sends as ``Last-Event-ID`` (none when empty);
- ``retry``: the reconnection time it set, if any.

``run`` feeds a case to ``streamlab.protocol.sse.EventStreamParser`` whole,
split at every byte position, and one byte at a time, and to the client's
``ResponseRecorder`` the same three ways, checking the ``Last-Event-ID``
the client would send next. A case's ``id`` names the wpt file it follows;
``whatwg: ...`` cases follow a sentence of the standard instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamlab.client.tracing import ResponseRecorder, Trace, last_id
from streamlab.protocol import sse

__all__ = ["CASES", "WAYS", "StreamCase", "feeds", "run"]


@dataclass(frozen=True)
class StreamCase:
    id: str  # the web-platform-tests file it follows (eventsource/...), or the standard's step
    stream: bytes
    events: tuple[tuple[str, str, str], ...]  # (type, data, lastEventId) of each event dispatched
    last_event_id: str = ""  # the last event ID string at the end: what a reconnect sends
    retry: int | None = None  # the reconnection time the stream set (ms)
    seed: str = ""  # the id the client already had (it sent it as Last-Event-ID)
    comments: int | None = None  # comment lines, where the case is about them


def message(text: bytes, newline: bytes = b"\n\n") -> bytes:
    """What wpt's ``resources/message.py`` writes for ``message=text`` (``newline=none`` is ``b""``)."""
    return text + newline + b"\n"


def msg(data: str, id: str = "", type: str = "message") -> tuple[str, str, str]:  # noqa: A002
    return (type, data, id)


X2K = b"x" * 2048
ELLIPSIS = "\u2026"
CASES: list[StreamCase] = [
    # A BOM is skipped once, at the very start; a second one is part of a field name.
    StreamCase("format-bom", message(b"\xef\xbb\xbfdata:1\n\n\xef\xbb\xbfdata:2\n\ndata:3"), (msg("1"), msg("3"))),
    StreamCase("format-bom-2", message(b"\xef\xbb\xbf\xef\xbb\xbfdata:1\n\ndata:2\n\ndata:3"), (msg("2"), msg("3"))),
    # Comments among CR, LF and CRLF line endings, one of them 2 KiB long.
    StreamCase("format-comments",
               message(b"data:1\r:\0\n:\r\ndata:2\n:" + X2K + b"\rdata:3\n:data:fail\r:" + X2K + b"\ndata:4\n", b""),
               (msg("1\n2\n3\n4"),), comments=5),
    # The last block has no blank line: it is never dispatched, and its id never becomes the string.
    StreamCase("format-data-before-final-empty-line",
               message(b"retry:1000\ndata:test1\n\nid:test\ndata:test2", b""), (msg("test1"),), "", 1000),
    StreamCase("format-data-before-final-empty-line (an id alone, cut off)", b"id: 1\ndata: a\n\nid: 2\n",
               (msg("a", "1"),), "1"),
    StreamCase("format-field-data", message(b"data:\n\ndata\ndata\n\ndata:test"), (msg(""), msg("\n"), msg("test"))),
    StreamCase("format-field-event-empty", message(b"event: \ndata:data"), (msg("data"),)),
    StreamCase("format-field-event", message(b"event:test\ndata:x\n\ndata:x"), (msg("x", type="test"), msg("x"))),
    # resources/last-event-id.py: an id of U+2026; the reconnect gets its Last-Event-ID back as data.
    StreamCase("format-field-id", f"id: {ELLIPSIS}\nretry: 200\ndata: hello\n\n".encode(),
               (msg("hello", ELLIPSIS),), ELLIPSIS, 200),
    StreamCase("format-field-id (the reconnect)", f"data: {ELLIPSIS}\n\n".encode(), (msg(ELLIPSIS, ELLIPSIS),),
               ELLIPSIS, seed=ELLIPSIS),
    StreamCase("format-field-id-2 (the second reconnect)", f"data: {ELLIPSIS}\n\n".encode(),
               (msg(ELLIPSIS, ELLIPSIS),), ELLIPSIS, seed=ELLIPSIS),
    # resources/last-event-id2.py: ids are sticky, and an empty id resets them.
    StreamCase("format-field-id-3 (persists)", b"id: 1\ndata: 1\n\ndata:2\n\n", (msg("1", "1"), msg("2", "1")), "1"),
    StreamCase("format-field-id-3 (changes, persists)", b"id: 1\ndata: 1\n\nid: 2\ndata:2\n\ndata:3\n\n",
               (msg("1", "1"), msg("2", "2"), msg("3", "2")), "2"),
    StreamCase("format-field-id-3 (resets)", b"id: 1\ndata: 1\n\nid:\ndata:2\n\ndata:3\n\n",
               (msg("1", "1"), msg("2"), msg("3"))),
    StreamCase("format-field-id-3 (resets, id without colon)", b"id: 1\ndata: 1\n\nid\ndata:2\n\ndata:3\n\n",
               (msg("1", "1"), msg("2"), msg("3"))),
    # An id holding U+0000 is ignored: the event has none, and the reconnect sends none.
    *[StreamCase(f"format-field-id-null ({value!r})", b"id: " + value + b"\nretry: 200\ndata: hello\n\n",
                 (msg("hello"),), "", 200)
      for value in (b"\0\0", b"x\0", b"\0x", b"x\0x", b" \0")],
    StreamCase("format-field-parsing",
               message(b"data:\0\ndata:  2\rData:1\ndata\0:2\ndata:1\r\0data:4\nda-ta:3\rdata_5\ndata:3\rdata:\r\n"
                       b" data:32\ndata:4\n", b""), (msg("\0\n 2\n1\n3\n\n4"),)),
    StreamCase("format-field-retry-bogus", message(b"retry:2000\nretry:1000x\ndata:x"), (msg("x"),), "", 2000),
    StreamCase("format-field-retry-empty", message(b"retry\ndata:test"), (msg("test"),)),
    StreamCase("format-field-retry", message(b"retry:02000\ndata:x"), (msg("x"),), "", 2000),
    StreamCase("format-field-unknown",
               message(b"data:test\n data\ndata\nfoobar:xxx\njustsometext\n:thisisacommentyay\ndata:test"),
               (msg("test\n\ntest"),), comments=1),
    StreamCase("format-leading-space", message(b"data:\ttest\rdata: \ndata:test"), (msg("\ttest\n\ntest"),)),
    StreamCase("format-newlines", message(b"data:test\r\ndata\ndata:test\r\n\r", b""), (msg("test\n\ntest"),)),
    StreamCase("format-null-character", message(b"data:\0\n\n"), (msg("\0"),)),
    # Served as text/event-stream;charset=windows-1252: read as UTF-8 all the same.
    StreamCase("format-utf-8", message("data:ok\u2026".encode()), (msg("ok\u2026"),)),
    # The standard's own steps, where no wpt file pins them down.
    StreamCase("whatwg: an id-only block sets the string (dispatch, step 1)", b"id: 5\n\n", (), "5"),
    StreamCase("whatwg: a retry-only block dispatches nothing", b"retry: 7\n\nid: 6\nretry: x\n\n", (), "6", 7),
    StreamCase("whatwg: the end of the stream discards the pending block", b"data: a\n\nid: 9\ndata: b",
               (msg("a"),)),
]

WAYS = ("whole", "split at every byte", "byte by byte")


def feeds(stream: bytes, way: str) -> list[list[bytes]]:
    """The stream as the pieces each reading of it gets (one list of pieces per reading)."""
    if way == "whole":
        return [[stream]]
    if way == "byte by byte":
        return [[stream[i:i + 1] for i in range(len(stream))]]
    return [[stream[:cut], stream[cut:]] for cut in range(len(stream) + 1)]


def _parse(case: StreamCase, pieces: list[bytes]) -> list[str]:
    parser = sse.EventStreamParser(last_event_id=case.seed)
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.close()
    problems = []
    got = tuple((e.event, e.data, e.id) for e in events)
    if got != case.events:
        problems.append(f"events {got} != {case.events}")
    if parser.last_event_id != case.last_event_id:
        problems.append(f"last event ID {parser.last_event_id!r} != {case.last_event_id!r}")
    if parser.retry != case.retry:
        problems.append(f"retry {parser.retry} != {case.retry}")
    if case.comments is not None and parser.comments != case.comments:
        problems.append(f"{parser.comments} comments, not {case.comments}")
    return problems


_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"


def _client(case: StreamCase, pieces: list[bytes]) -> list[str]:
    """The client's reading of the same bytes (a response closed by the server), and the id it would send."""
    trace = Trace(way="events")
    recorder = ResponseRecorder(trace, "GET", last_event_id=case.seed or None)
    recorder.feed(_HEAD, 0.0)
    for piece in pieces:
        recorder.feed(piece, 0.0)
    recorder.eof()
    expected = case.last_event_id or None
    sent = last_id(trace)
    return [] if sent == expected else [f"the client would send Last-Event-ID {sent!r}, not {expected!r}"]


def run(case: StreamCase, way: str) -> list[str]:
    """What the parser and the client got wrong reading ``case`` that way (empty: nothing)."""
    problems = []
    for pieces in feeds(case.stream, way):
        problems += _parse(case, pieces) + _client(case, pieces)
        if problems:
            return [f"{way}, pieces of {[len(p) for p in pieces][:4]}: {p}" for p in problems]
    return problems
