"""The line at the door and the log: who may generate now, who waits, the user's turn, every ``/log`` record.

Every route that generates (``/complete``, ``/stream``, ``/ws``,
``/generations``) is admitted by ``Jobs``: it measures the prompt in tokens
against the context, admits the request (a slot now, while fewer than
``max_active`` are held; else a place in a bounded first-in-first-out line,
or 503 with ``--admission refuse`` or a full line), keeps its ``/log``
record, and commits the user's message when its generation starts. Where
turns are kept is its store's business (``store/conversations.py``): this
server's SQLite file, or, with ``--events redis://...``, Redis, where every
replica reads them (``store/shared.py``). The
slots are held by tickets, started or not: the line is in front of every
engine (a thread, or a row of the batched engine). An answer that is over
gives its slot back with one call (``release``), and the first in line gets
it. What a generation does meanwhile (its start, its stop, its pieces, its
finish) is its answer's (``answer.py``, which holds the ticket): nothing here
knows an answer but as the ``Holder`` that stops it at shutdown.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict, deque
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, Protocol

from streamlab.model.generation import Generation
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.endings import LEAVING_SIGNALS, SERVER_SHUTDOWN, STOP_MESSAGE
from streamlab.server.store.answers import AnswerWriter
from streamlab.server.store.conversations import Begun, Conversations
from streamlab.server.store.shared import SharedStore
from streamlab.server.config import MAX_LOG_RECORDS, RETRY_AFTER, ServerConfig, flag
from streamlab.net.serving import ClientGone
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.answers.silence import Silence
from streamlab.server.transport.responses import Refused

if TYPE_CHECKING:
    from streamlab.server.answers.sources import TokenSource



def busy(message: str) -> Refused:
    """503 with ``Retry-After``: the server is at a limit, not broken; the client should try again soon."""
    return Refused(503, message, [("Retry-After", str(RETRY_AFTER))])


@dataclass
class LogRecord:
    """What ``GET /log`` shows for one generation request: how it ended, and why.

    ``tokens`` counts generated tokens (live while it runs); ``pieces_sent``
    counts text pieces written to the client (1 for ``/complete``, once its
    body is written). ``stop_reason`` is the generation's own (eos,
    max_tokens, stopped, error); ``stop_signal`` is how the server learned to
    stop sending, the first one that came, and ``tokens_at_stop`` the token
    count at that moment (how far it ran on after being told is ``tokens``
    minus that). ``stored_reason`` is what the store recorded;
    ``conversation_id`` and ``message_id`` find the answer there.
    ``generation_id`` names the ``/generations`` resource a request served
    (None for the others): with ``--forget`` one resource can cost several
    generations, and their tokens add up. ``prompt_tokens_read`` is how much
    of the prompt went through the model (less than ``prompt_tokens`` when a
    stop came during a chunked prefill).

    The record exists from admission: ``queue_position`` is how many readers
    were ahead when it arrived (None: it started at once), ``queued_s`` how
    long it waited in line, ``started`` when its generation began; one that
    left the line (``left_queue``) has a ``stop_signal`` and nothing else.
    """

    id: str
    path: str
    prompt_tokens: int = 0
    prompt_tokens_read: int = 0
    tokens: int = 0
    pieces_sent: int = 0
    stop_reason: str | None = None
    stop_signal: str | None = None
    client_left: bool = False
    said_stop: bool = False
    done: bool = False
    started: float = field(default_factory=time.time)
    ended: float | None = None
    naive: bool = False
    error: str | None = None
    tokens_at_stop: int | None = None
    stored_reason: str | None = None
    conversation_id: str | None = None
    message_id: str | None = None
    generation_id: str | None = None
    queue_position: int | None = None
    queued_s: float = 0.0
    left_queue: bool = False

    def count_tokens(self, tokens: int) -> None:
        """Called from the generation thread after every token (an int store is atomic)."""
        self.tokens = tokens


@dataclass(frozen=True)
class Turn:
    """The user's side of one exchange, committed before anything is generated.

    ``prompt_ids`` is what the model reads: the prompt alone, or the whole
    conversation in the chat template when the request continued one or sent
    a transcript (the OpenAI and Anthropic routes). An upstream source counts
    the prompt itself: then ``prompt_ids`` is empty. ``begun``: an answer a
    dead worker began, continued in its row (``resources/continued.py``).
    """

    conversation_id: str
    user_message_id: str
    prompt_ids: list[int]
    messages: tuple[dict[str, str], ...] = ()  # the conversation as messages (what an upstream source is sent)
    begun: Begun | None = None


class StartedJob(Protocol):
    """What the line knows of a started generation (``answer.Job``): what ``/health``, ``/debug/queues`` and
    ``/conversations`` read of those running, and what ``wait_all`` waits for."""

    generation: Generation
    record: LogRecord
    answer: AnswerWriter


class Holder(Protocol):
    """Who holds a ticket (``answer.Answer``): what stops its generation, or takes it out of line, at shutdown."""

    def stop(self, signal: str) -> None: ...


@dataclass(eq=False)
class Ticket:
    """One admitted request: its place in line (``ahead``), or the slot it was given, until its answer is over.

    The prompt was measured at the door (what cannot fit waits for nothing);
    the user's turn is committed when the generation starts (earlier only for
    ``/generations``, whose 201 names it), so one who leaves the line leaves
    nothing in the store. ``holder`` is the answer that holds it; ``job`` is
    its generation once that started (set by the answer; None until then).
    """

    req: GenerationRequest
    record: LogRecord
    prompt_ids: list[int]
    messages: tuple[dict[str, str], ...]
    turn: Turn | None = None
    arrived: float = field(default_factory=time.monotonic)
    ahead: int | None = None
    granted: bool = False  # its turn came: a slot is held for it
    started: bool = False
    left: str | None = None  # the signal it left the line with, before its generation started
    holder: Holder | None = None
    job: StartedJob | None = None
    _moved: asyncio.Future | None = None

    @property
    def waiting(self) -> bool:
        return self.ahead is not None

    def moved(self) -> asyncio.Future:
        """A future that turns True when the ticket's place changes (it moves up, its turn comes, it leaves)."""
        if self._moved is None or self._moved.done():
            self._moved = asyncio.get_running_loop().create_future()
        return self._moved

    def _notify(self) -> None:
        if self._moved is not None and not self._moved.done():
            self._moved.set_result(True)


