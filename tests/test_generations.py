"""Tests for ``/generations`` (streamlab/server/resources/resumable.py), in process over a fake model.

A reader that drops and reconnects with ``Last-Event-ID`` resumes where it
left off, from events the server kept, without generating anything again;
``--forget`` is the contrast, a server that has to start over. Also: fan-out
to several readers, 204 after the end, the grace period, cancel, and the
static files of the browser page.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from streamlab.client import timed as client
from streamlab.client import tracing
from streamlab.protocol import sse
from streamlab.server.transport import responses as server_module
from streamlab.server.app import Server
from streamlab.server.config import ServerConfig

pytestmark = pytest.mark.timeout(120)

PROMPT = "The ferry left the harbor"
EXACT = {"chat": False, "ignore_eos": True}  # exactly max_tokens tokens, whatever the model says
BODY = {"prompt": PROMPT, "max_tokens": 40, "seed": 3, **EXACT}
SLOW = 0.05  # seconds per token of the fake model: 40 tokens take 2 s, long enough to drop and resume
KEPT = {"grace": 1.0, "decode_seconds": SLOW}  # a kept generation nobody reads stops after 1 s
FORGET = {"forget": True, "decode_seconds": SLOW}


def body(**changes: object) -> dict:
    return {**BODY, **changes}


def records_of(port: int, generation_id: str) -> list[dict]:
    """Every generation the server ran for one resource, once each has ended."""
    mine = [r for r in client.get_json_sync(port, "/log") if r["generation_id"] == generation_id]
    return [client.wait_log_sync(port, r["id"]) for r in mine]


def wait_status(port: int, generation_id: str, status: str = "done", timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = client.get_json_sync(port, f"/generations/{generation_id}")
        if state["status"] == status or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def stored_answer(port: int, conversation_id: str) -> dict:
    """The conversation's last message, as the store has it."""
    return client.get_json_sync(port, f"/conversations/{conversation_id}")["messages"][-1]


def numbered(trace: tracing.Trace) -> list[int]:
    """The ids of the events the reader got (pieces, end, error)."""
    return [int(e.id) for e in trace.events if e.kind in ("text", "end", "error")]


@pytest.fixture(scope="module")
def kept(apps):
    return apps(**KEPT)


@pytest.fixture(scope="module")
def uninterrupted(kept) -> str:
    """BODY's text, read in one go over /stream: what every resumed reading must add up to."""
    trace = client.post_sync(kept.port, "/stream", BODY)
    assert trace.complete and trace.tokens == 40
    return trace.text


# --------------------------------------------------------------------------
# Resuming
# --------------------------------------------------------------------------


def test_resume_after_a_drop_adds_up_to_one_uninterrupted_answer(kept, uninterrupted):
    created = client.create_generation_sync(kept.port, BODY)
    first, second = client.resume_sync(kept.port, created["id"], drop_after=10)
    assert first.left and not first.complete and len(first.text_events) >= 10
    assert second.status == 200 and second.complete
    assert second.headers["x-generation-id"] == created["id"]
    ids = numbered(first) + numbered(second)
    assert ids == list(range(1, len(ids) + 1))  # nothing missing, nothing twice
    assert first.text + second.text == uninterrupted
    end = second.events[-1]
    assert end.kind == "end" and end.data["stop_reason"] == "max_tokens" and end.data["tokens"] == 40
    (record,) = records_of(kept.port, created["id"])  # one generation served both readings
    assert record["tokens"] == 40 and record["path"] == "/generations"


def test_forgetting_server_starts_over_on_reconnect(apps, kept, uninterrupted):
    forget = apps(**FORGET)
    created = client.create_generation_sync(forget.port, BODY)
    assert created["message_id"] is None  # nothing runs until someone reads
    first, second = client.resume_sync(forget.port, created["id"], drop_after=10)
    assert first.left and second.complete
    assert numbered(second)[0] == 1  # the reconnect got everything again, from event 1
    assert second.text == uninterrupted  # same prompt, same seed: the same text, paid for twice
    records = records_of(forget.port, created["id"])
    assert [r["stored_reason"] for r in records] == ["client_left", "max_tokens"]
    dropped = len(first.text_events)
    total = sum(r["tokens"] for r in records)
    assert 40 + dropped <= total <= 40 + dropped + 3, (dropped, [r["tokens"] for r in records])


