"""The page's own little server (chapter 15): the streams our server never sends, written on purpose.

Our server writes every event whole, in one write, and its detokenizer never
lets a piece end inside a character. The network owes the page nothing of the
kind: a TCP segment, a proxy's buffer or a TLS record may end anywhere, so a
read in the browser may end in the middle of a character. To show what the
page's reader does then, this server writes what a network would hand over on
a bad day, each on a path of its own:

- ``/split``: chapter 1's sentence, one word a piece, each event's bytes in two
  writes cut inside its first character of several bytes, with a pause between
  them so that the browser reads them apart;
- ``/markdown``: an answer with a code block, a table and a link, piece by piece;
- ``/fails``: a few pieces, then the ``error`` event our server sends when a
  generation fails, then the end of the body (an answer that went wrong, not a
  short one);
- ``/cut``: a few numbered pieces, then the connection closed without the last
  chunk (a stream broken off), with ``retry:`` so that a reconnect is quick;
- ``/npm/PACKAGE/PATH``: a file of an npm package (the openai SDK's ES modules),
  so that the page can import it.

The events are made by our server's own formats (``TextPiece``, ``error_body``,
``ending_data``), so the bytes are the ones it would send. Every answer says
``Access-Control-Allow-Origin: *``, and an ``OPTIONS`` preflight is answered:
the page comes from our server's origin and reads these from another.
Each request's path, query and ``Last-Event-ID`` are kept (``requests``).
"""

from __future__ import annotations

import mimetypes
import re
import socket
import socketserver
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qsl

from streamlab.lab.setups.runner import serving_in_thread
from streamlab.protocol import sse
from streamlab.protocol.http_body import LAST_CHUNK, encode_chunk
from streamlab.protocol.http_head import parse_request_head, response_head
from streamlab.server.answers.scripted import script_piece
from streamlab.server.transport.events import Event
from streamlab.server.wire.formats import TextPiece, ending_data, error_body

__all__ = [
    "FAILURE",
    "MARKDOWN_ANSWER",
    "SENTENCE",
    "PageServer",
    "Seen",
    "cut_inside_characters",
    "markdown_pieces",
    "page_server",
    "word_pieces",
]

#: Chapter 1's sentence: a Vietnamese line with a parrot and a melting face, most of its characters several bytes.
SENTENCE = "Con vẹt 🦜 nói: mô hình sinh văn bản từng token một 🫠"

#: What the failing stream's error says, as a model's failure would reach the reader.
FAILURE = "InjectedFault: the model failed after the pieces it sent"

#: An answer a model might write, with what a partial render breaks: bold, a link, a code fence, a table.
MARKDOWN_ANSWER = (
    "To read a stream in the page, **decode it incrementally** and render what you have, as the "
    "[Encoding standard](https://encoding.spec.whatwg.org/) describes:\n\n"
    "```js\n"
    "const decoder = new TextDecoder();\n"
    "text += decoder.decode(chunk, { stream: true });\n"
    "```\n\n"
    "| reader | reconnects | carries a header |\n"
    "| --- | --- | --- |\n"
    "| EventSource | by itself | no |\n"
    "| fetch | never | yes |\n\n"
    "Either way, end on the **end event**, never on a closed connection.\n"
)

# Pieces as a tokenizer cuts text: a word with its leading space, digits, up to two marks, a line break.
_PIECE = re.compile(r" ?[A-Za-z]+| ?\d+| ?[^\sA-Za-z\d]{1,2}|\n| +")
PAUSE = 0.04  # s between the two writes of a split event: far longer than the browser takes to read one
CUT_RETRY_MS = 200  # the cut stream's retry: field, so an EventSource comes back within a fifth of a second
MAX_HEAD = 65536


def word_pieces(text: str) -> list[str]:
    """``text`` one word a piece, each with the space before it, as the scripted source's pieces are."""
    return re.findall(r"\s*\S+", text)


def markdown_pieces(text: str) -> list[str]:
    """``text`` cut as a tokenizer would: short words, marks in pairs (a fence of three backticks in two pieces)."""
    pieces = _PIECE.findall(text)
    assert "".join(pieces) == text, "every character is in a piece"
    return pieces


def cut_inside_characters(data: bytes) -> list[bytes]:
    """``data`` as two writes, cut after the first byte of its first character of several bytes; one if it has none.

    The browser's read then ends inside that character: its first byte in
    one read, the rest in the next.
    """
    for i, byte in enumerate(data):
        if byte >= 0xC0:  # a lead byte of a 2-, 3- or 4-byte character
            return [data[: i + 1], data[i + 1:]]
    return [data]


@dataclass(frozen=True)
class Seen:
    """One request the page made: its path, its query, and the ``Last-Event-ID`` it sent back (None: none)."""

    path: str
    query: dict[str, str]
    last_event_id: str | None
    at: float


class PageServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, npm_folder: Path | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.npm_folder = npm_folder
        self.requests: list[Seen] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def seen(self, path: str, **query: str) -> list[Seen]:
        """The requests for ``path`` whose query had these values."""
        with self._lock:
            return [s for s in self.requests if s.path == path and all(s.query.get(k) == v for k, v in query.items())]

    def note(self, seen: Seen) -> None:
        with self._lock:
            self.requests.append(seen)


_CORS = [("Access-Control-Allow-Origin", "*"), ("Cache-Control", "no-store")]
_EVENTS = [("Content-Type", "text/event-stream; charset=utf-8"), *_CORS]


class _Handler(socketserver.BaseRequestHandler):
    server: PageServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a small write goes out at once, on its own
        raw = b""
        while b"\r\n\r\n" not in raw:
            data = sock.recv(65536)
            if not data or len(raw) > MAX_HEAD:
                return
            raw += data
        head = parse_request_head(raw[: raw.index(b"\r\n\r\n") + 4])
        path, _, query = head.target.partition("?")
        asked = dict(parse_qsl(query))
        self.server.note(Seen(path, asked, head.header("last-event-id"), time.monotonic()))
        try:
            if head.method == "OPTIONS":  # a preflight: anything the page may send, from anywhere
                self._whole(204, b"", [("Access-Control-Allow-Methods", "GET, POST"),
                                        ("Access-Control-Allow-Headers", "content-type, last-event-id"), *_CORS])
            elif path == "/split":
                self._split(float(asked.get("pause", PAUSE)))
            elif path == "/markdown":
                self._events([TextPiece(p).encode() for p in markdown_pieces(MARKDOWN_ANSWER)], end=True)
            elif path == "/fails":
                self._fails(int(asked.get("after", 5)))
            elif path == "/cut":
                self._cut(int(asked.get("after", 3)), head.header("last-event-id"))
            elif path.startswith("/npm/"):
                self._npm(path[len("/npm/"):])
            else:
                self._whole(404, b"no such page", _CORS)
        except OSError:
            pass  # the page went away (an aborted fetch, a closed EventSource)

    def _whole(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.request.sendall(response_head(status, [*headers, ("Connection", "close")], content_length=len(body))
                             + body)

    def _start(self) -> None:
        self.request.sendall(response_head(200, [*_EVENTS, ("Connection", "close")], chunked=True))

    def _events(self, events: list[bytes], *, end: bool, pause: float = 0.0) -> None:
        self._start()
        for event in events:
            self.request.sendall(encode_chunk(event))
            if pause:
                time.sleep(pause)
        if end:
            self.request.sendall(encode_chunk(Event(ending_data("completed", len(events)), "end").encode()))
        self.request.sendall(LAST_CHUNK)

    def _split(self, pause: float) -> None:
        self._start()
        pieces = word_pieces(SENTENCE)
        for piece in pieces:
            for write in cut_inside_characters(TextPiece(piece).encode()):
                self.request.sendall(encode_chunk(write))
                time.sleep(pause)
        self.request.sendall(encode_chunk(Event(ending_data("completed", len(pieces)), "end").encode()) + LAST_CHUNK)

    def _fails(self, after: int) -> None:
        # What our server writes when a generation fails: the pieces so far, then an error that carries its
        # stop reason, and no end event (formats.job_ending); then the body ends as every body does.
        failed = {**error_body(500, f"generation failed: {FAILURE}"), **ending_data("error", after)}
        pieces = [TextPiece(script_piece(i)).encode() for i in range(after)]
        self._start()
        for piece in pieces:
            self.request.sendall(encode_chunk(piece))
            time.sleep(0.01)
        self.request.sendall(encode_chunk(Event(failed, "error").encode()) + LAST_CHUNK)

    def _cut(self, after: int, last_event_id: str | None) -> None:
        first = int(last_event_id) + 1 if last_event_id and last_event_id.isdigit() else 0
        self._start()
        self.request.sendall(encode_chunk(sse.encode_event(None, retry=CUT_RETRY_MS)))  # retry only: no event
        for number in range(first, first + after):
            self.request.sendall(encode_chunk(Event({"text": script_piece(number)}, id=number).encode()))
            time.sleep(0.01)
        time.sleep(0.2)  # the pieces read first: Chromium drops what comes in the same moment as the break
        self.request.shutdown(socket.SHUT_RDWR)  # no last chunk: the body broke off

    def _npm(self, rest: str) -> None:
        root = self.server.npm_folder
        target = (root / rest).resolve() if root is not None else None
        if target is None or root is None or root.resolve() not in target.parents or not target.is_file():
            self._whole(404, b"no such file", _CORS)
            return
        kind = "text/javascript" if target.suffix in (".js", ".mjs") else (
            mimetypes.guess_type(target.name)[0] or "application/octet-stream")
        self._whole(200, target.read_bytes(), [("Content-Type", kind), *_CORS])


@contextmanager
def page_server(npm_folder: Path | None = None) -> Iterator[PageServer]:
    """The page's server on a free port of 127.0.0.1 (``.url``), serving ``npm_folder``'s packages; stopped after."""
    with serving_in_thread(PageServer(npm_folder), "streamlab-page-server", poll_interval=0.05) as server:
        yield server
