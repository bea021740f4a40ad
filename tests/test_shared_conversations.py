"""Conversations in the shared store (``serve --events``): a next turn through any replica keeps its history.

Issue 31, item 6. The store's interface first, each claim asserted against both implementations
(``database.Store``, SQLite; ``shared.SharedStore``, Redis, here fakeredis): a turn committed, streamed and
ended with its stop reason and incomplete flag; a dead writer's answer taken over from the text its readers
had. Then the shared store alone: recovery of a dead writer's answer, Redis unreachable (a turn refused with
503, an ending kept and written once Redis answers), a late ending from a writer taken over. Then replicas
in this process over the fake: a WebSocket's second turn on another replica reads the first, and without the
shared store it is a 404; the HTTP routes and ``/generations`` through a worker the same; a worker killed
mid-answer leaves one answer in the conversation. Last, against the real redis-server: two replica processes
behind nginx's round-robin, and Redis killed mid-answer and between two turns (what the reader saw).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Callable

import pytest

fakeredis = pytest.importorskip("fakeredis")

from fakes import FakeLM  # noqa: E402
from inprocess import generation_done, serving  # noqa: E402
from test_shared_log import URL, fake_redis  # noqa: E402, F401 - its fixture: one fake Redis for the log and the store

from streamlab.client import timed  # noqa: E402
from streamlab.client.timed_websocket import websocket  # noqa: E402
from streamlab.client.tracing import Trace, last_id  # noqa: E402
from streamlab.lab.experiments.redis_restart import restartable_redis  # noqa: E402
from streamlab.lab.outside.redis_server import find_redis  # noqa: E402
from streamlab.lab.setups import replicas  # noqa: E402
from streamlab.protocol.endings import COMPLETED, INTERRUPTED, MAX_TOKENS  # noqa: E402
from streamlab.server.config import RETRY_AFTER  # noqa: E402
from streamlab.server.store.conversations import Begun, StoreUnavailable  # noqa: E402
from streamlab.server.store.database import Store  # noqa: E402
from streamlab.server.store.schema import CUT_OFF_MARKER, CUT_OFF_WORDS, DONE, STREAMING, Owner  # noqa: E402
from streamlab.server.store.shared import SharedStore  # noqa: E402

SCRIPT = "Your name is Ada, and you asked me before. " * 6
needs_redis = pytest.mark.skipif(find_redis() is None and not os.environ.get("CI"), reason="no redis-server here")


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)
    return found


def ws_text(trace: Trace) -> str:
    return "".join(e.text for e in trace.text_events)


def done_of(trace: Trace) -> dict:
    return next(e.data for e in trace.events if e.kind == "done")


def error_of(trace: Trace) -> dict | None:
    return next((e.data for e in trace.events if e.kind == "error"), None)


def noted(text: str, reason: str) -> str:
    """An answer cut off, as the model reads it back: its text and the note that says why."""
    return text + CUT_OFF_MARKER.format(reason=CUT_OFF_WORDS[reason])


def spy_prompts(source: Any) -> list[list[dict[str, str]]]:
    """Every conversation ``source`` is asked to read (what its model's prompt is made of), in order."""
    seen: list[list[dict[str, str]]] = []
    original = source.prompt_ids

    def prompt_ids(messages: Any, *, chat: bool) -> list[int]:
        seen.append([dict(m) for m in messages])
        return original(messages, chat=chat)

    source.prompt_ids = prompt_ids
    return seen


# --------------------------------------------------------------------------
# One interface, two stores
# --------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        made = Store(tmp_path / "answers.db")
    else:
        made = SharedStore(fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True))
    yield made
    made.close()


def test_a_turn_is_committed_streamed_and_ended_the_same_in_either_store(store: Any) -> None:
    conversation = store.new_conversation(title="names")
    assert store.conversation(conversation).title == "names" and store.conversation("nope") is None
    user = store.add_user_message(conversation, "Hello, I am Ada.")
    writer = store.begin_answer(conversation)
    assert [m.status for m in store.history(conversation)] == [DONE, STREAMING], "the answer's row exists at once"
    writer.append("Hello ", 2)
    writer.append("Ada", 3)
    writer.flush()
    assert store.history(conversation)[1].content == "Hello Ada", "what was sent is written by the flush"
    final = writer.finish(MAX_TOKENS)
    assert (final.status, final.stop_reason, final.incomplete, final.tokens) == (DONE, MAX_TOKENS, True, 3)
    assert store.history(conversation)[1] == final, "the row read back is the one finish returned"
    store.add_user_message(conversation, "What is my name?")
    assert store.as_chat_messages(conversation) == [
        {"role": "user", "content": "Hello, I am Ada."},
        {"role": "assistant", "content": noted("Hello Ada", MAX_TOKENS)},  # cut off, and the model is told
        {"role": "user", "content": "What is my name?"},
    ]
    assert store.as_chat_messages(conversation, through=user.id) == [{"role": "user", "content": "Hello, I am Ada."}]
    assert [m.seq for m in store.history(conversation)] == [1, 2, 3]
    with pytest.raises(KeyError):
        store.add_user_message("nope", "hi")


