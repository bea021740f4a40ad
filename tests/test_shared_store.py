"""One conversations file, several server processes: recovery closes the answers of the dead, never the living.

A row still ``streaming`` used to mean "left by a crash"; with two servers on
one ``--db`` it may be the other server's live answer. Each answer now holds a
lease (owner and heartbeat, ``store_schema.Lease``). The first half tests the
rule with two ``Store`` objects standing for two processes, on a fake clock
and with timers that fire only when the test says; the second half runs real
servers (``--scripted-rate``: no model) on one file and kills one.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamlab.client import timed as client
from streamlab.lab.setups import runner
from streamlab.server.store import database as store_module
from streamlab.protocol.endings import COMPLETED, INTERRUPTED, MAX_TOKENS
from streamlab.server.store.schema import (
    DONE,
    MIGRATIONS,
    SCHEMA_VERSION,
    STALE_AFTER_MIN_S,
    STALE_FLUSHES,
    STREAMING,
    Lease,
    Owner,
)
from streamlab.server.store.answers import AnswerWriter
from streamlab.server.store.database import Store
from streamlab.server.store.schema import process_exists, stale_after

REPO = Path(__file__).resolve().parent.parent
ME = Owner.this_process()
ELSEWHERE = Owner("another-machine", 4242, "elsewhere-boot")  # pids there say nothing here


class FakeClock:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ManualTimer:
    """Stands for a writer's timer: it fires when the test calls ``tick``, never by itself."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture(autouse=True)
def manual_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real timer in the unit tests: a heartbeat happens when the test ticks, at the fake clock's time."""
    monkeypatch.setattr(AnswerWriter, "_start_timer", lambda self, delay: ManualTimer(delay))


def tick(writer: AnswerWriter) -> None:
    """The writer's timer fires now (a flush if text waits, else a heartbeat if one is due)."""
    writer._on_timer()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "shared.db"


def lease(db: Path, message_id: str) -> Lease:
    """The answer's lease, as a separate connection sees it."""
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(
            "SELECT owner_host, owner_pid, owner_boot, heartbeat, stale_after FROM messages WHERE id = ?",
            (message_id,),
        ).fetchone()
    finally:
        conn.close()
    host, pid, boot, heartbeat, bound = row
    return Lease(message_id, Owner(host, pid, boot) if host is not None else None, heartbeat, bound)


def row(db: Path, message_id: str) -> tuple[str, str | None, str, float]:
    """(status, stop_reason, content, updated), committed."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT status, stop_reason, content, updated FROM messages WHERE id = ?", (message_id,)
        ).fetchone()
    finally:
        conn.close()


def dead_pid() -> int:
    """The pid of a process of this machine that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def answer_of(store: Store, text: str = "") -> AnswerWriter:
    writer = store.begin_answer(store.new_conversation())
    if text:
        writer.append(text, 1)
        writer.flush()
    return writer


# --------------------------------------------------------------------------
# The bound, the identity, the old file
# --------------------------------------------------------------------------


def test_the_bound_is_a_few_flushes_and_never_under_ten_seconds(db: Path):
    assert (STALE_AFTER_MIN_S, STALE_FLUSHES) == (10.0, 5)
    assert stale_after(0.0) == stale_after(0.2) == stale_after(1.0) == 10.0
    assert stale_after(4.0) == 20.0
    with Store(db, flush_interval=4.0) as store:  # a heartbeat STALE_FLUSHES times within the bound
        assert (store.stale_after, store.beat_every) == (20.0, 4.0)
        store.flush_interval = 0.0  # flushing at every piece: still a heartbeat every 2 s, not a busy timer
        assert (store.stale_after, store.beat_every) == (10.0, 2.0)


def test_each_process_has_its_own_identity_and_this_one_keeps_its_own():
    assert Owner.this_process() is ME and ME.pid == os.getpid() and len(ME.boot) == 32
    code = "from streamlab.server.store.database import Owner; o = Owner.this_process(); print(o.host); print(o.pid, o.boot)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO))).stdout.splitlines()
    host, (pid, boot) = out[0], out[1].split()
    assert host == ME.host  # one machine, one pid namespace: pids compare
    assert int(pid) != ME.pid and boot != ME.boot


def test_process_exists():
    assert process_exists(os.getpid())
    assert not process_exists(dead_pid())
    assert not process_exists(0) and not process_exists(-1)  # process groups, not processes


