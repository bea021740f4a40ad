"""``EventStream``: one object owns a Server-Sent Events response, for every SSE route.

The head (``text/event-stream``, no caching or transforming, nginx told not
to buffer), the framing of each write (HTTP/1.1 chunks, or raw bytes ending
at close for HTTP/1.0, which nginx speaks to its upstreams by default), the
events, the ``: ping`` comments in the silences, the end of the body, and
whether the connection outlives it: all here, once. Routes differ only in
the *source* of events they plug in (a live generation, a kept list of
numbered events) and in the wire format of each event (a ``Format``: see
``formats.py``). What an answer's steps write on it (a place in line, the
opening, the pieces, the ending) is ``deliveries.EventDelivery``'s.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import TYPE_CHECKING, AsyncIterator

from streamlab.protocol import sse
from streamlab.protocol.endings import EOF
from streamlab.protocol.http_body import LAST_CHUNK, encode_chunk
from streamlab.protocol.http_head import Request, response_head
from streamlab.server.transport.connection import ClientConnection, until_client_leaves
from streamlab.net.serving import ClientGone
from streamlab.server.transport.events import Event

if TYPE_CHECKING:
    pass

# Event and dumps moved to events.py; named here too, so that imports from streams keep working.
__all__ = ["EventStream"]


class EventStream:
    """A Server-Sent Events response on one connection: ``open``, ``send``/``ping``..., ``close``.

    ``keep_alive`` says whether the connection may carry another request
    after this body: only an HTTP/1.1 chunked body can say where it ends, and
    a route that will close anyway says ``Connection: close`` in the head, so
    that a pooled client (httpx, requests) does not reuse a connection we are
    about to close. Every event is one write: a ping never lands inside one.
    """

    def __init__(
        self,
        client: ClientConnection,
        request: Request,
        *,
        headers: list[tuple[str, str]] = (),  # type: ignore[assignment]
        accel_header: bool = True,
        keep_alive: bool = True,
    ) -> None:
        self.client = client
        self.http10 = request.version == "HTTP/1.0"
        self.head_only = request.method == "HEAD"
        self.keep_alive = keep_alive and not self.http10 and request.keep_alive() and not self.head_only
        self.headers = list(headers)
        self.accel_header = accel_header
        self.events_sent = 0
        self.opened = False

    async def open(self) -> None:
        headers = [
            ("Content-Type", "text/event-stream; charset=utf-8"),
            # no-store: no cache may keep it (no-cache alone lets one store it and check back);
            # no-transform: no proxy may compress or rewrite it (gzip buffers ~32 KiB).
            ("Cache-Control", "no-cache, no-store, no-transform"),
            *self.headers,
        ]
        if self.accel_header:
            headers.append(("X-Accel-Buffering", "no"))  # nginx: pass each write on at once
        if not self.keep_alive:
            headers.append(("Connection", "close"))
        # HTTP/1.0 has no chunked coding: the body is the bytes as they are, ending when we close.
        self.opened = True
        await self.client.send(response_head(200, headers, chunked=not self.http10))

    def _frame(self, data: bytes) -> bytes:
        return data if self.http10 else encode_chunk(data)

    async def send(self, event: Event) -> None:
        await self.client.send(self._frame(event.encode()))
        self.events_sent += 1

    async def ping(self) -> None:
        await self.client.send(self._frame(sse.encode_comment("ping")))

    async def send_or_ping(self, event: Event | None) -> None:
        await (self.ping() if event is None else self.send(event))

    async def pump(self, events: AsyncIterator[Event | None]) -> None:
        """The one streaming loop: each event as it comes, a ping for each ``None`` (a silence).

        ``send``'s two lines are written out here: one coroutine fewer to
        make and run per event, in the loop that runs for every event of
        every stream.
        """
        client, frame = self.client, self._frame
        async with aclosing(events) as items:
            async for event in items:
                if event is None:
                    await self.ping()
                else:
                    await client.send(frame(event.encode()))
                    self.events_sent += 1

    async def close(self) -> None:
        """End the body: the zero-length chunk; for HTTP/1.0 nothing (closing the connection ends it)."""
        if not self.http10:
            await self.client.send(LAST_CHUNK)

    async def follow(self, events: AsyncIterator[Event | None], *, naive: bool = False) -> str | None:
        """Open, pump ``events`` to their end and close, watching for the reader to leave; who left, or None.

        The signal of a reader who left (``EOF``, or what the failed write
        said), None when the stream ran to its end. ``naive`` does not watch
        for EOF: only a failed write tells the server that the reader is gone.
        """
        try:
            await self.open()
            pumped = self.pump(events)
            if naive:
                await pumped
            elif not await until_client_leaves(self.client, pumped):
                return EOF
            await self.close()
        except ClientGone as err:
            return err.signal
        return None