def test_a_forgetting_server_has_no_204_for_a_reader_who_had_it_all(apps):
    forget = apps(**FORGET)
    created = client.create_generation_sync(forget.port, body(max_tokens=6))
    full = client.events_sync(forget.port, created["events"])
    again = client.events_sync(forget.port, created["events"], last_event_id=tracing.last_id(full))
    assert full.complete and again.status == 200 and again.complete  # an EventSource would go on for ever
    assert numbered(again) == numbered(full) and again.text == full.text
    parser = sse.EventStreamParser()
    assert numbered(full)[0] == 1 and parser.feed(full.body)[0].retry == 1000  # numbered as a kept stream is
    records = records_of(forget.port, created["id"])
    assert [r["tokens"] for r in records] == [6, 6]
    assert {r["path"] for r in records} == {f"/generations/{created['id']}/events"}


def test_forgetting_readers_at_once_each_get_a_run_of_their_own(apps):
    forget = apps(**FORGET)
    created = client.create_generation_sync(forget.port, body(max_tokens=8))

    async def two() -> list[tracing.Trace]:
        path = created["events"]
        return await asyncio.gather(client.events(forget.port, path), client.events(forget.port, path))

    one, other = asyncio.run(two())
    assert one.complete and other.complete and one.text == other.text
    assert one.headers["x-request-id"] != other.headers["x-request-id"]
    assert [r["tokens"] for r in records_of(forget.port, created["id"])] == [8, 8]


def test_a_head_request_starts_nothing_on_a_forgetting_server(apps):
    forget = apps(**FORGET)
    created = client.create_generation_sync(forget.port, body(max_tokens=6))
    reply = client.fetch_sync(forget.port, "HEAD", created["events"])
    assert reply.status == 200 and reply.body == b""
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert "x-request-id" not in reply.headers
    assert records_of(forget.port, created["id"]) == []
    assert client.get_json_sync(forget.port, f"/generations/{created['id']}")["status"] == "waiting"


def test_forget_naive_does_not_notice_the_drop_and_runs_on_for_nobody(apps):
    naive = apps(forget=True, naive=True, decode_seconds=SLOW)
    created = client.create_generation_sync(naive.port, body(max_tokens=20))
    seen = client.events_sync(naive.port, created["events"], stop_after=3)
    assert seen.left
    (record,) = records_of(naive.port, created["id"])
    assert record["tokens"] == 20 and record["stop_reason"] == "max_tokens"
    assert record["stop_signal"] != "eof"  # it never read the connection: at most a write failed


def test_after_the_end_a_reconnect_gets_204_and_a_fresh_reader_a_full_replay(kept):
    created = client.create_generation_sync(kept.port, body(max_tokens=8))
    full = client.events_sync(kept.port, created["events"])
    assert full.status == 200 and full.complete
    assert full.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert full.headers["cache-control"] == "no-cache, no-store, no-transform"
    assert full.headers["x-accel-buffering"] == "no"
    assert numbered(full) == list(range(1, len(numbered(full)) + 1))
    end_id = tracing.last_id(full)
    assert full.events[-1].kind == "end" and end_id == str(len(numbered(full)))

    done = client.events_sync(kept.port, created["events"], last_event_id=end_id)
    assert done.status == 204 and done.events == [] and not done.complete

    replay = client.events_sync(kept.port, created["events"])  # no Last-Event-ID: from the start
    assert replay.text == full.text and numbered(replay) == numbered(full)
    middle = client.events_sync(kept.port, created["events"], last_event_id=3)
    assert numbered(middle)[0] == 4 and full.text.endswith(middle.text)
    (record,) = records_of(kept.port, created["id"])
    assert record["tokens"] == 8  # four readings, one generation


def test_every_event_can_be_resumed_by_an_eventsource(kept):
    created = client.create_generation_sync(kept.port, body(max_tokens=8))
    trace = client.events_sync(kept.port, created["events"])
    parser = sse.EventStreamParser()
    events = parser.feed(trace.body) + parser.close()
    assert events and all(e.id for e in events)
    assert [int(e.id) for e in events] == list(range(1, len(events) + 1))
    assert events[0].retry == 1000 and parser.retry == 1000  # reconnect after 1 s, not the default 3
    assert events[-1].event == "end" and not parser.pending
    for block in trace.body.decode().split("\n\n")[:-1]:  # each event has its own id: line
        assert block.startswith(": ping") or "\nid: " in "\n" + block


