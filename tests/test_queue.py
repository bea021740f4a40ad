"""Everyone who asks is served: past ``max_active`` a reader waits in line, told its place, instead of a 503.

In process over the fake model. A generation that holds a slot is a reader
asking for many tokens at ``decode_seconds`` each; the others queue behind it.
Readers are made to arrive one after another where their order matters: the
next is sent once the server has admitted the last (its ``/log`` record exists
from admission on).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable

import anthropic
import httpx
import openai
import pytest
from fakes import DEFAULT_SCRIPT, FakeLM
from inprocess import on_loop, serving

from streamlab.client import timed as client
from streamlab.client import timed_websocket
from streamlab.net.aio import run_sync
from streamlab.server.config import MAX_ACTIVE

pytestmark = pytest.mark.timeout(120)
model = pytest.mark.model

SHORT = {"prompt": "Hi", "max_tokens": 12, "chat": False, "ignore_eos": True}


def long(tokens: int = 60) -> dict:
    return {**SHORT, "max_tokens": tokens}


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the server never got there")
        await asyncio.sleep(0.005)


async def in_order(server: Any, requests: list[Callable[[], Awaitable[Any]]]) -> list[asyncio.Future]:
    """Send each request once the server has admitted the one before: their arrival order is the list's."""
    started = []
    for i, request in enumerate(requests):
        started.append(asyncio.ensure_future(request()))
        await until(lambda admitted=i + 1: len(server.log) >= admitted)
    return started


def stream(port: int, body: dict = SHORT, path: str = "/stream", **options: Any) -> Callable[[], Awaitable[Any]]:
    return lambda: client.post(port, path, body, **options)


def kinds_before_text(trace: Any) -> list[str]:
    kinds = []
    for event in trace.events:
        if event.kind == "text":
            break
        kinds.append(event.kind)
    return kinds


def places(trace: Any) -> list[int]:
    return [e.data["ahead"] for e in trace.events if e.kind == "queued"]


def first_piece_at(trace: Any) -> float:
    return trace.sent + trace.first_text


def records(server: Any) -> list[dict]:
    return client.get_json_sync(server.port, "/log")


def at_once(port: int, readers: int, body: dict = SHORT) -> list:
    """``readers`` streams sent together: nobody can say in which order they reach the server."""

    async def main() -> list:
        return await asyncio.gather(*(client.post(port, "/stream", body) for _ in range(readers)))

    return run_sync(main())


# --------------------------------------------------------------------------
# Nobody is refused: a batch's worth of readers at once, and twice that, on the default config
# --------------------------------------------------------------------------


def test_a_batch_of_readers_at_once_all_run_at_once_on_the_default_config():
    with serving(FakeLM(decode_seconds=0.004)) as server:
        traces = at_once(server.port, MAX_ACTIVE)
        assert [t.status for t in traces] == [200] * MAX_ACTIVE and all(t.complete and t.tokens == 12 for t in traces)
        assert all(not places(t) for t in traces)
        assert [r["queue_position"] for r in records(server)] == [None] * MAX_ACTIVE


def test_twice_a_batch_of_readers_at_once_are_all_served_first_come_first_served():
    with serving(FakeLM(decode_seconds=0.004)) as server:
        traces = at_once(server.port, 2 * MAX_ACTIVE)
        assert [t.status for t in traces] == [200] * (2 * MAX_ACTIVE), "nobody is refused"
        assert all(t.complete and t.tokens == 12 and t.text for t in traces)
        log = {r["id"]: r for r in records(server)}
        by_reader = [log[t.request_id] for t in traces]
        now = [t for t, r in zip(traces, by_reader) if r["queue_position"] is None]
        waited = sorted((r["queue_position"], t, r) for t, r in zip(traces, by_reader) if r["queue_position"] is not None)
        assert len(now) == MAX_ACTIVE and [p for p, _, _ in waited] == list(range(MAX_ACTIVE))  # the line, each place once
        for position, trace, record in waited:
            assert places(trace)[0] == position and places(trace) == sorted(places(trace), reverse=True)
            assert record["queued_s"] > 0
        starts = [r["started"] for _, _, r in waited]
        assert starts == sorted(starts)  # generations start in the order the readers arrived
        # Those who came first read first: every reader let in at once had its first piece before any who waited.
        assert max(first_piece_at(t) for t in now) < min(first_piece_at(t) for _, t, _ in waited)


