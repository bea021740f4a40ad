"""What the conversations file holds: its tables, their migrations, the rows read back, the words stored.

``streamlab.server.store.database`` reads and writes the file; this module says what
is in it, so the shape of the data can be read, and changed, in one place:

* ``MIGRATIONS``: each schema version is the statements that bring a file
  from the version before; ``SCHEMA_VERSION`` is how far this streamlab goes.
* ``Conversation`` and ``Message``: a row as read back, frozen because it is
  a snapshot, not a live view.
* ``STREAMING`` and ``DONE``, a message's status, and the note that marks an
  incomplete answer when history is fed back to the model (``CUT_OFF_MARKER``,
  ``CUT_OFF_WORDS``).
* ``default_path``: where the file lives when no path is given.
* ``Owner`` and ``Lease``: which process is writing a streaming answer, and
  the rule that says when it is gone (``STALE_AFTER_MIN_S``, ``STALE_FLUSHES``),
  so that recovery closes the answers of dead writers and never a live one.

``streamlab.server.store.database`` re-exports every public name here.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from streamlab.protocol.endings import CLIENT_LEFT, ERROR, INTERRUPTED, MAX_TOKENS, SLOW_READER, STOPPED

__all__ = [
    "CUT_OFF_MARKER",
    "CUT_OFF_WORDS",
    "DONE",
    "LEASE_COLUMNS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "STALE_AFTER_MIN_S",
    "STALE_FLUSHES",
    "STREAMING",
    "Conversation",
    "Lease",
    "Message",
    "Owner",
    "default_path",
    "process_exists",
    "stale_after",
]


# --------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------

# A message's status: an answer is "streaming" from its first moment until
# ``finish`` (or recovery) makes it "done". User messages are born "done".
STREAMING = "streaming"
DONE = "done"

# The note appended to an incomplete answer when history is fed back to the
# model, so that neither the model nor the user takes it for a whole answer.
CUT_OFF_MARKER = "\n\n[This answer was cut off: {reason}.]"
CUT_OFF_WORDS: dict[str, str] = {
    MAX_TOKENS: "it reached the length limit",
    CLIENT_LEFT: "the reader left before it was finished",
    STOPPED: "the user asked to stop",
    ERROR: "an error ended it",
    INTERRUPTED: "the server stopped before it was finished",
    SLOW_READER: "its reader fell too far behind and the server stopped it",
    STREAMING: "it was still being written",  # a row read before its writer finished
}

# --------------------------------------------------------------------------
# Where the file lives, and what is in it
# --------------------------------------------------------------------------


def default_path() -> Path:
    """``$STREAMLAB_DATA/streamlab.db``, else ``$XDG_DATA_HOME/streamlab/streamlab.db``,
    else ``~/.local/share/streamlab/streamlab.db``.

    Conversations are the user's data, not a cache: they belong in the data
    folder, where nothing cleans them away.
    """
    if os.environ.get("STREAMLAB_DATA"):
        return Path(os.environ["STREAMLAB_DATA"]).expanduser() / "streamlab.db"
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "streamlab" / "streamlab.db"


# Each schema version is the list of statements that bring the file from the
# version before it. ``PRAGMA user_version`` (an integer in the file's header)
# records how far a file has come; a later version appends a list here.
MIGRATIONS: list[list[str]] = [
    [  # version 1
        """CREATE TABLE conversations (
            id      TEXT PRIMARY KEY,
            created REAL NOT NULL,
            title   TEXT
        )""",
        """CREATE TABLE messages (
            id              TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations(id),
            seq             INTEGER NOT NULL,          -- order within the conversation, from 1
            role            TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content         TEXT NOT NULL DEFAULT '',
            status          TEXT NOT NULL CHECK (status IN ('streaming', 'done')),
            stop_reason     TEXT,                      -- NULL for user messages and while streaming
            incomplete      INTEGER NOT NULL DEFAULT 0 CHECK (incomplete IN (0, 1)),
            tokens          INTEGER NOT NULL DEFAULT 0,  -- generated tokens (answers only)
            created         REAL NOT NULL,
            updated         REAL NOT NULL,
            error           TEXT
        )""",
        "CREATE UNIQUE INDEX messages_by_conversation ON messages (conversation_id, seq)",
    ],
    [  # version 2: who writes a streaming answer, and how long its silence may last (see Lease)
        "ALTER TABLE messages ADD COLUMN owner_host TEXT",  # the writer's machine and pid namespace
        "ALTER TABLE messages ADD COLUMN owner_pid INTEGER",  # its pid there
        "ALTER TABLE messages ADD COLUMN owner_boot TEXT",  # drawn at random when it started
        "ALTER TABLE messages ADD COLUMN heartbeat REAL",  # when it last said it is alive
        "ALTER TABLE messages ADD COLUMN stale_after REAL",  # seconds after which its silence means dead
        # Recovery reads only the streaming rows: a handful, in a file of every answer ever.
        "CREATE INDEX messages_streaming ON messages (status) WHERE status = 'streaming'",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)
LEASE_COLUMNS = ("owner_host", "owner_pid", "owner_boot", "heartbeat", "stale_after")

@dataclass(frozen=True)
class Conversation:
    id: str
    created: float
    title: str | None


@dataclass(frozen=True)
class Message:
    """One row of ``messages``; frozen because it is a snapshot, not a live view."""

    id: str
    conversation_id: str
    seq: int
    role: str
    content: str
    status: str
    stop_reason: str | None
    incomplete: bool
    tokens: int
    created: float
    updated: float
    error: str | None


_MESSAGE_COLUMNS = ", ".join(Message.__dataclass_fields__)


def _message(row: tuple) -> Message:
    fields = dict(zip(Message.__dataclass_fields__, row))
    fields["incomplete"] = bool(fields["incomplete"])
    return Message(**fields)



# --------------------------------------------------------------------------
# Who writes a streaming answer, and when it is gone
# --------------------------------------------------------------------------

# A writer refreshes its answer's heartbeat on every flush, and on a timer
# when nothing new came, at least STALE_FLUSHES times within its bound: one
# late refresh (a busy loop, a slow disk) is never taken for a death. The
# bound is at least STALE_AFTER_MIN_S, so a short --flush-interval does not
# make a pause of the whole process (a collection, a swap) look like one.
STALE_AFTER_MIN_S = 10.0
STALE_FLUSHES = 5


def stale_after(flush_interval: float) -> float:
    """How long a writer flushing every ``flush_interval`` seconds may stay silent before it is taken for dead."""
    return max(STALE_AFTER_MIN_S, STALE_FLUSHES * flush_interval)


@dataclass(frozen=True)
class Owner:
    """The process writing an answer: the machine it runs on, its pid there, an id it drew when it started.

    ``host`` is the host name and, where the system shows it, the pid
    namespace: containers may share a host name, but a pid means something
    only within its own namespace. ``boot`` is drawn once per process, so a
    later process given the same pid (a container's server is often pid 1,
    at every start) is not taken for the one that wrote the row.
    """

    host: str
    pid: int
    boot: str

    @classmethod
    def this_process(cls) -> Owner:
        """This process (a forked child is another one, with its own ``boot``)."""
        global _this_process
        if _this_process is None or _this_process.pid != os.getpid():
            _this_process = cls(_this_host(), os.getpid(), uuid.uuid4().hex)
        return _this_process


_this_process: Owner | None = None


def _this_host() -> str:
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # e.g. "pid:[4026531836]"
    except OSError:  # not Linux, or no /proc
        return socket.gethostname()
    return f"{socket.gethostname()} {namespace}"


def process_exists(pid: int) -> bool:
    """Whether a process with this pid runs here; True when the system cannot say.

    Signal 0 checks without sending anything. A zombie (dead, not yet
    reaped) still counts, and so does an unrelated process that was given
    the pid later: for those, only the heartbeat tells.
    """
    if pid <= 0:
        return False  # 0 and negative pids name process groups, not a process
    if os.name == "nt":
        return True  # os.kill there terminates the process: leave it to the heartbeat
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


@dataclass(frozen=True)
class Lease:
    """A streaming answer's claim to be alive: who writes it, when it last said so, and for how long that holds.

    A row written before schema version 2 (or by an older streamlab on the
    same file) has no owner: its ``updated`` stands for the heartbeat, and
    ``STALE_AFTER_MIN_S`` for the bound.
    """

    message_id: str
    owner: Owner | None
    heartbeat: float
    stale_after: float

    def gone(self, me: Owner, now: float, exists: Callable[[int], bool] = process_exists) -> bool:
        """Whether nobody is left to finish this answer, as process ``me`` sees it at ``now``.

        Our own answers are never gone: we are alive, and ``Store.close``
        finishes them. Anyone else's is gone when its heartbeat is older than
        its bound, wherever it runs; or, on this machine, as soon as its pid
        is ours (then it was an earlier process's) or no process has it.
        """
        if self.owner == me:
            return False
        if now - self.heartbeat > self.stale_after:
            return True
        if self.owner is None or self.owner.host != me.host:
            return False  # another machine, or an older streamlab: only the heartbeat can tell
        if self.owner.pid == me.pid:
            return True
        return not exists(self.owner.pid)


# A lease as read back; a row from before the owner columns counts its last write as its heartbeat.
_LEASE_QUERY = (
    "SELECT id, owner_host, owner_pid, owner_boot, COALESCE(heartbeat, updated),"
    f" COALESCE(stale_after, {STALE_AFTER_MIN_S}) FROM messages"
)


def _lease(row: tuple) -> Lease:
    message_id, host, pid, boot, heartbeat, bound = row
    return Lease(message_id, None if host is None else Owner(host, pid, boot), heartbeat, bound)
