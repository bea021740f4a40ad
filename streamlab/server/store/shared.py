"""Conversations in Redis: the store every replica and every worker reads, so a next turn may land anywhere.

Each ``serve`` keeps its conversations in its own SQLite file
(``database.Store``). Behind a round-robin balancer a conversation's second
turn (a WebSocket that reconnected, a ``conversation_id`` on any route) lands
on another replica, whose file has never heard of it: 404, the history lost,
unless the balancer is sticky. With ``serve --events redis://HOST:PORT`` the
replicas keep them in that Redis instead, as do the workers that generate
``/generations`` (``resources/worker.py``): the same interface
(``conversations.Conversations``), the same ``AnswerWriter`` and flush rounds,
the same rows read back (``schema.Message``), the same note on an answer cut
off. A turn is owned by whoever generates its answer: it commits the user's
message before generating, opens the answer's row, writes its text at most
every ``--flush-interval`` and its ending with the stop reason and the
incomplete flag; a ``/generations`` POST commits its user's message on the
replica that took it (its 201 names the conversation), the worker the rest.

What Redis holds (``streamlab:`` keys, beside the shared log's):

- ``conv:{id}``, a hash: ``id``, ``created``, ``title``, ``messages`` (the last seq);
- ``conv:{id}:messages``, a list: its message ids, in order;
- ``msg:{id}``, a hash: a ``Message``'s fields and, while it streams, its lease
  (``owner_host``, ``owner_pid``, ``owner_boot``, ``heartbeat``, ``stale_after``,
  as the SQLite rows hold them);
- ``conversations``, a sorted set (id -> created), and ``answers:streaming``, the
  answers still being written (what recovery looks at).

Recovery follows the SQLite store's rule (``schema.Lease``): an answer whose
writer is gone (its heartbeat older than its bound; on this machine, its
process gone) is closed as ``interrupted`` with the text it had, by whichever
store sweeps first, or reads its conversation. Each ``SharedStore`` is an
owner of its own (a ``boot`` drawn per store, not per process: two replicas or
workers in one test process are two writers). A worker that continues a dead
one's answer takes its row over (``Begun``): its lease, and the text the
readers had; an ending is written only by the row's owner, so the dead
writer's, arriving late, changes nothing.

When Redis does not answer, what cannot wait is refused and what was accepted
is kept: reading a conversation or committing a turn raises
``StoreUnavailable`` (503 with ``Retry-After``, in each route's own shape; a
WebSocket closes with 1013), nothing stored; an answer already streaming goes
on (its flushes try again at the next tick), and its ending, kept in memory,
is written as soon as Redis answers again (``RETRY``). The client is redis-py's
synchronous one, as SQLite's calls are synchronous: one round trip on
loopback is ~0.1 ms, and each call is bounded by ``STORE_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from streamlab.net.errors import UserError
from streamlab.protocol.endings import INCOMPLETE_REASONS, INTERRUPTED
from streamlab.server.store.answers import AnswerWriter, FlushRounds
from streamlab.server.store.conversations import Begun, StoreUnavailable, chat_messages
from streamlab.server.store.schema import (
    DONE, STALE_AFTER_MIN_S, STALE_FLUSHES, STREAMING, Conversation, Lease, Message, Owner, stale_after,
)

__all__ = ["SharedStore", "is_redis_error", "open_store_client"]

PREFIX = "streamlab"
CONVERSATIONS = f"{PREFIX}:conversations"  # every conversation id -> when it was made
STREAMING_ANSWERS = f"{PREFIX}:answers:streaming"  # the answers still being written: recovery's index
STORE_TIMEOUT = 1.0  # s: the longest one call may wait for Redis (connect, or answer), once retried
RETRY = (0.1, 2.0)  # s: the first wait before writing kept endings again, and the longest (doubling)
LEASE_FIELDS = ("owner_host", "owner_pid", "owner_boot", "heartbeat", "stale_after")


def conversation_key(conversation_id: str) -> str:
    return f"{PREFIX}:conv:{conversation_id}"


def messages_key(conversation_id: str) -> str:
    return f"{PREFIX}:conv:{conversation_id}:messages"


def message_key(message_id: str) -> str:
    return f"{PREFIX}:msg:{message_id}"


def is_redis_error(err: BaseException) -> bool:
    """An error of redis-py's (its connection lost, a timeout, a refusal), by its module: no import needed."""
    return type(err).__module__.split(".")[0] == "redis" or isinstance(err, (ConnectionError, TimeoutError))


