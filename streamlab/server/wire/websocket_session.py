"""One WebSocket after its 101: request messages in, ``{"text"}`` messages out, with one state field.

Everything the client says arrives as frames on this one connection: a
request, a ping to answer, ``{"stop": true}``, a close frame, or EOF. In
watching mode a task reads them while a generation streams; in naive mode
nobody reads while generating, so pings go unanswered and stops go unheard.

A request that must wait in line for its turn is told its place (``{"queued":
true, "ahead": N}``, on arrival and at every change) and pinged in the
silences; a close, EOF or ``{"stop": true}`` takes it out of line at once.

Between requests the session bounds the silence, as python-websockets does:
after ``ws_ping_interval`` quiet seconds it pings, and closes with 1011 when
no pong comes within ``ws_ping_timeout`` (a peer that vanished); a peer that
answers pings but asks for nothing for ``ws_idle_timeout`` is closed with
1001 (it holds a connection for nothing).
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections import deque
from contextlib import asynccontextmanager, suppress
from typing import Any, AsyncIterator

from streamlab.protocol import websocket as ws
from streamlab.protocol import websocket_frames
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.endings import CLOSE_FRAME, EOF, PROTOCOL_ERROR, STOP_MESSAGE
from streamlab.server.config import MAX_WS_MESSAGE, WS_CLOSE_WAIT, ServerConfig
from streamlab.server.transport.connection import ClientConnection, in_background
from streamlab.net.serving import ClientGone
from streamlab.model.lifecycle import Piece
from streamlab.server.answers.answer import Answer, Undeliverable
from streamlab.server.wire.formats import WebSocketMessages as MESSAGES
from streamlab.server.wire.formats import answer_ending
from streamlab.server.answers.jobs import Jobs
from streamlab.server.answers.requests import WS_MESSAGE, parse_generation_request
from streamlab.server.transport.events import dumps

TRY_AGAIN_LATER = 1013  # the IANA registry's close code for "overloaded, come back later"


class State(enum.Enum):
    """Where the session is; every change is made by ``_end`` or ``close``, nowhere else."""

    OPEN = "open"  # requests may come and answers go
    CLOSING = "closing"  # the peer is done (CLOSE, EOF, broke the protocol) or we are: read no more
    CLOSED = "closed"  # the closing handshake is over and the socket closed


def _is_stop(text: str) -> bool:
    try:
        message = json.loads(text)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("stop") is True


class WebSocketSession:
    def __init__(self, jobs: Jobs, config: ServerConfig, client: ClientConnection, first_id: str) -> None:
        self.jobs = jobs
        self.config = config
        self.client = client
        self.conn = ws.Connection(client=False, max_message=MAX_WS_MESSAGE)
        self.state = State.OPEN
        self.inbox: deque[str] = deque()  # request messages not yet served
        self.current: Answer | None = None  # the answer being served: in line, or sent
        self.peer_gone = False  # EOF or a failed write: nothing more can be sent either
        self.close_with: tuple[int, str] = (1000, "")
        self.next_id: str | None = first_id  # announced in the 101's X-Request-Id
        self.ping_sent_at: float | None = None  # a keep-alive ping awaiting its pong

    async def run(self) -> None:
        try:
            while (text := await self.next_message()) is not None:
                if not await self.answer(text):
                    break
        except ClientGone:
            self.peer_gone = True
        await self.close()

    def _end(self, code: int, reason: str = "") -> None:
        """Stop reading and, after the current answer, close with ``code`` (the first reason wins)."""
        if self.state is State.OPEN:
            self.close_with = (code, reason)
            self.state = State.CLOSING

    # -- reading -----------------------------------------------------------------

    async def next_message(self) -> str | None:
        """The next request message, answering pings and sending keep-alives meanwhile; None once it is over."""
        idle_until = time.monotonic() + self.config.ws_idle_timeout
        while not self.inbox:
            if self.state is not State.OPEN:
                return None
            now = time.monotonic()
            if now >= idle_until:
                self._end(int(websocket_frames.CloseCode.GOING_AWAY), "idle timeout")
                continue
            if self.ping_sent_at is not None and now >= self.ping_sent_at + self.config.ws_ping_timeout:
                self._end(int(websocket_frames.CloseCode.INTERNAL_ERROR), "keepalive ping timeout")
                continue
            if self.ping_sent_at is None:
                wake = now + self.config.ws_ping_interval
            else:
                wake = self.ping_sent_at + self.config.ws_ping_timeout
            try:
                await self.receive(max(0.0, min(wake, idle_until) - now))
            except asyncio.TimeoutError:
                if self.ping_sent_at is None and time.monotonic() < idle_until:
                    await self.client.send(self.conn.send_ping(b"keepalive"))
                    self.ping_sent_at = time.monotonic()
        return self.inbox.popleft()

    async def receive(self, timeout: float | None = None) -> None:
        """Read once from the socket (at most ``timeout`` seconds) and act on every event it completes."""
        try:
            data = await self.client.read(timeout)
        except ConnectionError:
            data = b""
        if not data:
            self.peer_gone = True
            self.lost(EOF)
            return
        try:
            events = self.conn.receive(data)
        except websocket_frames.ProtocolError as err:
            self._end(err.code, err.reason)
            self.lost(PROTOCOL_ERROR)
            return
        for event in events:
            self.handle(event)

    def handle(self, event: ws.WebSocketEvent) -> None:
        """Act on one event at once (no awaiting, so a cancelled watcher loses nothing)."""
        if isinstance(event, ws.Ping):
            if not self.conn.close_sent:
                self.client.send_nowait(self.conn.send_pong(event.payload))
        elif isinstance(event, ws.Pong):
            self.ping_sent_at = None
        elif isinstance(event, ws.CloseReceived):
            code = event.code if websocket_frames.is_valid_close_code(event.code) else 1000
            self._end(code)  # echo the peer's code, as RFC 6455 suggests
            self.lost(CLOSE_FRAME)
        elif isinstance(event, ws.BinaryMessage):
            self._end(int(websocket_frames.CloseCode.UNSUPPORTED_DATA), "binary messages are not supported")
            self.lost(PROTOCOL_ERROR)
        elif isinstance(event, ws.TextMessage):
            if not _is_stop(event.text):
                self.inbox.append(event.text)
            else:
                self._stop(STOP_MESSAGE)

    def lost(self, signal: str) -> None:
        """The peer will send nothing more: stop reading, and stop its generation."""
        self._end(1000)
        self._stop(signal)

    def _stop(self, signal: str) -> None:
        """Stop the answer being sent, or take the request waiting in line out of it."""
        if self.current is not None:
            self.current.stop(signal)

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Read frames while the answer streams: pings, stop, close, EOF (not in naive mode)."""
        if self.config.naive:
            yield
            return

        async def watch() -> None:
            while self.state is State.OPEN:
                await self.receive()

        async with in_background(watch()):
            yield

    # -- answering ---------------------------------------------------------------

    async def send_json(self, obj: Any) -> None:
        await self.client.send(self.conn.send_text(dumps(obj)))

    def take_id(self) -> str:
        request_id, self.next_id = self.next_id, None
        return request_id or self.jobs.new_id()

    async def answer(self, text: str) -> bool:
        """Serve one request message; True if the client asked to keep the socket open for more.

        The answer runs its steps (``Answer.run``) with this session as its
        delivery while the session reads the peer's frames (a stop, a close,
        EOF); its ending is sent after that, so that a request sent right
        after it is read as the next one.
        """
        try:
            req = parse_generation_request(text, WS_MESSAGE)
            answer = self.current = Answer(self.jobs, "/ws", req, self.take_id())
        except HTTPError as err:  # a bad request, a conversation_id we do not have, a full line, a store gone
            return await self.refuse(err)
        try:
            await answer.run(self, watch=self.watching)
        except HTTPError as err:  # its turn could not be committed as it started (the conversation store gone)
            return await self.refuse(err)
        finally:
            self.current = None
        if answer.gone is not None:
            self.peer_gone = True
        if self.state is not State.OPEN:
            return False
        name, ending = answer_ending(answer)
        await self.send_json(MESSAGES.ending(name, ending, answer.ticket.record.id))
        if name == "error":  # the generation failed; or its turn never came, because the server is going away
            self._end(*((int(websocket_frames.CloseCode.INTERNAL_ERROR), "generation failed") if answer.served else
                        (int(websocket_frames.CloseCode.GOING_AWAY), "server shutting down")))
            return False
        return req.keep_open

    async def refuse(self, err: HTTPError) -> bool:
        """A request refused: the error as a message, then close (1013 for a 503: try again later). False."""
        await self.send_json(MESSAGES.refusal(err.status, err.message))
        busy = err.status == 503
        code = TRY_AGAIN_LATER if busy else int(websocket_frames.CloseCode.POLICY_VIOLATION)
        # A close reason holds at most 123 bytes (RFC 6455 5.5): the refusal, which names its flag, cut to fit.
        reason = err.message.encode("utf-8")[:120].decode("utf-8", "ignore") if busy else "bad request"
        self._end(code, reason)
        return False

    # -- the answer's delivery (``streamlab.server.answers.answer.Delivery``) ----------------

    def _sendable(self) -> None:
        if self.state is not State.OPEN:  # the peer sent CLOSE: no more data frames
            raise Undeliverable(self.state.value)

    async def place(self, answer: Answer, ahead: int | None) -> None:
        if self.state is not State.OPEN:
            return
        if ahead is None:
            await self.client.send(self.conn.send_ping(b"keepalive"))
        else:
            await self.send_json(MESSAGES.queued(ahead))

    async def opening(self, answer: Answer) -> bool:
        return True

    async def piece(self, answer: Answer, piece: Piece) -> None:
        self._sendable()
        await self.client.send(self.conn.send_text(dumps(MESSAGES.piece(piece.text))))

    async def silence(self, answer: Answer) -> None:
        self._sendable()
        await self.client.send(self.conn.send_ping(b"keepalive"))

    async def ending(self, answer: Answer) -> None:
        return None  # sent by ``answer`` once the frames are no longer read meanwhile

    # -- closing -----------------------------------------------------------------

    async def close(self) -> None:
        """The closing handshake: send CLOSE (echoing theirs), await theirs briefly, close TCP."""
        self._end(1000)
        if not self.peer_gone and not self.conn.close_sent:
            code, reason = self.close_with
            with suppress(ClientGone):
                await self.client.send(self.conn.send_close(code, reason))
            if not self.conn.close_received:
                await self._await_peer_close()
        await self.client.close()
        self.state = State.CLOSED

    async def _await_peer_close(self) -> None:
        deadline = time.monotonic() + WS_CLOSE_WAIT
        while not self.conn.close_received and (left := deadline - time.monotonic()) > 0:
            try:
                data = await self.client.read(left)
            except (asyncio.TimeoutError, ConnectionError):
                return
            if not data:
                return
            with suppress(websocket_frames.ProtocolError):  # after an error the stream is past reading
                self.conn.receive(data)
