"""Every way an answer ends, through a real server into its store; and a server killed mid-sentence.

The store's own rules are tested in ``test_store.py``. Here the question is
whether the server keeps them: the user's message before generating, each
piece as it is sent, and the right stop reason however the stream ends.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from streamlab.client import timed as client
from streamlab.server.store.database import Store

pytestmark = pytest.mark.timeout(120)
model = pytest.mark.model

PROMPT = "The ferry left the harbor"
EXACT = {"chat": False, "ignore_eos": True}
# A chat prompt that this model, with this seed, answers in a few tokens and then ends by itself.
# A seed whose answer ends by itself well inside max_tokens: 15 tokens in the default format (split-int4),
# and most seeds end within 30; a change of format changes the tokens, so the room is generous.
SHORT_CHAT = {"prompt": "Say hi.", "max_tokens": 60, "seed": 2, "chat": True}


def conversation(port: int, conversation_id: str) -> list[dict]:
    return client.get_json_sync(port, f"/conversations/{conversation_id}")["messages"]


def assert_stored(port: int, conversation_id: str, reason: str, text: str | None = None) -> dict:
    """The conversation holds the user's message, then an answer that ended for ``reason``."""
    user, answer = conversation(port, conversation_id)[-2:]
    assert user["role"] == "user" and user["status"] == "done"
    assert answer["role"] == "assistant" and answer["status"] == "done"
    assert answer["stop_reason"] == reason and answer["incomplete"] == (reason != "completed")
    if text is not None:
        assert answer["content"] == text
    return answer


# --------------------------------------------------------------------------
# Every stop reason, every way
# --------------------------------------------------------------------------


@model
def test_completed_when_the_model_ends_by_itself(server):
    trace = client.post_sync(server.port, "/stream", SHORT_CHAT)
    assert trace.complete and trace.stop_reason == "completed" and trace.tokens < 60  # the stored word, not "eos"
    end = next(e.data for e in trace.events if e.kind == "end")
    assert "stored_reason" not in end  # one vocabulary: the end event says what the store says
    assert trace.headers["x-conversation-id"] == end["conversation_id"]
    answer = assert_stored(server.port, end["conversation_id"], "completed", trace.text)
    assert answer["id"] == end["message_id"] and answer["tokens"] == trace.tokens
    record = client.wait_log_sync(server.port, trace.request_id)
    assert record["stored_reason"] == "completed"
    assert (record["conversation_id"], record["message_id"]) == (end["conversation_id"], end["message_id"])


@model
def test_max_tokens_on_complete(server):
    trace = client.complete_sync(server.port, PROMPT, 6, **EXACT)
    reply = trace.events[-1].data
    assert reply["conversation_id"] == trace.headers["x-conversation-id"] and reply["message_id"]
    answer = assert_stored(server.port, reply["conversation_id"], "max_tokens", trace.text)
    assert answer["tokens"] == 6
    assert conversation(server.port, reply["conversation_id"])[0]["content"] == PROMPT


@model
def test_client_left_when_the_sse_reader_goes(server):
    trace = client.stream_sync(server.port, PROMPT, 40, stop_after=4, **EXACT)
    assert trace.left
    record = client.wait_log_sync(server.port, trace.request_id)
    assert record["stop_signal"] == "eof" and record["stored_reason"] == "client_left"
    answer = assert_stored(server.port, trace.headers["x-conversation-id"], "client_left")
    assert answer["content"].startswith(trace.text)  # everything it was sent, at least what it read
    assert answer["tokens"] == record["tokens"] < 40


@model
def test_stopped_when_the_websocket_says_stop(server):
    trace = client.websocket_sync(server.port, PROMPT, 40, stop_after=4, say_stop=True, **EXACT)
    done = trace.events[-2].data
    assert done["done"] and done["stop_reason"] == "stopped"
    record = client.wait_log_sync(server.port, trace.request_id)
    assert record["stop_signal"] == "stop_message" and record["stored_reason"] == "stopped"
    assert record["tokens"] <= record["tokens_at_stop"] + 2
    assert_stored(server.port, done["conversation_id"], "stopped", trace.text)


@model
def test_client_left_when_the_websocket_closes(server):
    trace = client.websocket_sync(server.port, PROMPT, 40, stop_after=4, **EXACT)
    record = client.wait_log_sync(server.port, trace.request_id)
    assert record["stop_signal"] == "close_frame" and record["stored_reason"] == "client_left"
    answer = assert_stored(server.port, record["conversation_id"], "client_left")
    assert answer["content"].startswith(trace.text)


@model
def test_error_every_way(servers):
    failing = servers("--fail-after", "3")
    sse_trace = client.stream_sync(failing.port, PROMPT, 20, **EXACT)
    assert sse_trace.events[-1].kind == "error"
    assert_stored(failing.port, sse_trace.headers["x-conversation-id"], "error", sse_trace.text)

    ws_trace = client.websocket_sync(failing.port, PROMPT, 20, **EXACT)
    assert ws_trace.close_code == 1011 and ws_trace.events[-2].kind == "error"
    ws_text = "".join(e.text for e in ws_trace.text_events)  # trace.text also has the close reason
    answer = assert_stored(failing.port, ws_trace.events[-2].data["conversation_id"], "error", ws_text)
    assert answer["tokens"] == 3

    complete = client.complete_sync(failing.port, PROMPT, 20, **EXACT)
    assert complete.status == 500
    assert_stored(failing.port, complete.headers["x-conversation-id"], "error")

    created = client.create_generation_sync(failing.port, {"prompt": PROMPT, "max_tokens": 20, **EXACT})
    trace = client.events_sync(failing.port, created["events"])
    last = trace.events[-1]
    assert last.kind == "error" and last.id and last.data["stop_reason"] == "error"
    assert "injected fault" in last.data["error"]["message"]
    assert_stored(failing.port, created["conversation_id"], "error", trace.text)
    gone = client.events_sync(failing.port, created["events"], last_event_id=last.id)
    assert gone.status == 204  # an error ends the stream as surely as an end event


