"""Tests for streamlab.server.store.database: partial answers survive, and say why they stopped.

Whatever the store promises is checked from *outside* it where that matters:
a second SQLite connection (or a fresh process) sees what is committed, not
what the writer holds in memory.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlab.protocol.endings import (
    CLIENT_LEFT,
    COMPLETED,
    ERROR,
    INTERRUPTED,
    MAX_TOKENS,
    STOP_REASONS,
    STOPPED,
    stop_reason_for,
)
from streamlab.server.store.schema import (
    CUT_OFF_MARKER,
    CUT_OFF_WORDS,
    DONE,
    LEASE_COLUMNS,
    SCHEMA_VERSION,
    STREAMING,
    Conversation,
    Message,
    Owner,
    default_path,
)
from streamlab.server.store.database import Store

REPO = Path(__file__).resolve().parent.parent


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def peek(path: Path, message_id: str) -> tuple[str, str, int]:
    """(content, status, tokens) as a separate connection sees it: what is committed."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT content, status, tokens FROM messages WHERE id = ?", (message_id,)).fetchone()
    finally:
        conn.close()
    assert row is not None, "the row is not committed"
    return row


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "chat.db"


@pytest.fixture
def store(db: Path):
    with Store(db) as s:
        yield s


# --------------------------------------------------------------------------
# The file: place, mode, schema
# --------------------------------------------------------------------------


def test_wal_mode_and_pragmas(store: Store, db: Path):
    assert store.journal_mode == "wal"
    conn = sqlite3.connect(db)
    try:  # WAL is recorded in the file: every other connection sees it too
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
    s = store.settings()
    assert s["synchronous"] == 1  # NORMAL
    assert s["busy_timeout"] > 0
    assert s["foreign_keys"] == 1
    assert s["user_version"] == SCHEMA_VERSION


def test_schema_columns_and_index(store: Store, db: Path):
    conn = sqlite3.connect(db)
    try:
        columns = lambda table: [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]  # noqa: E731
        assert columns("conversations") == ["id", "created", "title"]
        assert columns("messages") == [*Message.__dataclass_fields__, *LEASE_COLUMNS]
        assert columns("messages") == [
            "id", "conversation_id", "seq", "role", "content", "status", "stop_reason",
            "incomplete", "tokens", "created", "updated", "error",
            "owner_host", "owner_pid", "owner_boot", "heartbeat", "stale_after",  # version 2: the lease
        ]
        indexes = [r[1] for r in conn.execute("PRAGMA index_list(messages)")]
        assert {"messages_by_conversation", "messages_streaming"} <= set(indexes)
        indexed = [r[2] for r in conn.execute("PRAGMA index_info(messages_by_conversation)")]
        assert indexed == ["conversation_id", "seq"]
    finally:
        conn.close()


def test_reopening_keeps_data_and_version(db: Path):
    with Store(db) as s:
        cid = s.new_conversation("kept")
        s.add_user_message(cid, "hi")
    with Store(db) as s:
        assert [m.content for m in s.history(cid)] == ["hi"]
        assert s.settings()["user_version"] == SCHEMA_VERSION


def test_a_newer_schema_is_refused(db: Path):
    Store(db).close()
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="schema version"):
        Store(db)