def test_pings_in_the_silences_between_numbered_events(apps):
    paused = apps(pauses={3: 1.2}, ping_interval=0.25)  # as test_server
    created = client.create_generation_sync(paused.port, body(max_tokens=6))
    trace = client.events_sync(paused.port, created["events"])
    assert trace.complete and sum(e.kind == "ping" for e in trace.events) >= 3
    blocks = trace.body.decode().split("\n\n")[:-1]
    assert all(block == ": ping" or "\nid: " in "\n" + block for block in blocks)


def test_several_readers_at_once_get_the_same_events(kept):
    created = client.create_generation_sync(kept.port, body(max_tokens=12))

    async def two() -> list[tracing.Trace]:
        path = created["events"]
        return await asyncio.gather(client.events(kept.port, path), client.events(kept.port, path))

    one, other = asyncio.run(two())
    assert one.complete and other.complete
    assert one.text == other.text and numbered(one) == numbered(other)
    (record,) = records_of(kept.port, created["id"])
    assert record["tokens"] == 12


# --------------------------------------------------------------------------
# Grace, cancel
# --------------------------------------------------------------------------


def test_unread_generation_stops_after_the_grace_period(kept):
    started = time.monotonic()
    created = client.create_generation_sync(kept.port, body(max_tokens=1000))
    state = wait_status(kept.port, created["id"], timeout=10)
    assert state["status"] == "done" and time.monotonic() - started < 3.5
    (record,) = records_of(kept.port, created["id"])
    assert record["stop_signal"] == "grace_expired" and record["stored_reason"] == "client_left"
    assert record["client_left"] and record["tokens"] < 1000
    stored = stored_answer(kept.port, created["conversation_id"])
    assert stored["stop_reason"] == "client_left" and stored["incomplete"]
    assert stored["content"] == state["text"] != ""


def test_grace_starts_again_when_the_last_reader_leaves(kept):
    created = client.create_generation_sync(kept.port, body(max_tokens=1000))
    seen = client.events_sync(kept.port, created["events"], stop_after=3)
    assert seen.left
    state = wait_status(kept.port, created["id"], timeout=10)
    (record,) = records_of(kept.port, created["id"])
    assert state["status"] == "done" and record["stop_signal"] == "grace_expired"
    assert len(seen.text_events) <= record["tokens"] < 1000


def test_a_reader_keeps_the_generation_going_past_the_grace_period(kept):
    created = client.create_generation_sync(kept.port, body(max_tokens=1000))
    result: dict = {}
    reader = threading.Thread(
        target=lambda: result.update(trace=client.events_sync(kept.port, created["events"]))
    )
    reader.start()
    time.sleep(2.0)  # twice --grace
    assert client.get_json_sync(kept.port, f"/generations/{created['id']}")["status"] == "running"
    client.cancel_generation_sync(kept.port, created["id"])
    reader.join(30)
    (record,) = records_of(kept.port, created["id"])
    assert record["stop_signal"] == "cancel" and result["trace"].complete


def test_cancel_stops_within_two_tokens(kept):
    created = client.create_generation_sync(kept.port, body(max_tokens=200))
    result: dict = {}
    reader = threading.Thread(
        target=lambda: result.update(trace=client.events_sync(kept.port, created["events"]))
    )
    reader.start()
    while client.get_json_sync(kept.port, f"/generations/{created['id']}")["tokens"] < 8:
        time.sleep(0.05)
    answer = client.cancel_generation_sync(kept.port, created["id"])
    assert answer == {"id": created["id"], "status": "done"}
    reader.join(30)
    (record,) = records_of(kept.port, created["id"])
    assert record["stop_signal"] == "cancel" and record["stop_reason"] == "stopped"
    assert record["tokens_at_stop"] >= 8 and record["tokens"] <= record["tokens_at_stop"] + 2, record
    assert record["stored_reason"] == "stopped" and not record["client_left"]
    trace = result["trace"]
    assert trace.complete and trace.events[-1].data["stop_reason"] == "stopped"
    stored = stored_answer(kept.port, created["conversation_id"])
    assert stored["stop_reason"] == "stopped" and stored["content"] == trace.text
    again = client.cancel_generation_sync(kept.port, created["id"])  # nothing left to stop
    assert again["status"] == "done"
    assert client.get_json_sync(kept.port, f"/generations/{created['id']}")["stored_reason"] == "stopped"


