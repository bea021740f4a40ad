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
from dataclasses import dataclass

from streamlab.protocol.websocket_frames import (
    MAX_CONTROL_PAYLOAD,
    CloseCode,
    Frame,
    FrameDecoder,
    Opcode,
    ProtocolError,
    apply_mask,
    encode_close_payload,
    encode_frame,
    is_valid_close_code,
    parse_close_payload,
)
from streamlab.protocol.websocket_handshake import (
    GUID,
    HandshakeError,
    accept_key,
    check_server_response,
    client_handshake,
    new_key,
    server_handshake_response,
    validate_upgrade_request,
)

__all__ = [
    "GUID",
    "MAX_CONTROL_PAYLOAD",
    "BinaryMessage",
    "CloseCode",
    "CloseReceived",
    "Connection",
    "Frame",
    "FrameDecoder",
    "HandshakeError",
    "Opcode",
    "Ping",
    "Pong",
    "ProtocolError",
    "TextMessage",
    "accept_key",
    "apply_mask",
    "check_server_response",
    "client_handshake",
    "encode_close_payload",
    "encode_frame",
    "is_valid_close_code",
    "new_key",
    "parse_close_payload",
    "server_handshake_response",
    "validate_upgrade_request",
]

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
        """
        if self._error is not None:
            raise self._error
        events: list[WebSocketEvent] = []
        try:
            for frame in self._decoder.frames(data):
                event = self._handle_frame(frame)
                if event is not None:
                    events.append(event)
        except ProtocolError as err:
            self._error = err
            raise
        return events

    def _handle_frame(self, frame: Frame) -> WebSocketEvent | None:
        if self.close_received:
            raise ProtocolError(1002, "frame received after CLOSE")
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

        self._size += len(frame.payload)
        if self._size > self.max_message:
            raise ProtocolError(1009, f"message exceeds {self.max_message} bytes")

        if self._message_opcode == Opcode.TEXT:
            # Validate each fragment as it arrives: invalid UTF-8 is refused
            # at once, while a character split between two fragments is
            # simply held by the decoder until its last byte comes.
            assert self._text_decoder is not None
            try:
                self._parts.append(self._text_decoder.decode(frame.payload, final=frame.fin))
            except UnicodeDecodeError:
                raise ProtocolError(1007, "text message is not valid UTF-8") from None
        else:
            self._parts.append(frame.payload)

        if not frame.fin:
            return None
        opcode, parts = self._message_opcode, self._parts
        self._message_opcode, self._parts, self._text_decoder = None, [], None
        if opcode == Opcode.TEXT:
            return TextMessage("".join(parts))
        return BinaryMessage(b"".join(parts))

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