def check_context(prompt_tokens: int, max_tokens: int, context: int | None) -> None:
    """Refuse, before any compute, a request that cannot fit the model's context window.

    Counted in tokens, the unit the model reads: a byte limit lets 8,300 digits
    (8,300 tokens) through while refusing a shorter text in a script that
    costs 3 bytes a character.
    """
    if context is not None and prompt_tokens + max_tokens > context:
        raise HTTPError(400, 
            f"the prompt is {prompt_tokens} tokens and max_tokens is {max_tokens}: together"
            f" {prompt_tokens + max_tokens}, more than the model's context of {context} tokens"
        )


class Jobs:
    """The line at the door: the slots and who holds them, those waiting for their turn, and the log."""

    def __init__(self, source: TokenSource, config: ServerConfig, store: Conversations) -> None:
        self.source = source  # the model here, an upstream, or a script
        self.config = config
        # Where every turn is kept: this server's file, or with --events the replicas' one store in Redis.
        self.store: Conversations = (SharedStore.open(config.events, flush_interval=config.flush_interval)
                                     if config.events else store)
        self.queue: deque[Ticket] = deque()  # the line, first in first out
        self.holders: set[Ticket] = set()  # their turn came (their generation started or not): the slots taken
        self.left_queue = 0  # readers who left the line before their turn
        self.closing = False  # the server is going away: nobody new is let in
        self.log: OrderedDict[str, LogRecord] = OrderedDict()
        self._ids = itertools.count(1)

    def new_id(self) -> str:
        return str(next(self._ids))

    @property
    def running(self) -> list[StartedJob]:
        """The generations that started and are not over yet."""
        return [ticket.job for ticket in self.holders if ticket.job is not None]

    def admit(self, path: str, req: GenerationRequest, request_id: str | None = None, *,
              turn: Turn | None = None, generation_id: str | None = None) -> Ticket:
        """Measure the request, then give it a generation now, a place in line, or a 503.

        A generation now while fewer than ``max_active`` slots are held
        (``holders``: running, or about to) and nobody waits, so a newcomer never overtakes the line.
        Otherwise, with ``--admission queue``, the end of the line, while it
        is shorter than ``max_waiting``. Everything else is refused early with
        503 and ``Retry-After``, before anything is stored. Nothing here
        awaits: the event loop runs one handler at a time, so tickets are in
        exactly the order requests reached this line, however many arrive at once.
        """
        prompt_ids, messages = (turn.prompt_ids, turn.messages) if turn is not None else self.measure(req)
        config = self.config
        taken = len(self.holders)
        if self.closing:
            raise busy("the server is shutting down")
        if taken < config.max_active and not self.queue:
            ahead = None
        elif config.admission == "refuse" or config.max_active < 1:  # a line in front of no slot would never move
            instead = f"; with {flag('admission')} queue, requests wait in line" if config.admission == "refuse" else ""
            raise busy(f"{taken} generations are running, the limit is {config.max_active}"
                       f" ({flag('max_active')}{instead})")
        elif len(self.queue) >= config.max_waiting:
            raise busy(f"{taken} generations are running and the line is full ({len(self.queue)} waiting,"
                       f" {flag('max_waiting')} {config.max_waiting})")
        else:
            ahead = len(self.queue)
        record = LogRecord(id=request_id or self.new_id(), path=path, naive=config.naive, generation_id=generation_id,
                           conversation_id=turn.conversation_id if turn else req.conversation_id,
                           prompt_tokens=len(prompt_ids), queue_position=ahead)
        ticket = Ticket(req, record, prompt_ids, tuple(messages), turn, ahead=ahead)
        self.log[record.id] = record
        while len(self.log) > MAX_LOG_RECORDS:
            self.log.popitem(last=False)
        if ahead is None:
            ticket.granted = True
            self.holders.add(ticket)
        else:
            self.queue.append(ticket)
        return ticket

    async def in_queue(self, ticket: Ticket, interval: float) -> AsyncIterator[int | None]:
        """While ``ticket`` waits: its place on arrival and at every change; ``None`` (a keep-alive is due) after
        ``interval`` silent seconds. It ends when the ticket's turn comes or it left (``ticket.left``)."""
        silence = Silence(interval)
        told: int | None = None
        try:
            while ticket.waiting:
                if ticket.ahead != told:
                    told = ticket.ahead
                    yield told
                elif not await silence.wait(ticket.moved()):
                    yield None
        finally:
            silence.close()

    async def wait_turn(self, ticket: Ticket, tell: Callable[[int | None], Awaitable[None]] | None = None) -> bool:
        """Wait in line for the ticket's turn: True once it came, False if the reader left first.

        ``tell(ahead)`` gets the reader's place on arrival and at every change,
        and ``None`` when a keep-alive is due (every ``ping_interval`` of
        silence). A write that fails (``tell`` raised ``ClientGone``) takes
        the reader out of line at once, and raises; whoever watches the
        reader meanwhile (``Answer.watching``: its EOF) calls ``leave``.
        """
        if ticket.waiting:
            try:
                async with aclosing(self.in_queue(ticket, self.config.ping_interval)) as places:
                    async for ahead in places:
                        if tell is not None:
                            await tell(ahead)
            except ClientGone as gone:
                self.leave(ticket, gone.signal)
                raise
        return ticket.left is None

    def leave(self, ticket: Ticket, signal: str) -> bool:
        """Take a ticket out of line before its generation started: the reader left, stopped, or is shut out.

        At once, and counted (``left_queue``); those behind it move up, and a
        slot it was given goes to the next in line. No generation ran for it
        and nothing was stored (a ``/generations`` turn was, at its POST); its
        ``/log`` record says how long it waited and how it went. False when it
        had started or left already: then there is nothing to do.
        """
        if ticket.started or ticket.left is not None:
            return False
        ticket.left = signal
        if ticket.waiting:
            self.queue.remove(ticket)
            ticket.ahead = None
            self._renumber()
        else:
            self.release(ticket)
        self.left_queue += 1
        record = ticket.record
        record.stop_signal, record.tokens_at_stop = signal, 0
        record.client_left = signal in LEAVING_SIGNALS
        record.said_stop = signal == STOP_MESSAGE
        record.queued_s = time.monotonic() - ticket.arrived
        record.left_queue = True
        record.ended = time.time()
        record.done = True
        ticket._notify()
        return True

    def release(self, ticket: Ticket) -> None:
        """The ticket's answer is over (its generation finished, it failed to start, it left): its slot is free.

        The slot goes to the first in line at once. Releasing twice, or a
        ticket that holds none, does nothing more than granting free slots.
        """
        self.holders.discard(ticket)
        self._grant()

    def _grant(self) -> None:
        """Hand every free slot to the first in line, then tell the rest their new places."""
        moved = False
        while self.queue and len(self.holders) < self.config.max_active and not self.closing:
            ticket = self.queue.popleft()
            ticket.ahead, ticket.granted = None, True
            self.holders.add(ticket)
            ticket._notify()
            moved = True
        if moved:
            self._renumber()

    def _renumber(self) -> None:
        for place, ticket in enumerate(self.queue):
            if ticket.ahead != place:
                ticket.ahead = place
                ticket._notify()

    # -- the user's turn ------------------------------------------------------

    def measure(self, req: GenerationRequest, through: str | None = None) -> tuple[list[int], tuple[dict[str, str], ...]]:
        """What the model will read, refused (400) when it and ``max_tokens`` do not fit the context.

        A ``conversation_id`` continues that conversation (404 if there is
        none; 503 if its store does not answer); with ``chat`` the model reads
        all of it. Nothing is stored. ``through``: the user's message was
        committed already (a ``/generations`` POST on a replica), and the
        conversation up to it, the prompt included, is what the model reads.
        """
        store = self.store
        if req.conversation_id is not None and store.conversation(req.conversation_id) is None:
            raise HTTPError(404, f"no conversation {req.conversation_id!r}")
        if req.conversation_id is not None and req.chat:
            if through is not None:
                messages = tuple(store.as_chat_messages(req.conversation_id, through))
            else:
                messages = (*store.as_chat_messages(req.conversation_id), {"role": "user", "content": req.prompt})
        else:
            messages = req.messages or ({"role": "user", "content": req.prompt},)
        prompt_ids = self.source.prompt_ids(messages, chat=req.chat)
        if prompt_ids:
            check_context(len(prompt_ids), req.max_tokens, self.source.context_length)
        return prompt_ids, tuple(messages)

    # -- the server going away ------------------------------------------------------

    def stop_all(self) -> None:
        """The server is going away: let nobody else in, empty the line, stop every generation (naive ones too).

        Those not started leave (their slots go to nobody: the line is
        closed); each started one is stopped by its holder, as its reader's
        stop would be, with ``SERVER_SHUTDOWN``, which stops a naive one too.
        """
        self.closing = True
        for ticket in [*self.queue, *self.holders]:
            if not ticket.started:
                self.leave(ticket, SERVER_SHUTDOWN)
        for ticket in list(self.holders):
            if ticket.job is not None and ticket.holder is not None:
                ticket.holder.stop(SERVER_SHUTDOWN)

    async def wait_all(self) -> None:
        """Let the threads see their stop flag and return."""
        for job in list(self.running):
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(job.generation.wait(), 2.0)