def test_state_of_a_generation(kept):
    created = client.create_generation_sync(kept.port, body(max_tokens=6))
    trace = client.events_sync(kept.port, created["events"])
    state = client.get_json_sync(kept.port, f"/generations/{created['id']}")
    assert state == {
        "id": created["id"],
        "conversation_id": created["conversation_id"],
        "message_id": created["message_id"],
        "status": "done",
        "text": trace.text,
        "tokens": 6,
        "stop_reason": "max_tokens",
        "stored_reason": "max_tokens",
        "incomplete": True,
        "events": len(numbered(trace)),
    }


@pytest.mark.parametrize("method, path", [
    ("GET", "/generations/nope"),
    ("GET", "/generations/nope/events"),
    ("POST", "/generations/nope/cancel"),
    ("GET", "/conversations/nope"),
])
def test_unknown_ids_are_404_json(kept, method, path):
    reply = client.fetch_sync(kept.port, method, path, body=b"" if method == "POST" else None)
    assert reply.status == 404 and reply.json()["error"]["status"] == 404


def test_bad_generation_request_is_400(kept):
    reply = client.fetch_sync(kept.port, "POST", "/generations", body={"max_tokens": 5})
    assert reply.status == 400 and "prompt" in reply.json()["error"]["message"]
    with pytest.raises(client.ClientError) as info:
        client.create_generation_sync(kept.port, {"prompt": "hi", "conversation_id": "no-such-one"})
    assert info.value.status == 404


# --------------------------------------------------------------------------
# The browser page's files
# --------------------------------------------------------------------------


def test_index_page_is_served(kept):
    reply = client.fetch_sync(kept.port, "GET", "/")
    if not (server_module.STATIC / "index.html").is_file():
        assert reply.status == 404
        return
    assert reply.status == 200 and reply.headers["content-type"] == "text/html; charset=utf-8"
    assert reply.headers["cache-control"] == "no-cache"
    assert reply.body == (server_module.STATIC / "index.html").read_bytes()


def fetch_from(tmp_path: Path, paths: list[str]) -> list[client.Reply]:
    """GET each path from a server started in this process (no model: only static files are asked for)."""

    async def main() -> list[client.Reply]:
        server = Server(lm=None, config=ServerConfig(port=0, db_path=str(tmp_path / "static.db")))
        await server.start()
        try:
            return [await client.fetch(server.port, "GET", path) for path in paths]
        finally:
            await server.shutdown()

    return asyncio.run(main())


def test_static_files_and_nothing_else(tmp_path, monkeypatch):
    static = tmp_path / "static"
    (static / "vendor").mkdir(parents=True)
    (static / "index.html").write_text("<!doctype html><title>t</title>")
    (static / "app.js").write_text("console.log(1)")
    (static / "style.css").write_text("body{}")
    (static / "logo.svg").write_text("<svg/>")
    (static / "vendor" / "lib.js").write_text("var x")
    (static / ".secret.js").write_text("no")
    (static / "notes.txt").write_text("no")
    (tmp_path / "outside.js").write_text("no")
    (static / "link.js").symlink_to(tmp_path / "outside.js")
    monkeypatch.setattr(server_module, "STATIC", static)
    ok = ["/", "/static/app.js", "/static/style.css", "/static/logo.svg", "/static/vendor/lib.js"]
    refused = [
        "/static/../server.py",
        "/static/..%2Fserver.py",
        "/static/%2e%2e/outside.js",
        "/static/vendor/../../outside.js",
        "/static/.secret.js",
        "/static/notes.txt",
        "/static/missing.js",
        "/static/link.js",
        "/static/vendor",
        "/static/",
    ]
    replies = fetch_from(tmp_path, ok + refused)
    types = [r.headers.get("content-type") for r in replies[: len(ok)]]
    assert [r.status for r in replies[: len(ok)]] == [200] * len(ok)
    assert types == [
        "text/html; charset=utf-8",
        "text/javascript; charset=utf-8",
        "text/css; charset=utf-8",
        "image/svg+xml",
        "text/javascript; charset=utf-8",
    ]
    assert all(r.headers["cache-control"] == "no-cache" for r in replies[: len(ok)])
    assert replies[4].body == b"var x"
    for path, reply in zip(refused, replies[len(ok):]):
        assert reply.status == 404, path
        assert json.loads(reply.body)["error"]["status"] == 404


def test_no_index_page_is_404(tmp_path, monkeypatch):
    monkeypatch.setattr(server_module, "STATIC", tmp_path / "empty")
    (reply,) = fetch_from(tmp_path, ["/"])
    assert reply.status == 404 and reply.headers["content-type"] == "application/json"
