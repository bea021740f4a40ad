"""What an answer needs of a conversations store, whichever keeps it: one SQLite file, or Redis for every replica.

A turn is committed through one mechanism, written once (``answers.commit_turn``,
``Answer.start``, the ``AnswerWriter``): the user's message before anything is
generated, the answer's row at once, its text as it is sent, its ending with
its stop reason and the incomplete flag. Only *where* the rows go differs:

- ``database.Store``: this process's SQLite file (every route of one server);
- ``shared.SharedStore``: Redis, where every replica started with ``serve
  --events redis://...`` and every worker reads them, so a conversation's next
  turn may land on any replica (round-robin, no sticky sessions).

:class:`Conversations` is that interface. The rows read back are the same
(``schema.Message``, ``schema.Conversation``), and so is what the model reads
of an answer cut off: :func:`chat_messages`, the history with each incomplete
answer marked, for both stores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from streamlab.protocol.http_fields import HTTPError
from streamlab.server.config import RETRY_AFTER
from streamlab.server.store.schema import CUT_OFF_MARKER, CUT_OFF_WORDS, STREAMING, Conversation, Message

__all__ = ["Begun", "Conversations", "StoreUnavailable", "chat_messages"]


class StoreUnavailable(HTTPError):
    """The store cannot be reached now (Redis gone): a 503 with ``Retry-After``, never a 500.

    An ``HTTPError``, so every route refuses with it in its own API's shape
    (a WebSocket closes with 1013), before anything of the turn is stored.
    """

    def __init__(self, doing: str, err: BaseException) -> None:
        super().__init__(503, f"the conversation store (Redis) does not answer, so {doing} must wait: {err}")
        self.headers = [("Retry-After", str(RETRY_AFTER))]


@dataclass(frozen=True)
class Begun:
    """An answer already begun by a writer that died (a worker killed mid-answer), to be continued in its row.

    ``text`` and ``tokens`` are what its readers were sent (the pieces in its
    stream, not what its last flush wrote): the row starts again from them.
    """

    message_id: str
    text: str
    tokens: int


class Conversations(Protocol):
    """The conversations store, as the line (``Jobs``) and an answer (``Answer``) use it."""

    def conversation(self, conversation_id: str) -> Conversation | None: ...

    def new_conversation(self, title: str | None = None) -> str: ...

    def add_user_message(self, conversation_id: str, text: str) -> Message: ...

    # An ``answers.AnswerWriter`` (typed Any: that module imports this one, and an import back makes a circle).
    def begin_answer(self, conversation_id: str, begun: Begun | None = None) -> Any: ...

    def history(self, conversation_id: str) -> list[Message]: ...

    def as_chat_messages(self, conversation_id: str, through: str | None = None) -> list[dict[str, str]]: ...

    def conversations(self) -> list[Conversation]: ...

    def close(self) -> None: ...


def chat_messages(history: Sequence[Message], through: str | None = None) -> list[dict[str, str]]:
    """A conversation as ``[{"role", "content"}]`` for the model's next turn (up to message ``through``, if given).

    An incomplete answer is fed back with a note saying it was cut off
    and why. Unmarked, a truncated answer reads as a complete one: the
    model builds on it as if it had said all it meant to, and so does a
    user reading the transcript.
    """
    chat = []
    for message in history:
        content = message.content
        if message.role == "assistant" and (message.incomplete or message.status == STREAMING):
            reason = STREAMING if message.status == STREAMING else message.stop_reason
            note = CUT_OFF_MARKER.format(reason=CUT_OFF_WORDS.get(reason, reason))
            content = content + note if content else note.lstrip("\n")
        chat.append({"role": message.role, "content": content})
        if message.id == through:
            break
    return chat