def test_default_path_honours_streamlab_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("STREAMLAB_DATA", str(tmp_path / "data" / "deep"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "data" / "deep" / "streamlab.db"
    with Store() as s:  # parent folders are created
        assert s.path == tmp_path / "data" / "deep" / "streamlab.db"
        assert s.path.exists()


def test_default_path_falls_back_to_xdg_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("STREAMLAB_DATA", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "streamlab" / "streamlab.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local" / "share" / "streamlab" / "streamlab.db"


# --------------------------------------------------------------------------
# Conversations and the user's turn
# --------------------------------------------------------------------------


def test_user_message_is_committed_before_the_answer_begins(store: Store, db: Path):
    cid = store.new_conversation()
    message = store.add_user_message(cid, "Why is the sky blue?")
    # Not one call to begin_answer yet: another connection must already see it.
    assert peek(db, message.id) == ("Why is the sky blue?", DONE, 0)
    assert message.role == "user" and message.seq == 1 and not message.incomplete


def test_conversations_history_and_lookup(db: Path):
    clock = FakeClock()
    with Store(db, clock=clock) as store:
        a = store.new_conversation("first")
        clock.advance(1)
        b = store.new_conversation()
        assert len(a) == 32 and int(a, 16) >= 0  # uuid4 hex
        assert store.conversations() == [Conversation(a, 1000.0, "first"), Conversation(b, 1001.0, None)]
        store.add_user_message(a, "one")
        with store.begin_answer(a) as w:
            w.append("two", 1)
            w.finish(COMPLETED)
        store.add_user_message(b, "elsewhere")
        store.add_user_message(a, "three")
        history = store.history(a)
        assert [(m.seq, m.role, m.content) for m in history] == [
            (1, "user", "one"), (2, "assistant", "two"), (3, "user", "three"),
        ]
        assert store.get_message(history[1].id) == history[1]
        assert store.history("nope") == []
        with pytest.raises(KeyError):
            store.get_message("nope")
        with pytest.raises(KeyError):
            store.add_user_message("nope", "hi")
        with pytest.raises(KeyError):
            store.begin_answer("nope")
        rows = store.rows()
        assert [r["content"] for r in rows] == ["one", "two", "three", "elsewhere"]
        assert set(rows[0]) == set(Message.__dataclass_fields__)
        assert [r["content"] for r in store.rows(b)] == ["elsewhere"]


def test_seq_is_unique_under_concurrent_writers(db: Path):
    """Two connections, four threads, one conversation: every seq taken once."""
    with Store(db) as one, Store(db) as two:
        cid = one.new_conversation()

        def write(s: Store, n: int) -> None:
            for i in range(n):
                s.add_user_message(cid, f"m{i}")

        threads = [threading.Thread(target=write, args=(s, 25)) for s in (one, two, one, two)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [m.seq for m in one.history(cid)] == list(range(1, 101))


# --------------------------------------------------------------------------
# The answer: stop reasons, flushing, finishing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("reason", STOP_REASONS)
def test_every_stop_reason_round_trips(store: Store, db: Path, reason: str):
    cid = store.new_conversation()
    store.add_user_message(cid, "q")
    writer = store.begin_answer(cid)
    assert peek(db, writer.message_id) == ("", STREAMING, 0)  # the row exists at once
    writer.append("The sky ", 2)
    writer.append("is blue", 4)
    error = "boom" if reason == ERROR else None
    final = writer.finish(reason, error=error)
    read_back = Store(db).get_message(writer.message_id)
    assert final == read_back
    assert read_back.status == DONE
    assert read_back.stop_reason == reason
    assert read_back.incomplete is (reason != COMPLETED)
    assert read_back.content == "The sky is blue" and read_back.tokens == 4
    assert read_back.error == error


def test_unknown_stop_reason_is_refused(store: Store):
    writer = store.begin_answer(store.new_conversation())
    with pytest.raises(ValueError):
        writer.finish("eos")  # the generation layer's word, not a stored reason
    assert not writer.finished


def test_progress_is_flushed_once_the_interval_has_passed(db: Path):
    clock = FakeClock()
    with Store(db, flush_interval=5.0, clock=clock) as store:
        writer = store.begin_answer(store.new_conversation())
        clock.advance(1.0)
        writer.append("Hello", 1)
        assert peek(db, writer.message_id)[0] == ""  # held in memory: 1 s < 5 s
        clock.advance(3.9)
        writer.append(", ", 2)
        assert peek(db, writer.message_id)[0] == ""
        clock.advance(0.1)  # 5 s since the row was created
        writer.append("world", 3)
        assert peek(db, writer.message_id) == ("Hello, world", STREAMING, 3)
        clock.advance(1.0)
        writer.append("!", 4)  # the interval starts again from the last write
        assert peek(db, writer.message_id)[0] == "Hello, world"
        assert writer.text == "Hello, world!"
        writer.finish(COMPLETED)
        assert peek(db, writer.message_id) == ("Hello, world!", DONE, 4)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.text(max_size=5), st.floats(0.0, 30.0)), min_size=1, max_size=30))
def test_the_flush_bound_holds_for_any_timing(tmp_path_factory: pytest.TempPathFactory, steps):
    """After every append: nothing older than the interval is missing from the
    file, what is there is a prefix of the text, and writes are at least an
    interval apart. (Fake seconds; the real-time timer would need 50 s to fire.)"""
    interval = 50.0
    db = tmp_path_factory.mktemp("bound") / "chat.db"
    clock = FakeClock()
    with Store(db, flush_interval=interval, clock=clock) as store:
        writer = store.begin_answer(store.new_conversation())
        appended: list[tuple[float, str]] = []
        last_write, last_seen = clock(), ""
        for i, (text, dt) in enumerate(steps):
            clock.advance(dt)
            writer.append(text, i + 1)
            appended.append((clock(), text))
            seen = peek(db, writer.message_id)[0]
            full = "".join(t for _, t in appended)
            assert full.startswith(seen)
            old_enough = "".join(t for when, t in appended if when <= clock() - interval)
            assert seen.startswith(old_enough)
            if seen != last_seen:
                assert clock() - last_write >= interval
                last_write, last_seen = clock(), seen
        writer.finish(COMPLETED)


def test_a_quiet_model_is_flushed_by_the_timer(store: Store, db: Path):
    """One piece, then silence (a long pause): it must not wait for the next piece."""
    store.flush_interval = 0.2
    writer = store.begin_answer(store.new_conversation())
    writer.append("only piece", 1)
    appended = time.monotonic()
    while peek(db, writer.message_id)[0] != "only piece":
        assert time.monotonic() - appended < 2.0, "the timer never flushed"
        time.sleep(0.02)
    assert time.monotonic() - appended < 1.0
    writer.finish(STOPPED)


def test_tokens_are_a_running_total(store: Store):
    writer = store.begin_answer(store.new_conversation())
    writer.append("ab", 2)
    writer.append("", 3)  # a token that made no text yet
    with pytest.raises(ValueError):
        writer.append("c", 1)
    assert writer.finish(MAX_TOKENS).tokens == 3


def test_a_second_finish_is_ignored_and_append_after_finish_raises(store: Store):
    writer = store.begin_answer(store.new_conversation())
    writer.append("partial", 1)
    first = writer.finish(CLIENT_LEFT)
    assert writer.finish(COMPLETED) == first  # the first ending wins
    assert store.get_message(writer.message_id).stop_reason == CLIENT_LEFT
    with pytest.raises(RuntimeError):
        writer.append("more", 2)


def test_leaving_the_with_by_an_exception_finishes_with_error(store: Store):
    cid = store.new_conversation()
    with pytest.raises(ZeroDivisionError):
        with store.begin_answer(cid) as writer:
            writer.append("half an ans", 3)
            1 / 0
    m = store.get_message(writer.message_id)
    assert (m.status, m.stop_reason, m.incomplete, m.content) == (DONE, ERROR, True, "half an ans")
    assert "ZeroDivisionError" in m.error


def test_leaving_the_with_by_cancellation_finishes_interrupted(store: Store):
    class Cancelled(BaseException):  # like asyncio.CancelledError: not an Exception
        pass

    with pytest.raises(Cancelled):
        with store.begin_answer(store.new_conversation()) as writer:
            writer.append("x", 1)
            raise Cancelled()
    assert store.get_message(writer.message_id).stop_reason == INTERRUPTED


def test_leaving_the_with_without_finish_is_an_error(store: Store):
    with pytest.raises(RuntimeError, match="without finish"):
        with store.begin_answer(store.new_conversation()) as writer:
            writer.append("x", 1)
    assert store.get_message(writer.message_id).stop_reason == ERROR


def test_close_finishes_open_answers_as_interrupted(db: Path):
    store = Store(db, flush_interval=60)
    writer = store.begin_answer(store.new_conversation())
    writer.append("unflushed", 1)
    store.close()
    store.close()  # twice is fine
    assert peek(db, writer.message_id) == ("unflushed", DONE, 1)
    assert Store(db).get_message(writer.message_id).stop_reason == INTERRUPTED


# --------------------------------------------------------------------------
# Recovery after a crash
# --------------------------------------------------------------------------


def dead_pid() -> int:
    """The pid of a process of this machine that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_recover_interrupted_closes_only_streaming_answers(db: Path):
    # Never closed: stands for a server of this machine that died (a store of this process is alive).
    crashed = Store(db, flush_interval=0, owner=Owner(Owner.this_process().host, dead_pid(), "crashed"))
    cid = crashed.new_conversation()
    crashed.add_user_message(cid, "q")
    done = crashed.begin_answer(cid)
    done.append("whole", 1)
    done.finish(COMPLETED)
    left = [crashed.begin_answer(cid) for _ in range(2)]
    left[0].append("written", 1)

    with Store(db) as fresh:
        assert fresh.answers_by_reason()[STREAMING] == 2
        assert fresh.recover_interrupted() == 2
        assert fresh.recover_interrupted() == 0
        for writer, text in zip(left, ["written", ""]):
            m = fresh.get_message(writer.message_id)
            assert (m.status, m.stop_reason, m.incomplete, m.content) == (DONE, INTERRUPTED, True, text)
        assert fresh.get_message(done.message_id).stop_reason == COMPLETED
        assert [m.role for m in fresh.history(cid)] == ["user", "assistant", "assistant", "assistant"]
        counts = fresh.answers_by_reason()
        assert counts == {r: 0 for r in STOP_REASONS} | {COMPLETED: 1, INTERRUPTED: 2}
        assert list(counts) == list(STOP_REASONS)


CRASHING_SERVER = """
import sys, time
from streamlab.server.store.database import Store

store = Store(sys.argv[1], flush_interval=0.2)
cid = store.new_conversation("crash")
store.add_user_message(cid, "tell me a long story")
writer = store.begin_answer(cid)
print("ready", writer.message_id, flush=True)
for i in range(100_000):
    writer.append(f"<{i}>", i + 1)
    print(i, repr(time.time()), flush=True)  # printed once append has returned
    time.sleep(0.01)
"""


def test_a_killed_server_loses_at_most_the_last_second(db: Path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_SERVER, str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )
    try:
        first = proc.stdout.readline().split()
        assert first[:1] == ["ready"], proc.stderr.read()
        message_id = first[1]
        appended: list[tuple[int, float]] = []
        while not appended or appended[-1][1] - appended[0][1] < 1.5:
            i, when = proc.stdout.readline().split()
            appended.append((int(i), float(when)))
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        for line in proc.stdout:  # appended before the kill, read after it
            i, when = line.split()
            appended.append((int(i), float(when)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()

    assert peek(db, message_id)[1] == STREAMING  # the crash left it so
    with Store(db) as fresh:
        assert fresh.recover_interrupted() == 1
        m = fresh.get_message(message_id)
        assert fresh.history(m.conversation_id)[0].content == "tell me a long story"
    assert (m.status, m.stop_reason, m.incomplete) == (DONE, INTERRUPTED, True)
    saved = [int(n) for n in re.findall(r"<(\d+)>", m.content)]
    assert m.content == "".join(f"<{i}>" for i in saved)
    assert saved == list(range(len(saved))), "the saved text is a prefix, piece by piece"
    assert m.tokens == len(saved)
    # One piece may have been appended and flushed before its line was printed.
    assert 0 < len(saved) <= len(appended) + 1
    old_enough = [i for i, when in appended if when <= killed_at - 1.0]
    assert old_enough, "the test must run long enough to have old pieces"
    assert max(old_enough) < len(saved), "a piece appended over a second before the kill was lost"


# --------------------------------------------------------------------------
# Many answers on an event loop: one transaction per tick
# --------------------------------------------------------------------------


def committed(db: Path) -> list[tuple[str, float]]:
    """(content, updated) of every answer, as another connection sees them in one read."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT content, updated FROM messages WHERE role = 'assistant' ORDER BY seq").fetchall()
    finally:
        conn.close()


