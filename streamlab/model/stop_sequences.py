"""Stop sequences: end the answer where a client-named string appears, and never send that string.

OpenAI's ``stop`` and Anthropic's ``stop_sequences`` name strings at which the
answer must end, without them. Text arrives a piece at a time, so a stop
sequence can start in one piece and finish in the next (``"\\n\\nUs"`` then
``"er:"``). The text that *might* be the start of one is held back until the
next piece says which it was: sent after all, or cut. So a reader never sees
half a stop sequence that then turns out to be the end.
"""

from __future__ import annotations

from typing import Iterable


class StopSequences:
    """``feed(text)`` returns what is safe to send; ``matched`` names the sequence found, if one was."""

    def __init__(self, sequences: Iterable[str] = ()) -> None:
        self.sequences = tuple(s for s in sequences if s)
        self.held = ""
        self.matched: str | None = None

    def __bool__(self) -> bool:
        return bool(self.sequences)

    def feed(self, text: str) -> str:
        """The text that can go out now; after a match, what came before it (and nothing ever again)."""
        if self.matched is not None:
            return ""
        if not self.sequences:
            return text
        buffer = self.held + text
        found = [(buffer.find(s), s) for s in self.sequences]
        found = [(at, s) for at, s in found if at >= 0]
        if found:
            at, self.matched = min(found)  # the earliest match ends the answer
            self.held = ""
            return buffer[:at]
        keep = max((self._overlap(buffer, s) for s in self.sequences), default=0)
        self.held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """At the end of the answer: what was held back was not a stop sequence after all."""
        held, self.held = self.held, ""
        return "" if self.matched is not None else held

    @staticmethod
    def _overlap(text: str, sequence: str) -> int:
        """The length of the longest end of ``text`` that begins ``sequence`` (shorter than all of it)."""
        for size in range(min(len(sequence) - 1, len(text)), 0, -1):
            if text.endswith(sequence[:size]):
                return size
        return 0