def test_a_continued_answer_takes_the_row_over_from_the_text_its_readers_had(store: Any) -> None:
    conversation = store.new_conversation()
    store.add_user_message(conversation, "Tell me a story.")
    first = store.begin_answer(conversation)
    first.append("Once upon", 2)
    first.flush()  # what the dead writer's last flush wrote: less than its readers had
    heir = store.begin_answer(conversation, Begun(first.message_id, "Once upon a time", 4))
    assert heir.message_id == first.message_id and heir.tokens == 4
    heir.append(", a lighthouse", 2)  # this writer's running total: 2 tokens after the 4 kept
    assert heir.appended == ", a lighthouse" and heir.tokens == 6
    final = heir.finish(COMPLETED)
    history = store.history(conversation)
    assert len(history) == 2, "one answer, continued in its row, not a second one"
    assert (history[1].content, history[1].tokens, history[1].stop_reason) == (
        "Once upon a time, a lighthouse", 6, COMPLETED) and history[1] == final


# --------------------------------------------------------------------------
# The shared store alone
# --------------------------------------------------------------------------


def dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_an_answer_whose_writer_died_is_closed_interrupted_when_its_conversation_is_read() -> None:
    server = fakeredis.FakeServer()
    here = Owner.this_process()
    dead = SharedStore(fakeredis.FakeRedis(server=server, decode_responses=True),
                       owner=Owner(here.host, dead_pid(), "a-replica-killed-with-sigkill"))
    conversation = dead.new_conversation()
    dead.add_user_message(conversation, "hi")
    writer = dead.begin_answer(conversation)
    writer.append("half of it", 3)
    writer.flush()  # then kill -9: no ending
    alive = SharedStore(fakeredis.FakeRedis(server=server, decode_responses=True))
    answer = alive.history(conversation)[1]
    assert (answer.status, answer.stop_reason, answer.incomplete, answer.content) == (DONE, INTERRUPTED, True,
                                                                                       "half of it")
    assert alive.as_chat_messages(conversation)[1]["content"] == noted("half of it", INTERRUPTED)
    assert alive.recover_interrupted() == 0, "closed once, by whoever read it first"
    # A writer of this very process (another replica in a test) is judged by its heartbeat alone: left streaming.
    neighbour = SharedStore(fakeredis.FakeRedis(server=server, decode_responses=True))
    live = neighbour.begin_answer(conversation)
    assert alive.history(conversation)[2].status == STREAMING
    live.finish(COMPLETED)


def test_while_redis_is_unreachable_a_turn_is_refused_and_an_ending_is_kept_until_it_answers() -> None:
    server = fakeredis.FakeServer()
    store = SharedStore(fakeredis.FakeRedis(server=server, decode_responses=True))
    conversation = store.new_conversation()
    store.add_user_message(conversation, "hi")
    writer = store.begin_answer(conversation)
    writer.append("every word the reader got", 5)
    server.connected = False  # Redis gone mid-answer
    with pytest.raises(StoreUnavailable) as refused:
        store.add_user_message(conversation, "a second turn")
    assert refused.value.status == 503 and ("Retry-After", str(RETRY_AFTER)) in refused.value.headers
    assert "does not answer" in refused.value.message
    with pytest.raises(StoreUnavailable):
        store.conversation(conversation)
    final = writer.finish(MAX_TOKENS)  # no exception: the answer ends for its reader, its ending kept here
    assert (final.content, final.stop_reason, store.pending) == ("every word the reader got", MAX_TOKENS, 1)
    server.connected = True  # Redis is back: the kept ending is written by the retry (0.1 s, doubling to 2 s)
    wait_until(lambda: store.pending == 0, 5.0, "the kept ending written")
    assert store.history(conversation)[1] == final, "nothing the reader was sent is lost"
    assert len(store.history(conversation)) == 2, "the refused turn stored nothing"
    store.close()


def test_a_late_ending_from_a_writer_whose_answer_was_taken_over_changes_nothing() -> None:
    server = fakeredis.FakeServer()
    stalled, heir = (SharedStore(fakeredis.FakeRedis(server=server, decode_responses=True)) for _ in range(2))
    conversation = stalled.new_conversation()
    stalled.add_user_message(conversation, "hi")
    first = stalled.begin_answer(conversation)
    first.append("Once", 1)
    taken = heir.begin_answer(conversation, Begun(first.message_id, "Once", 1))
    first.finish(INTERRUPTED)  # the stalled writer wakes and ends its answer: not its row any more
    assert heir.history(conversation)[1].status == STREAMING
    taken.append(" more", 1)
    taken.finish(COMPLETED)
    assert heir.history(conversation)[1].content == "Once more"
    assert heir.history(conversation)[1].stop_reason == COMPLETED