def test_answers_streaming_on_a_loop_cost_one_commit_per_tick_and_keep_the_bound(db: Path):
    """40 answers, a piece each every 20 ms for a second, 0.2 s ticks: ~5 commits, not one per answer per tick.

    After every step, another connection sees one tick whole (every row
    written at the same moment) and every piece older than the interval: the
    store's clock tells when that is, whatever the loop's timer did.
    """
    n, interval, steps = 40, 0.2, 50
    commits: list[str] = []
    reads: list[float] = []

    def clock() -> float:
        reads.append(time.time())
        return reads[-1]

    async def main() -> Store:
        with Store(db, flush_interval=interval, clock=clock) as store:
            conversation = store.new_conversation()
            writers = [store.begin_answer(conversation) for _ in range(n)]
            assert all(w._rounds is store._rounds for w in writers)  # made on a running loop: one set of ticks
            store._conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
            ended: list[float] = []  # when each step's pieces had all been appended
            for step in range(steps):
                for writer in writers:
                    writer.append(f"<{step}>", step + 1)
                ended.append(time.time())
                rows = committed(db)
                if rows[0][0]:
                    assert len({updated for _, updated in rows}) == 1, "a reader saw part of a tick"
                    # A tick the loop ran late is run from inside an append (to keep the bound), part-way through a
                    # step: then the answers appended this step are written with it and the rest a piece short.
                    contents = sorted({content for content, _ in rows}, key=len)
                    assert len(contents) == 1 or (len(contents) == 2 and contents[1].startswith(contents[0])
                                                  and contents[1][len(contents[0]):].count("<") == 1), contents
                old = "".join(f"<{i}>" for i, when in enumerate(ended) if when <= reads[-1] - interval)
                assert all(content.startswith(old) for content, _ in rows), "a piece older than the interval"
                await asyncio.sleep(0.02)
            store._conn.set_trace_callback(None)
            ticks = store._rounds.transactions
            for writer in writers:
                writer.finish(COMPLETED)
            assert store._rounds.members == set() and store._rounds._timer is None  # nothing left to tick for
        assert len(commits) == ticks
        return store

    asyncio.run(main())
    # A second of streaming at 0.2 s: about 5 ticks (more if the loop ran late and appends ran them);
    # a commit per answer per tick would have been 200.
    assert 3 <= len(commits) <= 12, commits
    assert {content for content, _ in committed(db)} == {"".join(f"<{i}>" for i in range(steps))}