def test_one_at_a_time_the_first_pieces_come_in_arrival_order():
    with serving(FakeLM(decode_seconds=0.002), max_active=1) as server:

        async def main() -> list:
            return [await f for f in await in_order(server, [stream(server.port) for _ in range(6)])]

        traces = run_sync(main())
        assert all(t.complete for t in traces)
        firsts = [first_piece_at(t) for t in traces]
        assert firsts == sorted(firsts)
        assert [places(t)[:1] for t in traces] == [[], [0], [1], [2], [3], [4]]


# --------------------------------------------------------------------------
# Waiting: the head at once, the place, keep-alives
# --------------------------------------------------------------------------


def test_the_third_reader_gets_its_stream_at_once_with_its_place_and_pings():
    with serving(FakeLM(decode_seconds=0.01), max_active=2, ping_interval=0.05) as server:

        async def main() -> list:
            return [await f for f in await in_order(server, [stream(server.port, long(40))] * 2 + [stream(server.port)])]

        *running, third = run_sync(main())
        assert all(t.complete for t in running) and third.complete and third.status == 200
        assert third.first_byte < 0.2 < third.first_text  # the head came at once; the first piece after its wait
        before = kinds_before_text(third)
        assert before[0] == "queued" and third.events[0].data == {"ahead": 0}
        assert before.count("ping") >= 2 and set(before) == {"queued", "ping"}
        assert third.headers["content-type"].startswith("text/event-stream") and third.headers["x-request-id"]
        record = client.wait_log_sync(server.port, third.request_id)
        assert record["queue_position"] == 0 and record["queued_s"] > 0.2 and record["tokens"] == 12


def test_a_reader_further_back_sees_its_place_go_down():
    with serving(FakeLM(decode_seconds=0.005), max_active=1, ping_interval=0) as server:

        async def main() -> list:
            return [await f for f in await in_order(server, [stream(server.port, long(40)) for _ in range(4)])]

        traces = run_sync(main())
        assert [places(t) for t in traces] == [[], [0], [1, 0], [2, 1, 0]]
        assert all(t.complete for t in traces)


def test_past_the_line_503_with_retry_after_in_each_apis_shape_and_websocket_1013():
    with serving(FakeLM(decode_seconds=0.01), max_active=1, max_waiting=1) as server:
        port = server.port

        async def main() -> tuple:
            holders = await in_order(server, [stream(port, long(300), leave_after=3), stream(port, leave_after=3)])
            ours = await client.post(port, "/stream", SHORT)
            chat = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}
            theirs = await client.post(port, "/v1/chat/completions", chat)
            anthropics = await client.post(port, "/v1/messages", chat)
            socket = await timed_websocket.websocket(port, "Hi", 3)
            complete = await client.post(port, "/complete", SHORT)
            generations = await client.fetch(port, "POST", "/generations", body=SHORT)
            for holder in holders:
                await holder
            return ours, theirs, anthropics, socket, complete, generations

        ours, theirs, anthropics, socket, complete, generations = run_sync(main())
        for refused in (ours, theirs, anthropics, complete):
            assert refused.status == 503 and refused.headers["retry-after"] == "1"
            assert refused.headers["content-type"] == "application/json"
        assert generations.status == 503 and generations.headers["retry-after"] == "1"
        assert json.loads(ours.body)["error"]["status"] == 503
        assert "the line is full (1 waiting" in json.loads(ours.body)["error"]["message"]
        assert json.loads(theirs.body)["error"]["type"] == "server_error"  # OpenAI's shape
        assert json.loads(anthropics.body)["error"]["type"] == "overloaded_error"  # Anthropic's
        assert socket.close_code == 1013
        assert len(records(server)) == 2  # the refused were never admitted: no record, nothing stored


# --------------------------------------------------------------------------
# Leaving the line
# --------------------------------------------------------------------------