# --------------------------------------------------------------------------
# Replicas in this process, over the fake
# --------------------------------------------------------------------------


@pytest.mark.usefixtures("fake_redis")
def test_a_websocket_second_turn_on_another_replica_reads_the_first_and_without_the_shared_store_it_is_lost() -> None:
    lm = FakeLM(SCRIPT)
    with serving(lm, events=URL) as a, serving(FakeLM(SCRIPT), events=URL) as b:
        first = run(websocket(a.port, "Hello, I am Ada.", 12))
        conversation = done_of(first)["conversation_id"]
        seen = spy_prompts(b.source)
        second = run(websocket(b.port, "What is my name?", 12, extra={"conversation_id": conversation}))
        assert second.complete and done_of(second)["conversation_id"] == conversation
        assert seen == [[{"role": "user", "content": "Hello, I am Ada."},
                         {"role": "assistant", "content": noted(ws_text(first), MAX_TOKENS)},
                         {"role": "user", "content": "What is my name?"}]], "B's model read A's turn"
        assert [m.role for m in a.jobs.store.history(conversation)] == ["user", "assistant"] * 2
        # The page's history reads the same store: either replica lists the conversation and its four messages.
        for replica in (a, b):
            listed = timed.get_json_sync(replica.port, "/conversations")
            assert [c["id"] for c in listed] == [conversation] and listed[0]["title"]
            shown = timed.get_json_sync(replica.port, f"/conversations/{conversation}")
            assert [m["role"] for m in shown["messages"]] == ["user", "assistant"] * 2
    # Without it: each replica's own SQLite file, and round-robin sends the second turn to the one without it.
    with serving(FakeLM(SCRIPT)) as a, serving(FakeLM(SCRIPT)) as b:
        first = run(websocket(a.port, "Hello, I am Ada.", 12))
        second = run(websocket(b.port, "What is my name?", 12, extra={"conversation_id": done_of(first)["conversation_id"]}))
        assert error_of(second)["error"]["status"] == 404 and second.close_code == 1008 and not second.complete


@pytest.mark.usefixtures("fake_redis")
def test_a_conversation_id_continues_on_any_replica_over_http_and_through_a_worker() -> None:
    with serving(FakeLM(SCRIPT), events=URL) as a, serving(FakeLM(SCRIPT), events=URL) as b:
        first = run(websocket(a.port, "Hello, I am Ada.", 10))
        conversation = done_of(first)["conversation_id"]
        streamed = run(timed.post(b.port, "/stream", {"prompt": "And my name?", "max_tokens": 8,
                                                      "conversation_id": conversation}))
        assert streamed.complete
        with replicas.worker_in_process(FakeLM(SCRIPT), URL) as w:
            seen = spy_prompts(w.worker.source)
            created = run(timed.create_generation(a.port, {"prompt": "Say it once more.", "max_tokens": 9,
                                                           "conversation_id": conversation}))
            assert created["conversation_id"] == conversation, "the 201 names the conversation"
            trace = run(timed.events(b.port, created["events"]))
            state = generation_done(b.port, created["id"])
        assert [m["content"] for m in seen[0]] == [
            "Hello, I am Ada.", noted(ws_text(first), MAX_TOKENS), "And my name?",
            noted(streamed.text, MAX_TOKENS), "Say it once more."], "the worker read every turn before it"
        end = next(e.data for e in trace.events if e.kind == "end")
        assert end["conversation_id"] == state["conversation_id"] == conversation
        assert end["message_id"] == state["message_id"] and end["message_id"] is not None
        history = b.jobs.store.history(conversation)
        assert [m.role for m in history] == ["user", "assistant"] * 3
        assert history[-1].id == end["message_id"] and history[-1].content == trace.text
        assert history[-1].stop_reason == MAX_TOKENS and history[-1].incomplete
        with pytest.raises(timed.ClientError) as missing:
            run(timed.create_generation(a.port, {"prompt": "hi", "conversation_id": "nope"}))
        assert missing.value.status == 404


