"""What an answer says on an HTTP response: as Server-Sent Events, or as one JSON body at its end.

Both are :class:`streamlab.server.answers.answer.Delivery`: the answer runs the
steps (its place in line, its start, each piece, its end), and these write
them in a route's :class:`~streamlab.server.wire.formats.Format`. ``/stream`` and
the OpenAI and Anthropic streams are an :class:`EventDelivery`; ``/complete``
and the APIs' ``stream: false`` a :class:`WholeDelivery`.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from streamlab.model.lifecycle import Piece
from streamlab.protocol.endings import LEAVING_SIGNALS, SERVER_SHUTDOWN
from streamlab.protocol.http_head import Request
from streamlab.server.transport import responses
from streamlab.server.transport.connection import ClientConnection
from streamlab.server.wire.formats import Format
from streamlab.server.answers.answer import Answer, Job
from streamlab.server.answers.jobs import busy
from streamlab.server.answers.fields import ignored_header
from streamlab.server.answers.sources import gateway_failure
from streamlab.server.transport.streams import EventStream

# How a route refuses for an upstream that failed (502, 504...): ``(job, (status, message))``, in its API's body.
GatewayRefusal = Callable[[Job, tuple[int, str]], Awaitable[None]]


async def upstream_failure(answer: Answer) -> tuple[int, str] | None:
    """A relay's upstream answered with a failure: ``(status, message)`` to refuse with, before any body.

    A relay opens its response once its upstream has answered, so that a
    failure there gets a status of its own; a model in this process has
    nothing to wait for.
    """
    job = answer.job
    if not job.generation.relayed:
        return None
    async with answer.watching():
        await job.generation.answered()
    return gateway_failure(job.generation)


class EventDelivery:
    """An answer as Server-Sent Events in one API's format, on one ``EventStream``.

    A reader who waits in line gets the head at once (so that no hop's idle
    timeout cuts it), then its place in the format's words and keep-alives;
    the others get the head with the generation's own headers as soon as it
    has started. An answer whose turn never came is told so in its format,
    unless its reader left.
    """

    def __init__(self, stream: EventStream, fmt: Format, refuse: GatewayRefusal) -> None:
        self.stream = stream
        self.fmt = fmt
        self.refuse = refuse
        self.refused = False

    async def place(self, answer: Answer, ahead: int | None) -> None:
        stream = self.stream
        if not stream.opened:  # a reader in line gets its head at once: its request id, its conversation if any
            stream.headers = answer.headers() + ignored_header(answer.req.ignored)
            await stream.open()
        if ahead is None:
            await stream.send_or_ping(self.fmt.silence())
        else:
            for event in self.fmt.queued(ahead):
                await stream.send(event)

    async def opening(self, answer: Answer) -> bool:
        stream, job = self.stream, answer.job
        if not stream.opened:
            failure = await upstream_failure(answer)
            if failure is not None:
                self.refused = True
                await self.refuse(job, failure)
                return False
            stream.headers = job.headers() + ignored_header(answer.req.ignored)
            await stream.open()
        for event in self.fmt.opening(job):
            await stream.send(event)
        return True

    async def piece(self, answer: Answer, piece: Piece) -> None:
        await self.stream.send(self.fmt.piece(piece.text))

    async def silence(self, answer: Answer) -> None:
        await self.stream.send_or_ping(self.fmt.silence())

    async def ending(self, answer: Answer) -> None:
        if self.refused:
            return
        if answer.served:
            events = self.fmt.ending(answer.job)
        elif answer.ticket.left in LEAVING_SIGNALS:
            return  # it left the line: nobody to tell
        else:
            events = self.fmt.unserved(answer.ticket)
        for event in events:
            await self.stream.send(event)
        await self.stream.close()

    @property
    def keep_alive(self) -> bool:
        return self.stream.keep_alive and not self.refused


class WholeDelivery:
    """An answer as one JSON body in the route's format; nothing is written until the end.

    So the reader waits for all of it (its turn in line first, if it must),
    and the only way to notice one who gave up is to watch for EOF. Each
    piece is stored as it is made (a crash must not lose it all), and the
    answer counts as sent once its body is written.
    """

    def __init__(self, client: ClientConnection, request: Request, fmt: Format, refuse: GatewayRefusal) -> None:
        self.client = client
        self.request = request
        self.fmt = fmt
        self.refuse = refuse
        self.keep_alive = False

    async def place(self, answer: Answer, ahead: int | None) -> None:
        return None  # a JSON body has no way to say it before its end

    async def opening(self, answer: Answer) -> bool:
        return True

    async def piece(self, answer: Answer, piece: Piece) -> None:
        return None

    async def silence(self, answer: Answer) -> None:
        return None

    async def ending(self, answer: Answer) -> None:
        if not answer.served:
            if answer.ticket.left == SERVER_SHUTDOWN:  # still there, and nothing written yet: a 503 can say so
                raise busy("the server is shutting down; this request's turn never came")
            return
        job = answer.job
        if job.record.client_left:
            return
        status, body = self.fmt.whole(job)
        failure = gateway_failure(job.generation) if status >= 500 else None
        if failure is not None:
            await self.refuse(job, failure)
            return
        if status >= 500:
            await responses.refuse(self.client, status, "", job.headers(), lambda *_: body)
            return
        self.keep_alive = await responses.respond_json(self.client, self.request, body,
                                                       job.headers() + ignored_header(answer.req.ignored), status=status)
        job.record.pieces_sent = 1