def test_an_old_file_gains_the_lease_columns_and_its_rows_are_judged_by_their_last_write(db: Path):
    conn = sqlite3.connect(db)
    for statement in MIGRATIONS[0]:  # a file made by the streamlab of schema version 1
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO conversations VALUES ('c', 0, 'old')")
    insert = ("INSERT INTO messages (id, conversation_id, seq, role, content, status, created, updated)"
              " VALUES (?, 'c', ?, 'assistant', ?, 'streaming', ?, ?)")
    conn.execute(insert, ("long-ago", 1, "crashed", 900.0, 900.0))  # 100 s before the clock below
    conn.execute(insert, ("just-now", 2, "maybe live", 995.0, 999.0))  # an older streamlab may still write it
    conn.commit()
    conn.close()

    clock = FakeClock(1_000.0)
    with Store(db, clock=clock) as store:
        assert store.settings()["user_version"] == SCHEMA_VERSION == 2
        assert lease(db, "long-ago").owner is None
        assert store.recover_interrupted() == 1
        assert row(db, "long-ago")[:3] == (DONE, INTERRUPTED, "crashed")
        assert row(db, "just-now")[0] == STREAMING
        clock.advance(STALE_AFTER_MIN_S)  # 11 s since its last write
        assert store.recover_interrupted() == 1
        assert row(db, "just-now")[:3] == (DONE, INTERRUPTED, "maybe live")


# --------------------------------------------------------------------------
# Two stores on one file, standing for two processes
# --------------------------------------------------------------------------


def test_a_new_answer_carries_its_owner_and_heartbeat(db: Path):
    clock = FakeClock()
    with Store(db, clock=clock, flush_interval=0.2) as store:
        writer = answer_of(store)
        assert lease(db, writer.message_id) == Lease(writer.message_id, ME, clock(), 10.0)
        user = store.add_user_message(writer.conversation_id, "hi")
        assert lease(db, user.id).owner is None  # only an answer being written has an owner
        writer.finish(COMPLETED)


def test_another_process_live_answer_is_left_alone_while_its_heartbeat_comes(db: Path):
    clock = FakeClock()
    with Store(db, clock=clock, owner=ELSEWHERE) as a, Store(db, clock=clock) as b:
        writer = answer_of(a, "half an")
        assert b.recover_interrupted() == 0  # B starts while A streams
        for _ in range(10):  # 40 s with nothing new: a long pause of the model, heartbeats only
            clock.advance(4.0)
            tick(writer)
            assert b.recover_interrupted() == 0
        assert row(db, writer.message_id)[0] == STREAMING
        assert row(db, writer.message_id)[3] == 1_000.0  # updated: the text's time, not the heartbeat's
        assert lease(db, writer.message_id).heartbeat == clock()
        writer.append(" answer", 2)
        assert writer.finish(COMPLETED).content == "half an answer"


def test_a_silent_owner_elsewhere_is_gone_after_its_bound_with_its_text(db: Path):
    clock = FakeClock()
    with Store(db, clock=clock, owner=ELSEWHERE) as a, Store(db, clock=clock) as b:
        writer = answer_of(a, "partial")
        clock.advance(a.stale_after)  # exactly the bound: not yet
        assert b.recover_interrupted() == 0
        clock.advance(0.5)
        assert b.recover_interrupted() == 1
        assert row(db, writer.message_id)[:3] == (DONE, INTERRUPTED, "partial")
        # Had A been alive after all (a stall of 10 s), its own ending corrects the row.
        assert writer.finish(COMPLETED).stop_reason == COMPLETED


def test_an_owner_keeps_its_own_bound_whatever_the_reader_flushes(db: Path):
    clock = FakeClock()
    with Store(db, clock=clock, owner=ELSEWHERE, flush_interval=10.0) as a, Store(db, clock=clock) as b:
        writer = answer_of(a, "slow")
        assert lease(db, writer.message_id).stale_after == 50.0  # A heartbeats every 10 s
        clock.advance(20.0)  # past B's own bound (10 s), not past A's
        assert b.recover_interrupted() == 0
        clock.advance(31.0)
        assert b.recover_interrupted() == 1