def test_a_reader_who_leaves_the_line_is_dropped_at_once_and_costs_no_generation():
    lm = FakeLM(decode_seconds=0.01)
    with serving(lm, max_active=1, ping_interval=0) as server:
        port = server.port

        async def main() -> list:
            readers = [stream(port, long(100)), stream(port, leave_after=0.3), stream(port)]
            started = await in_order(server, readers)
            await until(lambda: server.jobs.left_queue == 1)
            left_at = time.perf_counter()
            during = await client.get_json(port, "/debug/queues")
            health = await client.get_json(port, "/health")
            return [await f for f in started], left_at, during, health

        (holder, leaver, last), left_at, during, health = run_sync(main())
        assert holder.complete and last.complete and leaver.left and not leaver.text
        assert places(leaver) == [0]
        assert places(last) == [1, 0]  # it moved up when the one ahead left...
        moved_up = next(e for e in last.events if e.kind == "queued" and e.data["ahead"] == 0)
        assert last.sent + moved_up.t < first_piece_at(holder) + 0.6  # ...long before the generation ahead ended
        assert last.sent + moved_up.t < left_at + 0.1
        assert [w["ahead"] for w in during["waiting"]] == [0]  # the line as it stands: the last reader, next
        assert (health["waiting"], health["left_queue"], health["active"]) == (1, 1, 1)
        left = client.wait_log_sync(port, leaver.request_id)
        assert left["left_queue"] and left["stop_signal"] == "eof" and left["client_left"]
        assert left["tokens"] == 0 and left["message_id"] is None and left["conversation_id"] is None
        assert 0.2 < left["queued_s"] < 1.0
        assert lm.model.prefill_calls == 2  # two generations: the holder's and the last reader's
        assert len(server.store.conversations()) == 2  # nothing stored for the one who left


def test_websocket_close_or_stop_while_queued_leaves_the_line():
    from websockets.sync.client import connect

    with serving(FakeLM(decode_seconds=0.01), max_active=1) as server:
        port = server.port
        url, origin = f"ws://127.0.0.1:{port}/ws", f"http://127.0.0.1:{port}"

        async def main() -> tuple:
            holder = (await in_order(server, [stream(port, long(150))]))[0]

            def stop_in_line() -> tuple:
                with connect(url, origin=origin) as sock:
                    sock.send(json.dumps({**SHORT, "keep_open": True}))
                    queued = json.loads(sock.recv(5))
                    sock.send(json.dumps({"stop": True}))
                    done = json.loads(sock.recv(5))
                    sock.send(json.dumps(SHORT))  # the socket is still open for another request
                    again = json.loads(sock.recv(5))
                return queued, done, again

            def close_in_line() -> dict:
                with connect(url, origin=origin) as sock:
                    sock.send(json.dumps(SHORT))
                    return json.loads(sock.recv(5))

            queued, done, again = await asyncio.to_thread(stop_in_line)
            closed = await asyncio.to_thread(close_in_line)
            await until(lambda: server.jobs.left_queue == 3)
            await holder
            return queued, done, again, closed

        queued, done, again, closed = run_sync(main())
        assert queued == {"queued": True, "ahead": 0} and closed == {"queued": True, "ahead": 0}
        assert done["done"] and done["left_queue"] and done["tokens"] == 0 and done["message_id"] is None
        assert again == {"queued": True, "ahead": 0}  # in line again, and left again when it closed
        signals = sorted(r["stop_signal"] for r in records(server) if r["left_queue"])
        assert signals == ["close_frame", "close_frame", "stop_message"]
        assert len(server.store.conversations()) == 1


# --------------------------------------------------------------------------
# Every route queues: /complete, /ws, /generations, OpenAI's and Anthropic's
# --------------------------------------------------------------------------


def test_complete_simply_waits_its_turn():
    with serving(FakeLM(decode_seconds=0.01), max_active=1) as server:

        async def main() -> list:
            return [await f for f in await in_order(server, [stream(server.port, long(30)),
                                                              stream(server.port, path="/complete")])]

        holder, whole = run_sync(main())
        assert holder.complete and whole.status == 200 and whole.complete
        assert json.loads(whole.body)["tokens"] == 12 and whole.first_byte > 0.2  # nothing written while it waited
        record = client.wait_log_sync(server.port, whole.request_id)
        assert record["queue_position"] == 0 and record["queued_s"] > 0.2 and record["pieces_sent"] == 1


def test_websocket_reader_is_told_its_place_and_pinged():
    with serving(FakeLM(decode_seconds=0.01), max_active=1, ping_interval=0.05) as server:

        async def main() -> list:
            socket = lambda: timed_websocket.websocket(server.port, "Hi", 12, chat=False, ignore_eos=True)  # noqa: E731
            return [await f for f in await in_order(server, [stream(server.port, long(30)), socket])]

        _, trace = run_sync(main())
        assert trace.complete and trace.close_code == 1000 and trace.tokens == 12
        before = kinds_before_text(trace)
        assert trace.events[0].data == {"queued": True, "ahead": 0} and before.count("ping") >= 2


