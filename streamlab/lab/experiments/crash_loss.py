"""What a crash loses: an answer's writes to its database, watched up to a ``kill -9``.

Chapter 7 kills a server with SIGKILL in the middle of an answer. The store's
promise is that a streaming answer is written every flush interval, so a crash
loses only what was made since the last write. That is measured, not assumed:
``watch`` samples, until the chapter kills the server, the text the generation
has made (the server's ``GET /generations/{id}``) and the text its row in the
SQLite file holds, with the time of the row's last write (its ``updated``
column, set by every write of the text and by nothing else). ``loss`` reads the
cost from those samples, the moment of the kill and the row the restarted
server recovered.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from streamlab.client import timed as client

__all__ = ["Sample", "loss", "stored_progress", "watch"]


@dataclass(frozen=True)
class Sample:
    """One look at the answer: ``t`` and ``written`` are ``time.time()`` (the server's clock is the same one)."""

    t: float
    made_tokens: int
    made_chars: int
    stored_tokens: int
    stored_chars: int
    written: float | None  # when the row's text was last written; None before its first write


def stored_progress(db: str | Path, message_id: str | None = None) -> tuple[int, int, float | None] | None:
    """``(tokens, characters, last write)`` of the answer being written now (that message, when named), or None.

    A connection of its own, opened and closed for each look: the file is in
    WAL mode, so this read never blocks the server's writes and never sees half
    of one. The last write is None while the row holds what it was created with.
    """
    where, params = ("id = ?", (message_id,)) if message_id else ("role = 'assistant'", ())
    with closing(sqlite3.connect(Path(db), timeout=5)) as conn:
        row = conn.execute(f"SELECT tokens, length(content), updated, created FROM messages WHERE {where}"
                           " AND status = 'streaming' ORDER BY seq DESC LIMIT 1", params).fetchone()
    if row is None:
        return None
    tokens, chars, updated, created = row
    return int(tokens), int(chars or 0), float(updated) if updated and updated > created else None


def watch(port: int, generation_id: str, db: str | Path, *, until_tokens: int, then: float,
          every: float = 0.01, timeout: float = 120.0) -> list[Sample]:
    """Sample the answer until it has made ``until_tokens`` tokens, and ``then`` seconds more.

    The chapter kills the server right after this returns, so the last
    sample is the last look before the kill.
    """
    samples: list[Sample] = []
    deadline, stop_at = time.time() + timeout, None
    while True:
        made = client.get_json_sync(port, f"/generations/{generation_id}")
        stored = stored_progress(db, made.get("message_id")) or (0, 0, None)
        now = time.time()
        samples.append(Sample(now, int(made["tokens"]), len(made.get("text") or ""), *stored))
        if stop_at is None and made["tokens"] >= until_tokens:
            stop_at = now + then
        if (stop_at is not None and now >= stop_at) or now > deadline:
            return samples
        time.sleep(every)


def loss(samples: Sequence[Sample], killed_at: float, recovered: dict[str, Any]) -> dict[str, Any]:
    """What the kill cost, from the samples, the moment of the kill and the recovered row (``Store.rows()``'s).

    ``made`` is what the last look before the kill saw, or what was kept if
    that is more (the model may have made a token more in the milliseconds
    after the look, so the loss is at least this). The last write's time is the row's own when the recovered text is
    the one last seen; when a write came after the last look, it fell between
    that look and the kill, and the time since it is at most that span.
    """
    last = samples[-1]
    kept_tokens, kept_chars = int(recovered["tokens"]), len(recovered["content"] or "")
    writes = sorted({s.written for s in samples if s.written is not None})
    seen_last = kept_tokens == last.stored_tokens and last.written is not None
    since = killed_at - last.written if seen_last and last.written is not None else killed_at - last.t
    # A look reads the generation, then the row: the row can be a token or two ahead of what the look saw made,
    # and the kill had made at least what was kept (an AVX2 clean-clone run saw 19 made, 23 kept).
    made_tokens, made_chars = max(last.made_tokens, kept_tokens), max(last.made_chars, kept_chars)
    return {
        "tokens made by the kill": made_tokens,
        "characters made by the kill": made_chars,
        "tokens kept": kept_tokens,
        "characters kept": kept_chars,
        "tokens lost": made_tokens - kept_tokens,
        "characters lost": made_chars - kept_chars,
        "last write before the kill (s)": since,
        "last write seen": seen_last,
        "writes seen": len(writes),
        "longest between writes (s)": max((b - a for a, b in zip(writes, writes[1:])), default=None),
        "watched for (s)": killed_at - samples[0].t,
    }