@model
def test_the_history_is_fed_back_to_the_model(server):
    first = client.complete_sync(server.port, "My name is Ada. Remember it.", 12, seed=1)
    conversation_id = first.headers["x-conversation-id"]
    alone = client.stream_sync(server.port, "What is my name?", 5, seed=1)
    follow = client.stream_sync(
        server.port, "What is my name?", 5, seed=1, extra={"conversation_id": conversation_id}
    )
    assert follow.headers["x-conversation-id"] == conversation_id
    with_history = client.wait_log_sync(server.port, follow.request_id)["prompt_tokens"]
    without = client.wait_log_sync(server.port, alone.request_id)["prompt_tokens"]
    assert with_history > without + 10  # the first exchange was in the prompt
    roles = [m["role"] for m in conversation(server.port, conversation_id)]
    assert roles == ["user", "assistant", "user", "assistant"]
    listed = client.get_json_sync(server.port, "/conversations")
    titles = {c["id"]: c["title"] for c in listed}
    assert titles[conversation_id] == "My name is Ada. Remember it."
    assert listed[0]["created"] >= listed[-1]["created"]  # newest first


@model
def test_unknown_conversation_is_404(server):
    trace = client.stream_sync(server.port, "Hi", 5, extra={"conversation_id": "nope"})
    assert trace.status == 404
    bad = client.stream_sync(server.port, "Hi", 5, extra={"conversation_id": "no/such id"})
    assert bad.status == 400


# --------------------------------------------------------------------------
# kill -9
# --------------------------------------------------------------------------


def read_in_background(port: int, max_tokens: int) -> tuple[threading.Thread, dict]:
    """Stream PROMPT in a thread; ``result["trace"]`` once the stream has ended, however it ends."""
    result: dict = {}
    reader = threading.Thread(
        target=lambda: result.update(trace=client.stream_sync(port, PROMPT, max_tokens, **EXACT))
    )
    reader.start()
    return reader, result


def wait_for_pieces(running, pieces: int, *, for_at_least: float = 0.0, timeout: float = 60.0) -> None:
    """Until the server has sent ``pieces`` pieces of its latest answer, the first of them ``for_at_least`` s ago.

    Counted from the first piece, not from the request: a slow first token (a fresh server's prompt on AVX2's
    kernels, beside another worker) once took most of a wait counted from the request, and the reader had read
    for less than a second when the kill came.
    """
    started, first_piece = time.monotonic(), None
    while time.monotonic() < started + timeout:
        records = running.logs()
        sent = records[-1]["pieces_sent"] if records else 0
        if sent and first_piece is None:
            first_piece = time.monotonic()
        if sent >= pieces and time.monotonic() - first_piece >= for_at_least:
            return
        time.sleep(0.02)
    raise TimeoutError(f"fewer than {pieces} pieces after {timeout} s")


@model
def test_kill_minus_nine_loses_at_most_the_last_second_and_sigterm_nothing(fresh_server, tmp_path: Path):
    db = tmp_path / "chat.db"
    # --token-delay: at least 3 s for 60 tokens, however fast the machine, so the kill comes mid-answer.
    flags = ("--db", str(db), "--flush-interval", "0.2", "--token-delay", "0.05")
    running = fresh_server(*flags)
    reader, result = read_in_background(running.port, 60)
    wait_for_pieces(running, 15, for_at_least=1.5)
    killed_at = time.perf_counter()
    os.kill(running.process.pid, signal.SIGKILL)
    running.process.wait(10)
    reader.join(30)
    trace = result["trace"]
    assert not trace.complete and len(trace.text_events) >= 15
    conversation_id = trace.headers["x-conversation-id"]

    restarted = fresh_server(*flags)
    assert "1 answer left streaming by a crash, marked interrupted" in restarted.stderr()
    user, answer = conversation(restarted.port, conversation_id)
    assert user["content"] == PROMPT  # the question was written before the first token
    assert answer["status"] == "done" and answer["stop_reason"] == "interrupted" and answer["incomplete"]
    assert trace.text.startswith(answer["content"])  # never more than was sent
    seen_a_second_before = "".join(e.text for e in trace.text_events if trace.sent + e.t <= killed_at - 1.0)
    assert seen_a_second_before, "the test must read for more than a second before the kill"
    assert answer["content"].startswith(seen_a_second_before)

    # A clean stop (SIGTERM) closes the answer it was writing at once, with all that was sent.
    reader, result = read_in_background(restarted.port, 200)
    wait_for_pieces(restarted, 3)
    restarted.process.send_signal(signal.SIGTERM)
    assert restarted.process.wait(10) == 0
    reader.join(30)
    with Store(db) as store:  # the file itself, read without a server
        assert store.recover_interrupted() == 0  # nothing was left streaming
        killed, stopped = [m for m in store.rows() if m["role"] == "assistant"]
    assert killed["stop_reason"] == "interrupted" and killed["content"] == answer["content"]
    assert stopped["status"] == "done" and stopped["stop_reason"] == "interrupted"
    assert stopped["content"] and result["trace"].text.startswith(stopped["content"])