@pytest.mark.usefixtures("fake_redis")
def test_a_worker_killed_mid_answer_leaves_one_answer_in_the_conversation() -> None:
    lm = FakeLM(SCRIPT, decode_seconds=0.02)
    with serving(events=URL) as a:
        first_worker = replicas.InProcessWorker(lm, URL, name="first", claim_idle=0.3)
        created = run(timed.create_generation(a.port, {"prompt": "hi", "max_tokens": 120, "ignore_eos": True}))
        before = run(timed.events(a.port, created["events"], stop_after=10))
        first_worker.crash()
        with replicas.worker_in_process(lm, URL, name="second", claim_idle=0.3):
            after = run(timed.events(a.port, created["events"], last_event_id=last_id(before)))
            state = generation_done(a.port, created["id"])
        history = a.jobs.store.history(created["conversation_id"])
    assert [m.role for m in history] == ["user", "assistant"], "one answer, continued in its row"
    assert history[1].id == state["message_id"]
    assert history[1].content == before.text + after.text == SCRIPT[:120] and history[1].tokens == 120
    assert (history[1].status, history[1].stop_reason) == (DONE, MAX_TOKENS)


# --------------------------------------------------------------------------
# The real redis-server
# --------------------------------------------------------------------------


@needs_redis
@pytest.mark.timeout(120)
def test_two_replica_processes_behind_round_robin_keep_a_websocket_conversation() -> None:
    from streamlab.lab.outside.redis_server import run_redis

    with run_redis() as redis:
        servers = replicas.start_replicas(2, events=redis.url)
        try:
            with replicas.run_balancer([s.port for s in servers]) as nginx:
                first = run(websocket(nginx.port, "Hello! My name is Ada.", 8))
                conversation = done_of(first)["conversation_id"]
                second = run(websocket(nginx.port, "What is my name?", 8, extra={"conversation_id": conversation}))
            assert first.complete and second.complete, (first.events, second.events)
            logs = [run(timed.get_json(s.port, "/log")) for s in servers]
            assert sorted(len([r for r in log if r["path"] == "/ws"]) for log in logs) == [1, 1], \
                "round-robin sent the two turns to two replicas"
            record = next(r for log in logs for r in log if r["id"] == done_of(second)["id"]
                          and r["conversation_id"] == conversation and r["path"] == "/ws" and r["prompt_tokens"] > 5)
            # The scripted source counts a prompt's words: the second turn's prompt is the whole conversation.
            history = ["Hello! My name is Ada.", noted(ws_text(first), MAX_TOKENS), "What is my name?"]
            assert record["prompt_tokens"] == sum(len(text.split()) for text in history)
        finally:
            for server in servers:
                server.stop()


@needs_redis
@pytest.mark.timeout(120)
def test_redis_killed_mid_answer_and_between_turns_refuses_the_turn_in_words_and_loses_nothing() -> None:
    with restartable_redis() as redis, serving(FakeLM(SCRIPT, decode_seconds=0.02), events=redis.url) as a, \
            serving(FakeLM(SCRIPT), events=redis.url) as b:
        # Redis killed while replica A streams the first answer: the model is A's, so the reader gets it whole.
        async def first_turn() -> Trace:
            reading = asyncio.ensure_future(websocket(a.port, "Hello, I am Ada.", 60))
            while not a.jobs.running or a.jobs.running[0].record.tokens < 10:
                await asyncio.sleep(0.01)
            redis.kill()
            return await reading

        first = run(first_turn())
        assert first.complete and ws_text(first) == SCRIPT[:60] and done_of(first)["stop_reason"] == MAX_TOKENS
        conversation = done_of(first)["conversation_id"]
        # The second turn while Redis is down: refused in words, in each API's shape, and the replica serves on.
        refused = run(websocket(b.port, "What is my name?", 8, extra={"conversation_id": conversation}))
        assert error_of(refused)["error"]["status"] == 503 and refused.close_code == 1013
        assert "Redis" in error_of(refused)["error"]["message"]
        reply = run(timed.fetch(b.port, "POST", "/stream", body={"prompt": "What is my name?", "max_tokens": 8,
                                                                  "conversation_id": conversation}))
        assert reply.status == 503 and reply.headers.get("retry-after") == str(RETRY_AFTER)
        assert set(reply.json()) == {"error"} and "does not answer" in reply.json()["error"]["message"]
        assert run(timed.fetch(b.port, "GET", "/health")).status == 503
        redis.start()  # the append-only file gives back every acknowledged write
        wait_until(lambda: a.jobs.store.pending == 0, 10.0, "A's kept ending written once Redis is back")
        seen = spy_prompts(b.source)
        second = run(websocket(b.port, "What is my name?", 8, extra={"conversation_id": conversation}))
        assert second.complete, second.events
        assert seen[-1] == [{"role": "user", "content": "Hello, I am Ada."},
                            {"role": "assistant", "content": noted(SCRIPT[:60], MAX_TOKENS)},
                            {"role": "user", "content": "What is my name?"}], \
            "the first answer whole, as its reader got it: nothing accepted was lost"
        history = b.jobs.store.history(conversation)
        assert [m.role for m in history] == ["user", "assistant"] * 2, "the refused turns stored nothing"
