"""WebSocket (RFC 6455), written out: handshake, frames, messages, close codes.

A WebSocket starts life as an HTTP/1.1 request that asks to *upgrade* the
connection. Once the server answers ``101 Switching Protocols``, both sides
stop speaking HTTP and exchange *frames* over the same TCP connection.

A *message* is one or more data frames (a first TEXT or BINARY frame, then
CONTINUATION frames, the last with FIN set). Control frames (CLOSE, PING,
PONG) are short, never fragmented, and may arrive between the fragments of a
message.

This module holds the messages: ``Connection``, one side of a WebSocket
after the handshake, and the events it reports. The handshake is in
``streamlab.protocol.websocket_handshake``; frames, close payloads and
``ProtocolError`` in ``streamlab.protocol.websocket_frames``. Their public
names are re-exported here, so ``from streamlab.protocol import websocket as
ws`` then ``ws.encode_frame`` or ``ws.client_handshake`` keeps working.

Like the other protocol modules this one never touches a socket: it turns
bytes into frames and events, and events into bytes ("sans I/O", in the
manner of wsproto). The server, the client and the tests share it.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from streamlab.protocol.websocket_frames import (
    Frame,
    FrameDecoder,
    Opcode,
    ProtocolError,
    encode_close_payload,
    encode_frame,
    parse_close_payload,
)

__all__ = ["BinaryMessage", "CloseReceived", "Connection", "Ping", "Pong", "TextMessage"]

# --------------------------------------------------------------------------
# Messages: a sans-I/O connection
# --------------------------------------------------------------------------


@dataclass
class TextMessage:
    """A complete text message, reassembled and UTF-8 validated."""

    text: str


@dataclass
class BinaryMessage:
    """A complete binary message, reassembled."""

    data: bytes


@dataclass
class Ping:
    """The peer asks for a pong with the same payload (it is checking we are alive)."""

    payload: bytes


@dataclass
class Pong:
    """The answer to one of our pings (or an unsolicited heartbeat)."""

    payload: bytes


@dataclass
class CloseReceived:
    """The peer started (or answered) the closing handshake."""

    code: int
    reason: str


WebSocketEvent = TextMessage | BinaryMessage | Ping | Pong | CloseReceived


# What an unfinished UTF-8 character may start with (RFC 3629's table): the
# bytes a decoder holds back waiting for the rest of a character must be one
# of these, or no byte to come can make them valid. Python's decoder holds
# some impossible ones (ED A0, the start of a UTF-16 surrogate) until the
# next byte; checking what it holds refuses them at once.
_UTF8_PREFIX = re.compile(
    rb"[\xc2-\xdf]|\xe0[\xa0-\xbf]?|[\xe1-\xec\xee\xef][\x80-\xbf]?|\xed[\x80-\x9f]?"
    rb"|\xf0(?:[\x90-\xbf][\x80-\xbf]?)?|[\xf1-\xf3](?:[\x80-\xbf][\x80-\xbf]?)?|\xf4(?:[\x80-\x8f][\x80-\xbf]?)?"
)


class Connection:
    """One side of a WebSocket after the handshake, as bytes-in / events-out.

    ``receive`` turns bytes from the socket into messages and control
    events; the ``send_*`` methods return bytes for the caller to write.
    Nothing is sent automatically: when a ``Ping`` arrives, the I/O layer
    decides to answer with ``send_pong``; when a ``CloseReceived`` arrives,
    it answers with ``send_close``; when ``receive`` raises
    ``ProtocolError``, it sends ``send_close(err.code, err.reason)`` and
    closes the socket. Keeping the decisions in the caller makes each of
    them visible in the server's code.

    Every rule is applied as soon as the bytes that carry it are here
    (Autobahn|Testsuite's "fail fast"): a data frame's header is judged
    before its payload (a continuation with nothing to continue, a message
    over ``max_message``), and a text message's UTF-8 is checked as its
    bytes arrive, inside a frame that is still arriving too.
    """

    def __init__(self, *, client: bool, max_message: int = 1 << 20) -> None:
        self.client = client
        self.max_message = max_message
        # A single frame can never be larger than a whole message.
        self._decoder = FrameDecoder(expect_masked=not client, max_frame=max_message)
        self._message_opcode: Opcode | None = None  # set while a fragmented message is open
        self._parts: list = []
        self._size = 0
        self._text_decoder: codecs.IncrementalDecoder | None = None
        # The data frame at the head of the decoder's buffer, still arriving:
        # whether its header was judged, and how much of its payload was read.
        self._frame_open = False
        self._frame_taken = 0
        self._error: ProtocolError | None = None  # set once the peer broke the protocol
        self.close_sent = False
        self.close_received = False

    # -- receiving -----------------------------------------------------------

    def receive(self, data: bytes) -> list[WebSocketEvent]:
        """Consume bytes from the peer; return the events they complete.

        Frames are handled one by one in wire order, so the first violation
        in the stream is the one reported, however the bytes were split into
        reads. Once ``ProtocolError`` has been raised the connection has
        failed: every later call raises the same error (events completed
        earlier in the failing call are not returned; the connection is
        being torn down anyway).

        After the peer's CLOSE, whatever it sends is discarded (RFC 6455
        section 5.5.1: it may send nothing more; Autobahn's cases 7.1.3 to
        7.1.5 send a ping, a text or a fragment right after it and expect a
        clean close with 1000). The close is the last event, whether the
        frames behind it came in the same read or a later one.
        """
        if self._error is not None:
            raise self._error
        if self.close_received:
            return []
        events: list[WebSocketEvent] = []
        try:
            for frame in self._decoder.frames(data):
                event = self._handle_frame(frame)
                if event is not None:
                    events.append(event)
                if self.close_received:
                    return events
            self._read_partial_frame()
        except ProtocolError as err:
            self._error = err
            raise
        return events

    def _handle_frame(self, frame: Frame) -> WebSocketEvent | None:
        op = frame.opcode
        if op == Opcode.PING:
            return Ping(frame.payload)
        if op == Opcode.PONG:
            return Pong(frame.payload)
        if op == Opcode.CLOSE:
            code, reason = parse_close_payload(frame.payload)
            self.close_received = True
            return CloseReceived(code, reason)

        # Data frames: TEXT or BINARY open a message, CONTINUATION extends it.
        if not self._frame_open:
            self._open_data_frame(op, len(frame.payload))
        rest = frame.payload[self._frame_taken :] if self._frame_taken else frame.payload
        self._frame_open, self._frame_taken = False, 0
        self._take(rest, final=frame.fin)
        if not frame.fin:
            return None
        opcode, parts = self._message_opcode, self._parts
        self._message_opcode, self._parts, self._text_decoder = None, [], None
        if opcode == Opcode.TEXT:
            return TextMessage("".join(parts))
        return BinaryMessage(b"".join(parts))

    def _open_data_frame(self, op: Opcode, length: int) -> None:
        """Judge a data frame by its header: the message it opens or continues, and the size it brings it to."""
        if op == Opcode.CONTINUATION:
            if self._message_opcode is None:
                raise ProtocolError(1002, "continuation frame without a message to continue")
        else:
            if self._message_opcode is not None:
                raise ProtocolError(1002, "new message started before the previous one ended")
            self._message_opcode = op
            self._parts, self._size = [], 0
            if op == Opcode.TEXT:
                self._text_decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        if self._size + length > self.max_message:
            raise ProtocolError(1009, f"message exceeds {self.max_message} bytes")
        self._size += length
        self._frame_open = True

    def _take(self, payload: bytes, *, final: bool) -> None:
        """Add payload bytes to the open message; a text message's are checked as UTF-8 at once."""
        if self._message_opcode == Opcode.TEXT:
            # Invalid UTF-8 is refused at its first impossible byte, while a
            # character split between two fragments (or two reads) is simply
            # held by the decoder until its last byte comes.
            assert self._text_decoder is not None
            try:
                self._parts.append(self._text_decoder.decode(payload, final=final))
            except UnicodeDecodeError:
                raise ProtocolError(1007, "text message is not valid UTF-8") from None
            held = self._text_decoder.getstate()[0]
            if held and not _UTF8_PREFIX.fullmatch(held):
                raise ProtocolError(1007, "text message is not valid UTF-8")
        else:
            self._parts.append(payload)

    def _read_partial_frame(self) -> None:
        """Judge the data frame still arriving: its header now, a text message's bytes as they come."""
        header = self._decoder.partial(None)
        if header is None:
            return
        op, _fin, length, _ = header
        if op.is_control:
            return  # at most 125 bytes: judged whole
        if not self._frame_open:
            self._open_data_frame(op, length)
        if self._message_opcode != Opcode.TEXT:
            return  # binary bytes wait in the buffer for the whole frame
        partial = self._decoder.partial(self._frame_taken)
        assert partial is not None
        piece = partial[3]
        if piece:
            self._take(piece, final=False)
            self._frame_taken += len(piece)

    # -- sending ---------------------------------------------------------------

    def _frame(self, opcode: Opcode, payload: bytes) -> bytes:
        # Clients mask every frame; servers never do.
        return encode_frame(opcode, payload, mask=self.client)

    def _check_can_send_data(self) -> None:
        if self.close_sent:
            raise RuntimeError("cannot send data after sending CLOSE")

    def send_text(self, text: str) -> bytes:
        """Bytes for a text message (one frame)."""
        self._check_can_send_data()
        return self._frame(Opcode.TEXT, text.encode("utf-8"))

    def send_binary(self, data: bytes) -> bytes:
        """Bytes for a binary message (one frame)."""
        self._check_can_send_data()
        return self._frame(Opcode.BINARY, data)

    def send_ping(self, payload: bytes = b"") -> bytes:
        """Bytes for a ping; the peer must answer with a pong carrying ``payload``."""
        return self._frame(Opcode.PING, payload)

    def send_pong(self, payload: bytes = b"") -> bytes:
        """Bytes for a pong, normally echoing the payload of a received ping."""
        return self._frame(Opcode.PONG, payload)

    def send_close(self, code: int | None = 1000, reason: str = "") -> bytes:
        """Bytes for a CLOSE frame; no data may be sent after it.

        The closing handshake: one side sends CLOSE, the other answers with
        CLOSE, then the server closes TCP. ``code=None`` sends an empty
        CLOSE, which the peer reads as 1005 (no status).
        """
        if self.close_sent:
            raise RuntimeError("CLOSE already sent")
        payload = b"" if code is None else encode_close_payload(code, reason)
        self.close_sent = True
        return self._frame(Opcode.CLOSE, payload)