def test_a_generation_resource_waits_in_line_and_its_events_show_the_place():
    with serving(FakeLM(decode_seconds=0.01), max_active=1, ping_interval=0.05) as server:
        port = server.port

        async def main() -> tuple:
            holder = (await in_order(server, [stream(port, long(40))]))[0]
            created = (await client.fetch(port, "POST", "/generations", body=SHORT)).json()
            state = await client.get_json(port, f"/generations/{created['id']}")
            trace = await client.events(port, created["events"])
            return await holder, created, state, trace

        _, created, state, trace = run_sync(main())
        assert created["message_id"] is None and created["conversation_id"]  # the turn is stored, the answer not yet
        assert state["status"] == "queued"
        assert trace.events[0].kind == "queued" and trace.events[0].data == {"ahead": 0}
        assert trace.events[0].id is None  # not part of the answer: resuming never needs it
        assert "ping" in kinds_before_text(trace)
        numbered = [int(e.id) for e in trace.events if e.id is not None]
        assert numbered[0] == 1 and trace.complete and trace.text == DEFAULT_SCRIPT.encode()[:12].decode()
        after = client.get_json_sync(port, f"/generations/{created['id']}")
        assert after["status"] == "done" and after["message_id"] and after["tokens"] == 12


def test_cancelling_a_generation_resource_while_it_waits_takes_it_out_of_line():
    lm = FakeLM(decode_seconds=0.01)
    with serving(lm, max_active=1) as server:
        port = server.port

        async def main() -> tuple:
            holder = (await in_order(server, [stream(port, long(60))]))[0]
            created = (await client.fetch(port, "POST", "/generations", body=SHORT)).json()
            cancelled = await client.cancel_generation(port, created["id"])
            trace = await client.events(port, created["events"])
            return await holder, created, cancelled, trace

        holder, created, cancelled, trace = run_sync(main())
        assert cancelled == {"id": created["id"], "status": "done"}
        end = trace.events[-1]
        assert end.kind == "end" and end.data["left_queue"] and end.data["tokens"] == 0 and not trace.text
        (record,) = [r for r in records(server) if r["generation_id"] == created["id"]]
        assert record["left_queue"] and record["stop_signal"] == "cancel" and record["tokens"] == 0
        assert lm.model.prefill_calls == 1


def test_openai_and_anthropic_streams_show_only_pings_while_queued():
    with serving(FakeLM(decode_seconds=0.01), max_active=1, ping_interval=0.05) as server:
        port = server.port
        messages = [{"role": "user", "content": "Hi"}]
        chat = {"model": "fake", "messages": messages, "max_tokens": 5, "stream": True}

        async def main() -> list:
            return [await f for f in await in_order(server, [
                stream(port, long(30)), stream(port, chat, "/v1/chat/completions"), stream(port, chat, "/v1/messages"),
            ])]

        _, theirs, anthropics = run_sync(main())
        assert theirs.complete and theirs.text == DEFAULT_SCRIPT[:5]
        assert set(kinds_before_text(theirs)[:-1]) == {"ping"} and b"event: queued" not in theirs.body
        assert theirs.body.startswith(b": ping")  # OpenAI's has no word for a place in line: SSE comments alone
        opening = anthropics.body.index(b"event: message_start")
        waiting = anthropics.body[:opening].splitlines()
        assert waiting.count(b"event: ping") >= 2 and b": ping" not in waiting  # its own ping event, no comment
        assert anthropics.complete and anthropics.text == DEFAULT_SCRIPT[:5]

        # And their SDKs read a queued stream as any other.
        def openai_reads() -> str:
            oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
            with oai.chat.completions.create(model="fake", messages=messages, max_tokens=5, stream=True) as chunks:
                return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        def anthropic_reads() -> str:
            ant = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
            with ant.messages.stream(model="fake", max_tokens=5, messages=messages) as events:
                return "".join(events.text_stream)

        async def sdks_behind_a_holder() -> list[str]:
            holder = (await in_order(server, [stream(port, long(80))]))[0]
            texts = await asyncio.gather(asyncio.to_thread(openai_reads), asyncio.to_thread(anthropic_reads))
            await holder
            return texts

        assert run_sync(sdks_behind_a_holder()) == [DEFAULT_SCRIPT[:5], DEFAULT_SCRIPT[:5]]
        assert sum(r["queue_position"] is not None for r in records(server)) == 4  # the SDKs' requests waited too


# --------------------------------------------------------------------------
# Policies and engines
# --------------------------------------------------------------------------