def open_store_client(url: str) -> Any:
    """redis-py's synchronous client for ``url`` (replies as text), each call bounded; the tests swap in a fake.

    One immediate retry: a pooled connection found dead (Redis restarted)
    connects again at once; a Redis that is gone fails the call within a
    connect, and the caller says so (``StoreUnavailable``).
    """
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise UserError("--events redis://...: redis-py is not installed here (pip install redis)") from None
    try:
        return redis.Redis.from_url(url, decode_responses=True, socket_timeout=STORE_TIMEOUT,
                                    socket_connect_timeout=STORE_TIMEOUT, retry=Retry(NoBackoff(), 1))
    except ValueError as err:
        raise UserError(f"--events {url}: {err} (give redis://HOST:PORT)") from None


def _optional(fields: dict[str, str], name: str) -> str | None:
    value = fields.get(name)
    return value if value != "" else None


def _message(fields: dict[str, str]) -> Message:
    return Message(
        id=fields["id"], conversation_id=fields["conversation_id"], seq=int(fields.get("seq", 0)),
        role=fields["role"], content=fields.get("content", ""), status=fields["status"],
        stop_reason=_optional(fields, "stop_reason"), incomplete=fields.get("incomplete") == "1",
        tokens=int(fields.get("tokens", 0)), created=float(fields["created"]), updated=float(fields["updated"]),
        error=_optional(fields, "error"),
    )


def _lease(fields: dict[str, str]) -> Lease:
    owner = None
    if fields.get("owner_host"):
        owner = Owner(fields["owner_host"], int(fields["owner_pid"]), fields["owner_boot"])
    heartbeat = float(fields.get("heartbeat") or fields.get("updated") or 0.0)
    return Lease(fields["id"], owner, heartbeat, float(fields.get("stale_after") or STALE_AFTER_MIN_S))


