"""Chapter 6's SSE-or-WebSocket experiments over the fake model (nginx where it is installed)."""

from __future__ import annotations

import pytest

from streamlab.hops.nginx import find_nginx
from streamlab.lab.experiments import sse_or_websocket as sw
from streamlab.client import timed as client_timed
from streamlab.client.tracing import last_id
from streamlab.net import aio

BODY = {"prompt": "hi", "max_tokens": 40, "chat": False, "ignore_eos": True, "seed": 0}


def test_ws_location_writes_the_upgrade_lines_only_when_asked():
    plain, upgraded = sw.ws_location(8000, False), sw.ws_location(8000, True)
    assert plain.startswith("location = /ws {") and "proxy_pass http://127.0.0.1:8000;" in plain
    assert not any(line in plain for line in sw.UPGRADE_LINES)
    assert all(line in upgraded for line in sw.UPGRADE_LINES)


@pytest.mark.skipif(find_nginx() is None, reason="nginx is not installed")
def test_through_nginx_the_upgrade_fails_with_defaults_and_passes_with_the_three_lines(app):
    defaults, upgraded = sw.through_nginx(app.port, {**BODY, "max_tokens": 4})
    for row in (defaults, upgraded):  # the event stream passes either way
        assert row["event stream status"] == 200 and row["event stream complete"] is True
    assert defaults["WebSocket status"] == 400 and defaults["WebSocket complete"] is False
    assert "Upgrade" in defaults["WebSocket, the client saw"]
    assert upgraded["WebSocket status"] == 101 and upgraded["WebSocket complete"] is True


def test_after_a_drop_the_event_stream_resumes_and_the_websocket_starts_over(app):
    sse, wsock = sw.after_a_drop(app.port, {**BODY, "max_tokens": 12}, drop_after=4)
    assert sse["connections"] == 2 and sse["resumed with"] == "Last-Event-ID: 4"
    assert sse["text the reader put together"] == sse["whole answer"] and sse["tokens generated in all"] == 12
    assert sse["pieces read in all"] == 12 and sse["complete"] is True
    assert wsock["connections"] == 2 and wsock["complete"] is True
    assert wsock["text the reader put together"] != wsock["whole answer"]  # the first pieces came twice
    assert 12 + 4 <= wsock["tokens generated in all"] < 2 * 12  # the lost answer's pieces, then a whole one


def test_a_drop_after_four_pieces_resumes_from_the_fourth_when_all_came_in_one_read(apps):
    """A reader that fell behind gets the whole answer in one read; a drop after its 4th piece loses the rest."""
    app = apps(decode_seconds=0.0)
    created = aio.run_sync(client_timed.create_generation(app.port, {**BODY, "max_tokens": 12}))
    kept = aio.run_sync(sw._generation(app.port, created["id"]))  # made and kept before anyone reads
    first, second = aio.run_sync(client_timed.resume(app.port, created["id"], drop_after=4))
    assert len(first.text_events) == 4 and last_id(first) == "4" and not first.complete
    assert second.complete and first.text + second.text == kept["text"]
    assert len(first.text_events) + len(second.text_events) == 12
    (lost, again) = aio.run_sync(sw.websocket_reconnect(app.port, "hi", 12, drop_after=4, chat=False,
                                                        ignore_eos=True, seed=0))
    assert len(lost.text_events) == 4 and not lost.complete and again.complete


def test_websocket_reconnect_gives_up_after_its_retries(app):
    traces = aio.run_sync(sw.websocket_reconnect(app.port, "hi", 10, drop_after=2, retries=0, chat=False,
                                                ignore_eos=True))
    assert len(traces) == 1 and not traces[0].complete


def test_stop_rounds_count_what_each_way_made_after_the_stop(apps):
    app = apps(decode_seconds=0.01)
    rows = sw.stop_rounds(app.port, BODY, stop_after=5, rounds=2)
    assert [row["way"] for row in rows[:3]] == ["WebSocket, stop message", "event stream + cancel request",
                                                "/stream, close the connection"]
    signals = {row["way"]: row["noticed by"] for row in rows}
    assert signals == {"WebSocket, stop message": "stop_message", "event stream + cancel request": "cancel",
                       "/stream, close the connection": "eof"}
    for row in rows:
        assert row["stop reason"] == "stopped"
        assert 0 <= row["tokens generated after the stop"] <= 5  # far below the 35 left to make
        # ... and the server's own promise, from when the stop reached it: a token or two.
        assert row["tokens when the server heard"] >= 5 and 0 <= row["tokens after the server heard"] <= 2
        assert row["stop to last piece (s)"] >= 0
    cancel = [row for row in rows if row["way"] == "event stream + cancel request"]
    assert all(row["stop to cancel reply (s)"] is not None for row in cancel)
    closing = [row for row in rows if row["way"] == "/stream, close the connection"]
    assert all(row["pieces after the stop"] == 0 and row["stop to end of answer (s)"] is None for row in closing)
    summary = {row["way"]: row for row in sw.stop_summary(rows)}
    ws_row = summary["WebSocket, stop message"]
    assert ws_row["rounds"] == 2
    assert ws_row["stop to last piece, min (s)"] <= ws_row["stop to last piece, median (s)"] \
        <= ws_row["stop to last piece, max (s)"]
    assert "stop to cancel reply, median (s)" in summary["event stream + cancel request"]


def test_what_each_browser_reader_sends():
    """EventSource and WebSocket cannot carry the page's Authorization header; fetch can; all three send the cookie."""
    from streamlab.lab.experiments import browser_readers
    from streamlab.lab.outside import headless

    reason = headless.unavailable_reason()
    if reason:
        pytest.skip(f"no headless browser: {reason}")
    with headless.chromium() as driver:
        rows = {row["reader"]: row for row in browser_readers.reader_rows(driver)}
    assert rows["EventSource"]["request"] == "GET /events" and rows["EventSource"]["Authorization sent"] is False
    assert rows["fetch"]["request"] == "POST /fetch" and rows["fetch"]["Authorization sent"] is True
    assert rows["WebSocket"]["request"] == "GET /ws" and rows["WebSocket"]["Authorization sent"] is False
    assert all(row["cookie sent"] for row in rows.values())
    assert rows["WebSocket"]["Origin sent"] is True  # the one check a server can make (chapter 9)
