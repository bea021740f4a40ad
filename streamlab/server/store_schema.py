"""What the conversations file holds: its tables, their migrations, the rows read back, the words stored.

``streamlab.server.store`` reads and writes the file; this module says what
is in it, so the shape of the data can be read, and changed, in one place:

* ``MIGRATIONS``: each schema version is the statements that bring a file
  from the version before; ``SCHEMA_VERSION`` is how far this streamlab goes.
* ``Conversation`` and ``Message``: a row as read back, frozen because it is
  a snapshot, not a live view.
* ``STREAMING`` and ``DONE``, a message's status, and the note that marks an
  incomplete answer when history is fed back to the model (``CUT_OFF_MARKER``,
  ``CUT_OFF_WORDS``).
* ``default_path``: where the file lives when no path is given.

``streamlab.server.store`` re-exports every public name here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from streamlab.protocol.endings import CLIENT_LEFT, ERROR, INTERRUPTED, MAX_TOKENS, SLOW_READER, STOPPED

__all__ = [
    "CUT_OFF_MARKER",
    "CUT_OFF_WORDS",
    "DONE",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "STREAMING",
    "Conversation",
    "Message",
    "default_path",
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
]
SCHEMA_VERSION = len(MIGRATIONS)

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