class SharedStore:
    """The conversations of every replica, in one Redis: the interface of ``database.Store``, the rows elsewhere."""

    def __init__(self, redis: Any, *, flush_interval: float = 1.0, clock: Callable[[], float] = time.time,
                 owner: Owner | None = None) -> None:
        self.redis = redis
        self.flush_interval = float(flush_interval)
        self.clock = clock
        here = Owner.this_process()
        self.owner = owner or Owner(here.host, os.getpid(), uuid.uuid4().hex)  # a writer of its own, per store
        self.recovered = 0  # answers of gone writers this store has closed
        self._last_sweep = clock()
        self._writers: weakref.WeakSet[AnswerWriter] = weakref.WeakSet()
        self._rounds = FlushRounds(self)
        self._rows: dict[str, Message] = {}  # each answer this store writes, as it began: its ending is built on it
        self._pending: dict[str, dict[str, Any]] = {}  # message id -> its ending, not written yet (Redis was gone)
        self._lock = threading.Lock()  # guards _pending and the retry timer
        self._retry: Any = None
        self._retry_wait = RETRY[0]

    @classmethod
    def open(cls, url: str, *, flush_interval: float = 1.0) -> SharedStore:
        """The store on ``url``; what a crash left streaming closed now if Redis answers (else at a later sweep)."""
        store = cls(open_store_client(url), flush_interval=flush_interval)
        try:
            store.recover_interrupted()
        except StoreUnavailable:
            pass
        return store

    @property
    def stale_after(self) -> float:
        return stale_after(self.flush_interval)

    @property
    def beat_every(self) -> float:
        return self.stale_after / STALE_FLUSHES

    @contextmanager
    def _reaching(self, doing: str) -> Iterator[None]:
        """Redis not answering, as ``StoreUnavailable`` (a 503 with ``Retry-After`` wherever it reaches a reader)."""
        try:
            yield
        except StoreUnavailable:
            raise
        except Exception as err:  # noqa: BLE001 - redis-py's ConnectionError, TimeoutError...
            if not is_redis_error(err):
                raise
            raise StoreUnavailable(doing, err) from None

    def _lease_fields(self, now: float) -> dict[str, Any]:
        me = self.owner
        return {"owner_host": me.host, "owner_pid": me.pid, "owner_boot": me.boot, "heartbeat": now,
                "stale_after": self.stale_after}

    # ---- conversations and the user's turn --------------------------------

    def conversation(self, conversation_id: str) -> Conversation | None:
        with self._reaching("reading the conversation"):
            fields = self.redis.hgetall(conversation_key(conversation_id))
        if not fields:
            return None
        return Conversation(fields["id"], float(fields["created"]), _optional(fields, "title"))

    def conversations(self) -> list[Conversation]:
        """Every conversation, oldest first."""
        with self._reaching("listing the conversations"):
            ids = self.redis.zrange(CONVERSATIONS, 0, -1)
            pipe = self.redis.pipeline(transaction=False)
            for conversation_id in ids:
                pipe.hgetall(conversation_key(conversation_id))
            rows = pipe.execute() if ids else []
        return [Conversation(f["id"], float(f["created"]), _optional(f, "title")) for f in rows if f]

    def new_conversation(self, title: str | None = None) -> str:
        conversation_id, now = uuid.uuid4().hex, self.clock()
        with self._reaching("a new conversation"):
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(conversation_key(conversation_id), mapping={
                "id": conversation_id, "created": now, "messages": 0, **({"title": title} if title else {})})
            pipe.zadd(CONVERSATIONS, {conversation_id: now})
            pipe.execute()
        return conversation_id

    def _insert_message(self, conversation_id: str, role: str, content: str, status: str, owned: bool) -> Message:
        """A message at the end of its conversation, committed (``owned``: with our lease, in the streaming index).

        Its ``seq`` is the conversation's counter, incremented by Redis (two
        writers at once cannot take one number); the list keeps the order.
        """
        message_id, now = uuid.uuid4().hex, self.clock()
        with self._reaching("storing the message"):
            if not self.redis.exists(conversation_key(conversation_id)):
                raise KeyError(f"no conversation {conversation_id!r}")
            seq = int(self.redis.hincrby(conversation_key(conversation_id), "messages", 1))
            fields = {"id": message_id, "conversation_id": conversation_id, "seq": seq, "role": role,
                      "content": content, "status": status, "incomplete": 0, "tokens": 0, "created": now,
                      "updated": now, **(self._lease_fields(now) if owned else {})}
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(message_key(message_id), mapping=fields)
            pipe.rpush(messages_key(conversation_id), message_id)
            if owned:
                pipe.sadd(STREAMING_ANSWERS, message_id)
            pipe.execute()
        return Message(message_id, conversation_id, seq, role, content, status, None, False, 0, now, now, None)

    def add_user_message(self, conversation_id: str, text: str) -> Message:
        """Commit the user's message, before generation starts: once this returns, every replica can read it."""
        return self._insert_message(conversation_id, "user", text, DONE, False)

    # ---- the assistant's turn ----------------------------------------------

    def begin_answer(self, conversation_id: str, begun: Begun | None = None) -> AnswerWriter:
        """The answer's row now (``streaming``, with our lease), or a dead writer's taken over (``begun``)."""
        if begun is None:
            message = self._insert_message(conversation_id, "assistant", "", STREAMING, True)
        else:
            message = self._resume_message(begun)
        self._rows[message.id] = message
        writer = AnswerWriter(self, message, kept=begun)
        self._writers.add(writer)
        return writer

    def _resume_message(self, begun: Begun) -> Message:
        """A dead writer's answer made ours: our lease, streaming again, the text its readers had."""
        now, key = self.clock(), message_key(begun.message_id)
        with self._reaching("taking the answer over"):
            if self.redis.hget(key, "role") != "assistant":
                raise KeyError(f"no answer {begun.message_id!r}")
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(key, mapping={"content": begun.text, "tokens": begun.tokens, "status": STREAMING,
                                    "incomplete": 0, "updated": now, **self._lease_fields(now)})
            pipe.hdel(key, "stop_reason", "error")
            pipe.sadd(STREAMING_ANSWERS, begun.message_id)
            pipe.hgetall(key)
            fields = pipe.execute()[-1]
        return _message(fields)

    def _write_progress(self, message_id: str, content: str, tokens: int) -> None:
        now = self.clock()
        with self._reaching("writing the answer"):
            self.redis.hset(message_key(message_id), mapping={
                "content": content, "tokens": tokens, "updated": now, "heartbeat": now, "stale_after": self.stale_after})

    def _write_round(self, progress: list[tuple[str, str, int]], beats: list[str], now: float) -> None:
        """One tick of the flush rounds: every answer's text and the heartbeats, in one transaction."""
        bound = self.stale_after
        with self._reaching("writing the answers"):
            pipe = self.redis.pipeline(transaction=True)
            for message_id, text, tokens in progress:
                pipe.hset(message_key(message_id), mapping={
                    "content": text, "tokens": tokens, "updated": now, "heartbeat": now, "stale_after": bound})
            for message_id in beats:
                pipe.hset(message_key(message_id), mapping={"heartbeat": now, "stale_after": bound})
            pipe.execute()
        self._write_pending()

    def _write_heartbeat(self, message_id: str) -> None:
        with self._reaching("the answer's heartbeat"):
            self.redis.hset(message_key(message_id), mapping={"heartbeat": self.clock(), "stale_after": self.stale_after})

    def _write_final(self, message_id: str, content: str, tokens: int, stop_reason: str,
                     error: str | None) -> Message:
        """The ending, written now, or kept and written once Redis answers again; the row as it is (or will be)."""
        now = self.clock()
        ending = {"content": content, "tokens": tokens, "status": DONE, "stop_reason": stop_reason,
                  "incomplete": int(stop_reason in INCOMPLETE_REASONS), "updated": now, "error": error or ""}
        began = self._rows.pop(message_id, None)
        try:
            self._write_ending(message_id, ending)
        except StoreUnavailable:
            with self._lock:
                self._pending[message_id] = ending
            self._arm_retry()
        if began is None:
            return self.get_message(message_id)
        return dataclasses.replace(began, content=content, tokens=tokens, status=DONE, stop_reason=stop_reason,
                                   incomplete=bool(ending["incomplete"]), updated=now, error=error)

    def _write_ending(self, message_id: str, ending: dict[str, Any], tries: int = 5) -> bool:
        """Write an answer's ending, if the row is still ours (a worker that took it over writes its own). Written?"""
        key = message_key(message_id)
        with self._reaching("the answer's ending"):
            for _ in range(tries):
                with self.redis.pipeline(transaction=True) as pipe:
                    try:
                        pipe.watch(key)
                        if pipe.hget(key, "owner_boot") != self.owner.boot:
                            return False
                        pipe.multi()
                        pipe.hset(key, mapping=ending)
                        pipe.srem(STREAMING_ANSWERS, message_id)
                        pipe.execute()
                        return True
                    except Exception as err:  # noqa: BLE001 - WatchError: the row changed meanwhile (a sweep): look again
                        if type(err).__name__ != "WatchError":
                            raise
        return False

    def _write_pending(self) -> None:
        """Write the endings kept while Redis was gone; those it still cannot take wait for the next try."""
        with self._lock:
            pending = list(self._pending.items())
        for message_id, ending in pending:
            try:
                self._write_ending(message_id, ending)
            except StoreUnavailable:
                return
            with self._lock:
                if self._pending.get(message_id) is ending:
                    del self._pending[message_id]

    @property
    def pending(self) -> int:
        """How many endings wait for Redis."""
        with self._lock:
            return len(self._pending)

    def _arm_retry(self) -> None:
        with self._lock:
            if self._retry is not None:
                return
            wait = self._retry_wait
            self._retry_wait = min(2 * wait, RETRY[1])
            try:
                self._retry = asyncio.get_running_loop().call_later(wait, self._on_retry)
            except RuntimeError:  # no loop here: a thread's timer
                self._retry = threading.Timer(wait, self._on_retry)
                self._retry.daemon = True
                self._retry.start()

    def _on_retry(self) -> None:
        with self._lock:
            self._retry = None
        self._write_pending()
        if self.pending:
            self._arm_retry()
        else:
            self._retry_wait = RETRY[0]

    # ---- recovery ----------------------------------------------------------

    def _gone(self, lease: Lease, now: float) -> bool:
        """``Lease.gone``, except that another store of this very process is judged by its heartbeat alone."""
        owner = lease.owner
        if owner is not None and owner != self.owner and (owner.host, owner.pid) == (self.owner.host, self.owner.pid):
            return now - lease.heartbeat > lease.stale_after
        return lease.gone(self.owner, now)

    def _close_gone(self, message_id: str, now: float) -> dict[str, str] | None:
        """Close one streaming answer as ``interrupted`` if its writer is gone (looked at again, watched); its fields."""
        key = message_key(message_id)
        with self.redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                fields = pipe.hgetall(key)
                if not fields or fields.get("status") != STREAMING:
                    pipe.multi()
                    pipe.srem(STREAMING_ANSWERS, message_id)
                    pipe.execute()
                    return None
                if not self._gone(_lease(fields), now):
                    return None
                pipe.multi()
                pipe.hset(key, mapping={"status": DONE, "stop_reason": INTERRUPTED, "incomplete": 1, "updated": now})
                pipe.srem(STREAMING_ANSWERS, message_id)
                pipe.execute()
            except Exception as err:  # noqa: BLE001 - WatchError: its writer wrote meanwhile, so it is alive
                if type(err).__name__ != "WatchError":
                    raise
                return None
        self.recovered += 1
        return {**fields, "status": DONE, "stop_reason": INTERRUPTED, "incomplete": "1", "updated": str(now)}

    def recover_interrupted(self) -> int:
        """Close, as ``interrupted``, every streaming answer whose writer is gone; how many."""
        now = self.clock()
        with self._reaching("recovering answers"):
            closed = sum(self._close_gone(message_id, now) is not None
                         for message_id in self.redis.smembers(STREAMING_ANSWERS))
        self._last_sweep = now
        return closed

    def _sweep_if_due(self) -> None:
        if self.clock() - self._last_sweep >= self.stale_after:
            try:
                self.recover_interrupted()
                self._write_pending()
            except StoreUnavailable:
                pass

    # ---- reading -----------------------------------------------------------

    def history(self, conversation_id: str) -> list[Message]:
        """The conversation's messages in order; an answer whose writer is gone is closed as it is read."""
        with self._reaching("reading the conversation"):
            ids = self.redis.lrange(messages_key(conversation_id), 0, -1)
            pipe = self.redis.pipeline(transaction=False)
            for message_id in ids:
                pipe.hgetall(message_key(message_id))
            rows = pipe.execute() if ids else []
            now, messages = self.clock(), []
            for fields in rows:
                if fields.get("status") == STREAMING and self._gone(_lease(fields), now):
                    fields = self._close_gone(fields["id"], now) or self.redis.hgetall(message_key(fields["id"]))
                if fields:
                    messages.append(_message(fields))
        return messages

    def get_message(self, message_id: str) -> Message:
        with self._reaching("reading the message"):
            fields = self.redis.hgetall(message_key(message_id))
        if not fields:
            raise KeyError(f"no message {message_id!r}")
        return _message(fields)

    def as_chat_messages(self, conversation_id: str, through: str | None = None) -> list[dict[str, str]]:
        """The conversation for the model's next turn, each cut-off answer marked (up to ``through``, if given)."""
        return chat_messages(self.history(conversation_id), through)

    # ---- closing -----------------------------------------------------------

    def close(self) -> None:
        """Finish any answer still being written as ``interrupted``, write what waits if Redis answers, let go."""
        for writer in list(self._writers):
            writer.finish(INTERRUPTED)
        with self._lock:
            if self._retry is not None:
                self._retry.cancel()
                self._retry = None
        self._write_pending()
        close = getattr(self.redis, "close", None)
        if close is not None:
            close()
