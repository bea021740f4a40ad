"""Persist conversations, and answers that stop halfway, in SQLite.

A streamed answer can end in many ways besides the model finishing: the
length limit, the reader closing the tab, the user pressing stop, an error,
the server itself dying. Production keeps the partial text in every one of
those cases, and records *why* it ended, because the next turn depends on it:
an answer cut off at the length limit and fed back to the model unmarked
reads as if it were complete.

The rules this module follows, and why:

* The user's message is committed *before* generation starts, so a crash can
  never lose what the user typed, only (part of) the answer.
* The assistant's row is created at once, with status ``streaming``. Text is
  accumulated on the server, as it is sent, never taken back from the client
  (the client may be gone, or lying), and written to the database at most
  every ``flush_interval`` seconds: a crash loses at most that much text,
  without paying a commit per token. On the server every answer's text of
  one tick goes in one transaction (``store_answers.FlushRounds``), not a
  commit per answer.
* Servers may share one file: a ``streaming`` row may be another process's
  live answer. Each answer records its owner and a heartbeat (every flush,
  and a timer when nothing new came); ``recover_interrupted``, at start and
  at most once per bound from our answers' timers, closes as ``interrupted``
  only those whose owner is gone (``Lease.gone``).

This module holds the ``Store`` (one connection to the file, every read and
write); the ``AnswerWriter`` (one answer, as it streams) and the rounds that
write many at once are in ``streamlab.server.store.answers``. What the file
holds, its tables and migrations, the ``Message`` and ``Conversation`` rows
and the status words, is in ``streamlab.server.store.schema``; those names,
``AnswerWriter``, and the stop reasons of ``streamlab.protocol.endings`` that callers have
always imported from here, are re-exported.

SQLite runs in WAL mode: readers (a notebook, a second process) never block
the writer and never see half a transaction. With ``synchronous=NORMAL`` a
commit does not wait for the disk; it survives the process being killed,
though the last commits may be lost if the whole machine loses power.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

# Why an answer ended: the stop reasons of the whole project, defined once in protocol/endings.py.
from streamlab.protocol.endings import (
    INCOMPLETE_REASONS,
    INTERRUPTED,
    STOP_REASONS,
)
from streamlab.server.store.answers import AnswerWriter, FlushRounds
from streamlab.server.store.conversations import Begun, chat_messages
from streamlab.server.store.file import CHOOSE, make_folder, opening
from streamlab.net.errors import UserError
from streamlab.server.store.schema import (
    _LEASE_QUERY, _MESSAGE_COLUMNS, DONE, LEASE_COLUMNS, MIGRATIONS, SCHEMA_VERSION,
    STALE_FLUSHES, STREAMING, Conversation, Message, Owner, _lease, _message,
    default_path, process_exists, stale_after,
)

__all__ = ["BUSY_TIMEOUT_MS", "Store"]

BUSY_TIMEOUT_MS = 5000  # wait this long for another process's write lock before failing


# --------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------


class Store:
    """One SQLite file of conversations, opened by one connection.

    The server runs an asyncio loop, with generation in threads and the
    flushes' timer, so the connection is shared between threads
    (``check_same_thread=False``). A connection has a single transaction state:
    a lock around every use of it keeps one thread from reading, or
    committing, another thread's half-done work. Each write is its own short
    transaction, so the lock is held for microseconds. Other processes open
    their own connections to the same file; WAL lets them read while we
    write, and ``busy_timeout`` makes writers queue instead of failing.

    ``owner`` is the process this store writes for: this one, unless a test
    makes two stores stand for two processes.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        flush_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        owner: Owner | None = None,
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        make_folder(self.path)  # a file in the way, or no right to make it: a UserError naming the path
        self.flush_interval = float(flush_interval)
        self.clock = clock
        self.owner = owner or Owner.this_process()
        self.recovered = 0  # answers of gone owners this store has closed, at start and since
        self._last_sweep = clock()
        self._lock = threading.Lock()
        self._writers: weakref.WeakSet[AnswerWriter] = weakref.WeakSet()
        self._rounds = FlushRounds(self)  # the answers streaming on an event loop: their flushes, tick by tick
        self._conn: sqlite3.Connection | None = None
        with opening(self.path, self.close):  # closed on any failure; SQLite's, told with the path (store_file)
            # isolation_level=None: no hidden BEGIN; every transaction here is spelled out.
            self._conn = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
            )
            conn = self._conn
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # WAL is a property of the file (it persists); synchronous is per connection. Not SQLite: fails here.
            self.journal_mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()

    def _migrate(self) -> None:
        """Bring the file up to ``SCHEMA_VERSION``, in one transaction.

        The version is read under the write lock, so two processes opening a
        new file at once cannot both create its tables.
        """
        with self._transaction() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise UserError(
                    f"the store {self.path} has schema version {version}; this streamlab knows "
                    f"up to {SCHEMA_VERSION}: upgrade streamlab to open it, or {CHOOSE}"
                )
            for number in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[number - 1]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {number}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that reads before it writes: all of it, or none.

        ``BEGIN IMMEDIATE`` takes the file's write lock at once, not at the
        first write, so no other writer can change what we read in between.
        (A single UPDATE or INSERT needs none of this: on its own, each
        statement is already its own transaction.)
        """
        conn = self._db()
        with self._lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the store is closed")
        return self._conn

    @property
    def stale_after(self) -> float:  # how long our answers may go without a heartbeat before they count as dead
        return stale_after(self.flush_interval)

    @property
    def beat_every(self) -> float:  # how often an answer with nothing new to write still sends a heartbeat
        return self.stale_after / STALE_FLUSHES

    def settings(self) -> dict[str, object]:
        """The pragmas that matter, as the file and this connection report them."""
        conn = self._db()
        with self._lock:
            names = ("journal_mode", "synchronous", "busy_timeout", "foreign_keys", "user_version")
            return {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in names}

    # ---- conversations and the user's turn --------------------------------

    def new_conversation(self, title: str | None = None) -> str:
        """Create a conversation and return its id (a uuid4 in hex)."""
        conversation_id = uuid.uuid4().hex
        conn = self._db()
        with self._lock:
            conn.execute(
                "INSERT INTO conversations (id, created, title) VALUES (?, ?, ?)",
                (conversation_id, self.clock(), title),
            )
        return conversation_id

    def _insert_message(self, conversation_id: str, role: str, content: str, status: str, owned: bool) -> Message:
        """Insert a message at the end of its conversation and commit it (``owned``: with our lease).

        The next ``seq`` is read and written in one transaction that holds
        the write lock throughout: that is what keeps two writers (threads
        or processes) from taking the same number.
        """
        message_id = uuid.uuid4().hex
        now = self.clock()
        me = self.owner
        lease = (me.host, me.pid, me.boot, now, self.stale_after) if owned else (None,) * 5
        with self._transaction() as conn:
            if conn.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
                raise KeyError(f"no conversation {conversation_id!r}")
            (seq,) = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()
            conn.execute(
                "INSERT INTO messages (id, conversation_id, seq, role, content, status, incomplete, tokens,"
                f" created, updated, {', '.join(LEASE_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, 0, 0, ?, ?, ?, ?, ?, ?, ?)",
                (message_id, conversation_id, seq, role, content, status, now, now, *lease),
            )
        return Message(message_id, conversation_id, seq, role, content, status, None, False, 0, now, now, None)

    def add_user_message(self, conversation_id: str, text: str) -> Message:
        """Commit the user's message; call it *before* generation starts.

        When this returns, the message is on disk for every other connection:
        whatever happens to the answer, the question is not lost.
        """
        return self._insert_message(conversation_id, "user", text, DONE, False)

    # ---- the assistant's turn ----------------------------------------------

    def begin_answer(self, conversation_id: str, begun: Begun | None = None) -> AnswerWriter:
        """Create the answer's row now (``streaming``, empty) and return its writer.

        The row exists from the first moment, so a crash before the first
        flush still leaves a trace that recovery can close as ``interrupted``;
        it carries our lease from that moment too, so that no other process
        takes it for a crash's. ``begun``: an answer a dead writer began, its
        row taken over (our lease, streaming again, from the text its readers had).
        """
        if begun is None:
            message = self._insert_message(conversation_id, "assistant", "", STREAMING, True)
        else:
            message = self._resume_message(begun)
        writer = AnswerWriter(self, message, kept=begun)
        self._writers.add(writer)
        return writer

    def _resume_message(self, begun: Begun) -> Message:
        """Take over a dead writer's answer: our lease on its row, streaming, its text the one its readers had."""
        now, me = self.clock(), self.owner
        with self._transaction() as conn:
            changed = conn.execute(
                "UPDATE messages SET content = ?, tokens = ?, status = ?, stop_reason = NULL, incomplete = 0,"
                " updated = ?, owner_host = ?, owner_pid = ?, owner_boot = ?, heartbeat = ?, stale_after = ?"
                " WHERE id = ? AND role = 'assistant'",
                (begun.text, begun.tokens, STREAMING, now, me.host, me.pid, me.boot, now, self.stale_after,
                 begun.message_id),
            ).rowcount
        if not changed:
            raise KeyError(f"no answer {begun.message_id!r}")
        return self.get_message(begun.message_id)

    def _write_progress(self, message_id: str, content: str, tokens: int) -> None:
        conn = self._db()
        with self._lock:
            now = self.clock()
            conn.execute(
                "UPDATE messages SET content = ?, tokens = ?, updated = ?, heartbeat = ?, stale_after = ?"
                " WHERE id = ?", (content, tokens, now, now, self.stale_after, message_id),
            )

    def _write_round(self, progress: list[tuple[str, str, int]], beats: list[str], now: float) -> None:
        """One tick of ``FlushRounds``: every answer's ``(id, text, tokens)`` and the heartbeats, one transaction.

        A reader of the file sees all of the tick or none of it. A row no
        longer streaming is left alone: its ending was written (or another
        process recovered it) after the round took its text, and a row is
        never taken back to older text.
        """
        bound = self.stale_after
        with self._transaction() as conn:
            conn.executemany(
                "UPDATE messages SET content = ?, tokens = ?, updated = ?, heartbeat = ?, stale_after = ?"
                " WHERE id = ? AND status = ?",
                [(text, tokens, now, now, bound, message_id, STREAMING) for message_id, text, tokens in progress],
            )
            conn.executemany(
                "UPDATE messages SET heartbeat = ?, stale_after = ? WHERE id = ? AND status = ?",
                [(now, bound, message_id, STREAMING) for message_id in beats],
            )

    def _write_heartbeat(self, message_id: str) -> None:
        """Nothing new to write, but the writer is alive: say so (``updated`` stays the text's time)."""
        conn = self._db()
        with self._lock:
            conn.execute(
                "UPDATE messages SET heartbeat = ?, stale_after = ? WHERE id = ?",
                (self.clock(), self.stale_after, message_id),
            )

    def _write_final(
        self, message_id: str, content: str, tokens: int, stop_reason: str, error: str | None
    ) -> Message:
        """The answer's ending, written at once; the row as it now stands."""
        conn = self._db()
        with self._lock:
            conn.execute(
                "UPDATE messages SET content = ?, tokens = ?, status = ?, stop_reason = ?,"
                " incomplete = ?, error = ?, updated = ? WHERE id = ?",
                (content, tokens, DONE, stop_reason, int(stop_reason in INCOMPLETE_REASONS),
                 error, self.clock(), message_id),
            )
        return self.get_message(message_id)

    def recover_interrupted(self) -> int:
        """Close, as ``interrupted``, every ``streaming`` answer whose owner is gone; return how many.

        Call it at server start, before serving; it is safe at any time, from any
        process, since ``Lease.gone`` spares live answers. Such a row keeps the
        text its last flush wrote. Leases are read and rows closed in one
        transaction: no owner's heartbeat can land between the two.
        """
        now = self.clock()
        exists = functools.cache(process_exists)  # one look at each process, however many answers it holds
        with self._transaction() as conn:
            leases = [_lease(row) for row in conn.execute(_LEASE_QUERY + " WHERE status = ?", (STREAMING,))]
            gone = [lease.message_id for lease in leases if lease.gone(self.owner, now, exists)]
            conn.executemany(
                "UPDATE messages SET status = ?, stop_reason = ?, incomplete = 1, updated = ?"
                " WHERE id = ? AND status = ?",
                [(DONE, INTERRUPTED, now, message_id, STREAMING) for message_id in gone],
            )
        self._last_sweep = now
        self.recovered += len(gone)
        return len(gone)

    def _sweep_if_due(self) -> None:  # from our answers' timers: recover again once a bound has passed
        if self._conn is not None and self.clock() - self._last_sweep >= self.stale_after:
            self.recover_interrupted()

    # ---- reading -----------------------------------------------------------

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        conn = self._db()
        with self._lock:
            return conn.execute(sql, params).fetchall()

    def history(self, conversation_id: str) -> list[Message]:
        """The conversation's messages in order (empty if there is no such conversation)."""
        rows = self._query(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY seq",
            (conversation_id,),
        )
        return [_message(row) for row in rows]

    def get_message(self, message_id: str) -> Message:
        """One message by id; ``KeyError`` if there is none."""
        rows = self._query(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,))
        if not rows:
            raise KeyError(f"no message {message_id!r}")
        return _message(rows[0])

    def conversation(self, conversation_id: str) -> Conversation | None:
        """One conversation by id, or None (``history`` cannot tell: a conversation may have no messages)."""
        rows = self._query("SELECT id, created, title FROM conversations WHERE id = ?", (conversation_id,))
        return Conversation(*rows[0]) if rows else None

    def conversations(self) -> list[Conversation]:
        """Every conversation, oldest first."""
        rows = self._query("SELECT id, created, title FROM conversations ORDER BY created, rowid")
        return [Conversation(*row) for row in rows]

    def answers_by_reason(self) -> dict[str, int]:
        """How many answers ended for each reason: every reason, zeros included.

        Answers still being written are counted under ``"streaming"``, present
        only when there are some.
        """
        counts = {reason: 0 for reason in STOP_REASONS}
        rows = self._query(
            "SELECT status, stop_reason, COUNT(*) FROM messages WHERE role = 'assistant'"
            " GROUP BY status, stop_reason"
        )
        for status, reason, count in rows:
            key = STREAMING if status == STREAMING else reason
            counts[key] = counts.get(key, 0) + count
        return counts

    def rows(self, conversation_id: str | None = None) -> list[dict]:
        """Messages as plain dicts (every column), for a table in a notebook."""
        where, params = ("WHERE m.conversation_id = ?", (conversation_id,)) if conversation_id else ("", ())
        rows = self._query(
            f"SELECT {', '.join('m.' + c for c in Message.__dataclass_fields__)} FROM messages m"
            f" JOIN conversations c ON c.id = m.conversation_id {where}"
            " ORDER BY c.created, c.rowid, m.seq",
            params,
        )
        return [asdict(_message(row)) for row in rows]

    def as_chat_messages(self, conversation_id: str, through: str | None = None) -> list[dict[str, str]]:
        """The conversation as ``[{"role", "content"}]`` for the model's next turn, each cut-off answer marked
        (``conversations.chat_messages``); up to message ``through``, when given."""
        return chat_messages(self.history(conversation_id), through)

    # ---- closing -----------------------------------------------------------

    def close(self) -> None:
        """Finish any answer still being written as ``interrupted``, then close.

        A server that shuts down cleanly thereby records the truth at once,
        instead of leaving it to the next start's recovery. Safe to call twice.
        """
        if self._conn is None:
            return
        for writer in list(self._writers):
            writer.finish(INTERRUPTED)
        with self._lock:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