def test_a_dead_process_of_this_machine_is_gone_at_once(db: Path):
    clock = FakeClock()
    dead = Owner(ME.host, dead_pid(), "dead-boot")
    with Store(db, clock=clock, owner=dead) as a, Store(db, clock=clock) as b:
        writer = answer_of(a, "cut")
        assert b.recover_interrupted() == 1  # heartbeat fresh, but no such process
        assert row(db, writer.message_id)[:3] == (DONE, INTERRUPTED, "cut")


def test_our_pid_with_another_boot_id_was_an_earlier_process(db: Path):
    """A container's server is pid 1 at every start: the pid alone would say the crashed one still runs."""
    clock = FakeClock()
    earlier = Owner(ME.host, ME.pid, "earlier-boot")
    with Store(db, clock=clock, owner=earlier) as a, Store(db, clock=clock) as b:
        answer_of(a, "before the restart")
        assert b.recover_interrupted() == 1


def test_a_live_process_of_this_machine_is_left_alone_until_its_heartbeat_is_stale(db: Path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        clock = FakeClock()
        alive = Owner(ME.host, sleeper.pid, "sleeper-boot")
        with Store(db, clock=clock, owner=alive) as a, Store(db, clock=clock) as b:
            answer_of(a, "live")
            assert b.recover_interrupted() == 0
            # A pid can be given to another process after its owner died: then only the heartbeat tells.
            clock.advance(10.5)
            assert b.recover_interrupted() == 1
    finally:
        sleeper.kill()
        sleeper.wait()


def test_our_own_answers_are_never_recovered_by_us(db: Path):
    clock = FakeClock()
    with Store(db, clock=clock) as b, Store(db, clock=clock, owner=ELSEWHERE) as other:
        mine = answer_of(b, "mine")
        clock.advance(1_000.0)  # our heartbeat stalled (a blocked loop): we still know we are alive
        assert b.recover_interrupted() == 0
        assert other.recover_interrupted() == 1  # ... but to another process, that silence means dead
        assert row(db, mine.message_id)[:2] == (DONE, INTERRUPTED)


def test_the_heartbeat_ticks_flush_first_and_beat_only_when_due(db: Path):
    clock = FakeClock()
    with Store(db, clock=clock, flush_interval=1.0) as store:
        writer = answer_of(store)
        assert writer._timer.delay == store.beat_every == 2.0  # armed from the first moment
        writer.append("a", 1)
        assert writer._timer.delay == 1.0  # text waits: the flush is due first
        clock.advance(1.0)
        tick(writer)
        assert row(db, writer.message_id)[2] == "a" and lease(db, writer.message_id).heartbeat == 1_001.0
        assert writer._timer.delay == 2.0  # nothing waits: the next heartbeat
        clock.advance(0.5)
        tick(writer)  # early: nothing is due, nothing written
        assert lease(db, writer.message_id).heartbeat == 1_001.0
        clock.advance(1.5)
        tick(writer)
        assert lease(db, writer.message_id).heartbeat == 1_003.0
        timer = writer._timer
        writer.finish(COMPLETED)
        assert timer.cancelled and writer._timer is None


def test_a_store_that_streams_recovers_again_once_a_bound_has_passed(db: Path):
    """An owner that dies while another server runs is closed by that server's next sweep."""
    clock = FakeClock()
    with Store(db, clock=clock, owner=ELSEWHERE) as a, Store(db, clock=clock) as b:
        assert b.recover_interrupted() == 0  # at B's start, A was alive
        dying = answer_of(a, "last words")
        ours = answer_of(b)
        clock.advance(b.beat_every)
        tick(ours)  # a heartbeat; the last sweep is too recent for another
        assert b.recovered == 0 and row(db, dying.message_id)[0] == STREAMING
        clock.advance(b.stale_after)  # A said nothing since; B's answer beats on
        tick(ours)
        assert b.recovered == 1
        assert row(db, dying.message_id)[:3] == (DONE, INTERRUPTED, "last words")
        assert row(db, ours.message_id)[0] == STREAMING
        ours.finish(COMPLETED)


def test_recovery_looks_at_each_process_once(db: Path, monkeypatch: pytest.MonkeyPatch):
    looked: list[int] = []
    monkeypatch.setattr(store_module, "process_exists", lambda pid: looked.append(pid) or True)
    clock = FakeClock()
    neighbour = Owner(ME.host, 999_999, "neighbour-boot")
    with Store(db, clock=clock, owner=neighbour) as a, Store(db, clock=clock) as b:
        for _ in range(5):
            answer_of(a)
        assert b.recover_interrupted() == 0
    assert looked == [999_999]


# --------------------------------------------------------------------------
# Real servers on one file
# --------------------------------------------------------------------------

PROMPT = "Tell me about the lighthouse"
FLAGS = ("--scripted-rate", "20", "--flush-interval", "0.2")


def read_in_background(port: int, max_tokens: int) -> tuple[threading.Thread, dict]:
    result: dict = {}
    reader = threading.Thread(target=lambda: result.update(trace=client.stream_sync(port, PROMPT, max_tokens)))
    reader.start()
    return reader, result


def wait_for_pieces(server: runner.RunningServer, nth: int, pieces: int, timeout: float = 30.0) -> dict:
    """Until the server's ``nth`` generation (from 0) has sent ``pieces`` pieces; its /log record."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = server.logs()
        if len(records) > nth and records[nth]["pieces_sent"] >= pieces:
            return records[nth]
        time.sleep(0.05)
    raise TimeoutError(f"generation {nth}: fewer than {pieces} pieces after {timeout} s")


def stored(db: Path, message_id: str) -> dict:
    with Store(db) as store:  # a reader of the file, not a server: it recovers nothing
        message = store.get_message(message_id)
    return {"status": message.status, "stop_reason": message.stop_reason, "content": message.content}


RECOVERED = "left streaming by a crash, marked interrupted"


@pytest.mark.timeout(120)
def test_two_servers_on_one_file_and_one_killed(tmp_path: Path):
    db = tmp_path / "shared.db"
    flags = (*FLAGS, "--db", str(db))
    started: list[runner.RunningServer] = []
    try:
        started.append(a := runner.start_server(*flags))
        reader, result = read_in_background(a.port, 160)  # 8 s at 20 tokens/s: B starts well inside it
        live = wait_for_pieces(a, 0, 5)

        # B starts while A streams: A's answer is another process's live one, not a crash's.
        started.append(b := runner.start_server(*flags))
        assert RECOVERED not in b.stderr(), b.stderr()  # nothing recovered: a fresh start says only where its store is
        assert stored(db, live["message_id"])["status"] == STREAMING
        reader.join(30)
        trace = result["trace"]
        assert trace.complete and len(trace.text_events) == 160
        assert stored(db, live["message_id"]) == {"status": DONE, "stop_reason": MAX_TOKENS, "content": trace.text}
        end = next(e.data for e in trace.events if e.kind == "end")
        assert end["stop_reason"] == MAX_TOKENS and "stored_reason" not in end  # one vocabulary

        # Now both stream; A is killed mid-answer; C starts: only A's answer is closed.
        killed_reader, killed = read_in_background(a.port, 400)
        on_b, on_b_result = read_in_background(b.port, 240)  # 12 s: live while C starts and recovers
        doomed = wait_for_pieces(a, 1, 10)
        time.sleep(0.5)  # a few flushes (every 0.2 s) since
        os.kill(a.process.pid, signal.SIGKILL)
        a.process.wait(10)  # reaped: its pid names no process now
        killed_reader.join(30)
        assert not killed["trace"].complete
        started.append(c := runner.start_server(*flags))
        assert f"1 answer {RECOVERED}" in c.stderr(), c.stderr()
        answer = stored(db, doomed["message_id"])
        assert (answer["status"], answer["stop_reason"]) == (DONE, INTERRUPTED)
        assert answer["content"] and killed["trace"].text.startswith(answer["content"])  # the partial text kept
        on_b.join(30)
        assert on_b_result["trace"].complete  # B's answer, live while C recovered, ended its own way
        b_answer = next(e.data for e in on_b_result["trace"].events if e.kind == "end")
        assert stored(db, b_answer["message_id"])["stop_reason"] == MAX_TOKENS

        # SIGINT mid-stream: the reader is told, in the stored vocabulary alone, and the text is kept.
        reader, result = read_in_background(c.port, 200)
        cut = wait_for_pieces(c, 0, 5)
        c.process.send_signal(signal.SIGINT)
        assert c.process.wait(10) == 0
        reader.join(30)
        end = next(e.data for e in result["trace"].events if e.kind == "end")
        assert end["stop_reason"] == INTERRUPTED and "stored_reason" not in end and end["incomplete"]
        kept = stored(db, cut["message_id"])["content"]
        assert kept and result["trace"].text.startswith(kept)
    finally:
        for server in started:
            server.stop()