CRASHING_LOOP = """
import asyncio, sys, time
from streamlab.server.store.database import Store

async def main():
    store = Store(sys.argv[1], flush_interval=0.2)
    cid = store.new_conversation("crash")
    writers = [store.begin_answer(cid) for _ in range(20)]
    print("ready", flush=True)
    for i in range(100_000):
        for writer in writers:
            writer.append(f"<{i}>", i + 1)
        print(i, repr(time.time()), flush=True)  # printed once every answer has it
        await asyncio.sleep(0.01)

asyncio.run(main())
"""


def test_a_killed_loop_loses_at_most_the_interval_of_any_answer(db: Path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_LOOP, str(db)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        assert proc.stdout.readline().split() == ["ready"], proc.stderr.read()
        appended: list[tuple[int, float]] = []
        while not appended or appended[-1][1] - appended[0][1] < 1.5:
            i, when = proc.stdout.readline().split()
            appended.append((int(i), float(when)))
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        appended += [(int(i), float(when)) for i, when in (line.split() for line in proc.stdout)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()

    rows = committed(db)
    assert len(rows) == 20 and len(set(rows)) == 1, "the last tick wrote every answer, in one transaction"
    saved = [int(n) for n in re.findall(r"<(\d+)>", rows[0][0])]
    assert saved == list(range(len(saved))), "the saved text is a prefix, piece by piece"
    # Every append runs the tick that is due, so what the last append left behind is younger than the interval
    # (0.2 s); 0.3 s more for the scheduler between that append and its line.
    old_enough = [i for i, when in appended if when <= appended[-1][1] - 0.2 - 0.3]
    assert old_enough, "the test must run long enough to have old pieces"
    assert max(old_enough) < len(saved) <= len(appended) + 1


# --------------------------------------------------------------------------
# Feeding history back to the model
# --------------------------------------------------------------------------


def test_as_chat_messages_marks_incomplete_answers_only(store: Store):
    cid = store.new_conversation()
    store.add_user_message(cid, "Count to three.")
    with store.begin_answer(cid) as w:
        w.append("One, two, three.", 6)
        w.finish(COMPLETED)
    store.add_user_message(cid, "Now to a hundred.")
    with store.begin_answer(cid) as w:
        w.append("One, two, three, four", 8)
        w.finish(MAX_TOKENS)
    store.add_user_message(cid, "Go on.")
    with store.begin_answer(cid) as w:
        w.finish(STOPPED)  # stopped before the first piece
    still = store.begin_answer(cid)  # being written right now
    still.append("five", 9)
    still.flush()

    chat = store.as_chat_messages(cid)
    assert [c["role"] for c in chat] == ["user", "assistant"] * 3 + ["assistant"]
    assert chat[0] == {"role": "user", "content": "Count to three."}
    assert chat[1] == {"role": "assistant", "content": "One, two, three."}  # untouched
    assert chat[3]["content"] == "One, two, three, four" + CUT_OFF_MARKER.format(
        reason=CUT_OFF_WORDS[MAX_TOKENS]
    )
    assert chat[3]["content"].endswith("\n\n[This answer was cut off: it reached the length limit.]")
    assert chat[5]["content"] == "[This answer was cut off: the user asked to stop.]"
    assert chat[6]["content"].startswith("five\n\n[This answer was cut off: ")
    still.finish(COMPLETED)
    assert store.as_chat_messages(cid)[6] == {"role": "assistant", "content": "five"}


def test_every_incomplete_reason_has_words():
    assert set(STOP_REASONS) - {COMPLETED} <= set(CUT_OFF_WORDS)


# --------------------------------------------------------------------------
# Readers while writing
# --------------------------------------------------------------------------


def test_readers_on_other_connections_while_writing(db: Path):
    """WAL: readers never wait for the writer, never see a torn write, never fail."""
    pieces = [f"piece {i}; " for i in range(300)]
    full = "".join(pieces)
    with Store(db, flush_interval=0) as store:
        writer = store.begin_answer(store.new_conversation())
        seen: list[str] = []
        errors: list[BaseException] = []
        done = threading.Event()

        def read() -> None:
            conn = sqlite3.connect(db, timeout=0)  # would fail at once if it had to wait
            other = Store(db)  # and a second Store, as a notebook would open
            try:
                while not done.is_set():
                    (content,) = conn.execute(
                        "SELECT content FROM messages WHERE id = ?", (writer.message_id,)
                    ).fetchone()
                    seen.append(content)
                    seen.append(other.get_message(writer.message_id).content)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
            finally:
                conn.close()
                other.close()

        reader = threading.Thread(target=read)
        reader.start()
        for i, piece in enumerate(pieces):
            writer.append(piece, i + 1)
        writer.finish(COMPLETED)
        time.sleep(0.05)
        done.set()
        reader.join()
    assert not errors, errors
    assert len(seen) > 10
    assert all(full.startswith(s) for s in seen)
    assert seen[-1] == full


# --------------------------------------------------------------------------
# The mapping from the generation layer
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("generation", "signal_", "expected"),
    [
        ("eos", None, COMPLETED),
        ("eos", "eof", COMPLETED),  # the model had finished: the text is whole
        ("max_tokens", None, MAX_TOKENS),
        ("max_tokens", "write_failed", MAX_TOKENS),
        ("error", None, ERROR),
        ("error", "eof", ERROR),
        ("stopped", "eof", CLIENT_LEFT),
        ("stopped", "close_frame", CLIENT_LEFT),
        ("stopped", "write_failed", CLIENT_LEFT),
        ("stopped", "write_timeout", CLIENT_LEFT),
        ("stopped", "grace_expired", CLIENT_LEFT),
        ("stopped", "protocol_error", CLIENT_LEFT),
        ("stopped", "stop_message", STOPPED),
        ("stopped", "cancel", STOPPED),
        ("stopped", None, STOPPED),
        ("stopped", "server_shutdown", INTERRUPTED),
        ("server_shutdown", None, INTERRUPTED),
    ],
)
def test_stop_reason_for(generation: str, signal_: str | None, expected: str):
    assert stop_reason_for(generation, signal_) == expected


def test_stop_reason_for_refuses_unknown_names():
    with pytest.raises(ValueError):
        stop_reason_for("finished", None)
    with pytest.raises(ValueError):
        stop_reason_for("stopped", "telepathy")