def test_the_refuse_policy_still_answers_503_at_once_at_max_active():
    with serving(FakeLM(decode_seconds=0.01), max_active=1, admission="refuse") as server:

        async def main() -> tuple:
            holder = (await in_order(server, [stream(server.port, long(60))]))[0]
            asked = time.perf_counter()
            refused = await client.post(server.port, "/stream", SHORT)
            took = time.perf_counter() - asked
            socket = await timed_websocket.websocket(server.port, "Hi", 3)
            return await holder, refused, took, socket

        holder, refused, took, socket = run_sync(main())
        assert holder.complete and refused.status == 503 and refused.headers["retry-after"] == "1"
        assert took < 0.3 and "the limit is 1" in json.loads(refused.body)["error"]["message"]
        assert socket.close_code == 1013


def test_the_threads_engine_queues_too():
    with serving(FakeLM(decode_seconds=0.004), engine="threads", max_active=2) as server:
        traces = at_once(server.port, 6)
        assert all(t.status == 200 and t.complete for t in traces)
        assert sorted(p for r in records(server) if (p := r["queue_position"]) is not None) == [0, 1, 2, 3]
        assert server.source._batched is None


def test_shutdown_tells_a_waiting_reader_its_turn_never_came():
    with serving(FakeLM(decode_seconds=0.01), max_active=1) as server:
        port = server.port

        async def main() -> list:
            started = await in_order(server, [stream(port, long(500)), stream(port)])
            await asyncio.to_thread(on_loop, server, server.shutdown())
            return [await f for f in started]

        holder, waiting = run_sync(main())
    assert waiting.status == 200 and not waiting.complete and not waiting.text
    assert waiting.events[-1].kind == "error" and "shutting down" in waiting.events[-1].data["error"]["message"]
    assert holder.stop_reason is not None


@model
def test_the_batched_engine_queues_too():
    from streamlab.model.loading import load_model

    lm = load_model()
    with serving(lm, engine="batched", max_active=2) as server:
        body = {"prompt": "Tell me about ferries.", "max_tokens": 4, "chat": False, "ignore_eos": True}
        traces = at_once(server.port, 4, body)
        assert all(t.status == 200 and t.complete and t.tokens == 4 for t in traces)
        assert sorted(p for r in records(server) if (p := r["queue_position"]) is not None) == [0, 1]
        assert server.source._batched is not None and server.source._batched.stats.max_batch == 2


def test_a_client_behind_a_queue_gets_bytes_before_its_idle_timeout():
    """httpx with a 0.3 s read timeout reads a stream that waited 1 s: the pings kept it alive."""
    with serving(FakeLM(decode_seconds=0.01), max_active=1, ping_interval=0.1) as server:

        async def main() -> list:
            holder = (await in_order(server, [stream(server.port, long(100))]))[0]

            def read() -> list[str]:
                with httpx.stream("POST", f"{server.url}/stream", json=SHORT, timeout=httpx.Timeout(5, read=0.3)) as r:
                    return list(r.iter_lines())

            lines = await asyncio.to_thread(read)
            await holder
            return lines

        lines = run_sync(main())
        assert lines[0] == "event: queued" and ": ping" in lines and "data: [DONE]" in lines


# --------------------------------------------------------------------------
# The browser page says where the answer stands in line
# --------------------------------------------------------------------------


@pytest.mark.browser
def test_the_page_shows_its_place_in_line_until_the_first_piece():
    from streamlab.lab.outside import browser
    from streamlab.lab.outside import headless

    why_not = headless.unavailable_reason()
    if why_not is not None:
        pytest.skip(f"no headless browser: {why_not}")
    with serving(FakeLM(decode_seconds=0.01), max_active=1) as server, headless.chromium() as driver:
        port = server.port

        async def main() -> tuple:
            holder = (await in_order(server, [stream(port, long(150))]))[0]  # 1.5 s of the only slot

            def page() -> tuple:
                driver.get(server.url + "/")
                browser.send_prompt(driver, "Hi", 5)
                headless.wait_for(lambda: driver.execute_script("return document.body.dataset.ahead"), 10, "a place")
                waiting = driver.execute_script("return [document.getElementById('status').textContent,"
                                                " document.body.dataset.ahead, window.streamlab.ahead]")
                headless.wait_for(lambda: browser.page_state(driver) == "done", 20, "the answer")
                done = driver.execute_script("return [document.getElementById('status').textContent,"
                                             " document.body.dataset.ahead === undefined, window.streamlab.ahead]")
                return waiting, done, browser.pieces_received(driver)

            shown = await asyncio.to_thread(page)
            await holder
            return shown

        waiting, done, pieces = run_sync(main())
        assert waiting == ["waiting: 0 ahead of you", "0", 0]
        assert done[1:] == [True, None] and "waiting" not in done[0] and pieces > 0
