"""The relay: streamlab in front of an OpenAI-compatible server, the abort propagated.

The upstream here is another streamlab, in process over the fake model, so
its ``/log`` says exactly how many tokens it generated and why it stopped.
"""

from __future__ import annotations

import socket
import time

import openai
import pytest

from fakes import DEFAULT_SCRIPT, FakeLM
from inprocess import serving
from streamlab.client import timed as client
from streamlab.lab.experiments import api_formats
from streamlab.lab.setups import runner
from streamlab.server.answers.sources import UpstreamSource

LONG = 60  # tokens asked for with ignore_eos: the script repeats


@pytest.fixture(scope="module")
def upstream():
    with serving(FakeLM(decode_seconds=0.01)) as server:
        yield server


@pytest.fixture(scope="module")
def relays(upstream):
    """``relays[naive]``: a relay to the upstream, watching (False) or naive (True)."""
    url = f"http://127.0.0.1:{upstream.port}"
    with serving(UpstreamSource(url), naive=False) as watching, serving(UpstreamSource(url), naive=True) as naive:
        yield {False: watching, True: naive}


def upstream_record(upstream, after: set[str]) -> dict:
    """The upstream's record of the one request made since ``after`` (its ids then), once it is over."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = [r for r in client.get_json_sync(upstream.port, "/log") if r["id"] not in after]
        if new and new[-1]["done"]:
            return new[-1]
        time.sleep(0.02)
    raise AssertionError("the upstream request never ended")


def ids(server) -> set[str]:
    return {r["id"] for r in client.get_json_sync(server.port, "/log")}


BODIES = {
    "/stream": {"prompt": "Hi", "max_tokens": LONG, "ignore_eos": True},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": LONG, "stream": True,
                             "ignore_eos": True},
}


def test_relay_names_the_upstream_model_and_engine(relays):
    health = client.get_json_sync(relays[False].port, "/health")
    assert health["engine"] == "upstream" and health["model"] == "fake"


@pytest.mark.parametrize("path", ["/stream", "/complete", "/v1/chat/completions", "/v1/messages"])
def test_every_format_relays_the_upstream_answer(relays, path):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 200, "stream": path != "/complete"}
    if path in ("/stream", "/complete"):
        body = {"prompt": "Hi", "max_tokens": 200}
    trace = client.post_sync(relays[False].port, path, body)
    assert trace.status == 200 and trace.text == DEFAULT_SCRIPT
    record = client.wait_log_sync(relays[False].port, trace.headers["x-request-id"])
    assert record["stop_reason"] == "eos" and record["stored_reason"] == "completed"
    assert record["tokens"] == len(DEFAULT_SCRIPT.encode()) and record["prompt_tokens"] > 0  # from the upstream's usage


def test_openai_sdk_through_the_relay(relays):
    sdk = openai.OpenAI(base_url=f"{relays[False].url}/v1", api_key="unused", max_retries=0)
    answer = sdk.chat.completions.create(model="fake", messages=[{"role": "user", "content": "Hi"}], max_tokens=7)
    assert answer.choices[0].message.content == DEFAULT_SCRIPT[:7] and answer.choices[0].finish_reason == "length"


@pytest.mark.parametrize("path", list(BODIES))
def test_leaving_after_ten_chunks_stops_the_upstream_unless_naive(upstream, relays, path):
    before = ids(upstream)
    trace = client.post_sync(relays[False].port, path, BODIES[path], stop_after=10)
    assert len(trace.text_events) == 10
    propagated = upstream_record(upstream, before)
    assert propagated["tokens"] <= 12 and propagated["stop_signal"] == "eof"

    before = ids(upstream)
    client.post_sync(relays[True].port, path, BODIES[path], stop_after=10)
    naive = upstream_record(upstream, before)
    assert naive["tokens"] == LONG and naive["stop_reason"] == "max_tokens"


def test_what_passed_through_is_stored_with_its_stop_reason(relays):
    relay = relays[False]
    trace = client.post_sync(relay.port, "/stream", BODIES["/stream"], stop_after=10)
    record = client.wait_log_sync(relay.port, trace.headers["x-request-id"])
    assert record["stop_signal"] == "eof" and record["stored_reason"] == "client_left"
    conversation = client.get_json_sync(relay.port, f"/conversations/{record['conversation_id']}")
    answer = conversation["messages"][-1]
    assert answer["stop_reason"] == "client_left" and answer["incomplete"]
    assert trace.text.startswith(answer["content"]) and len(answer["content"]) >= len(trace.text) - 4


def test_an_upstream_refusal_ends_the_stream_with_an_error(relays):
    body = {"prompt": "x" * 9000, "max_tokens": 5}  # past the upstream's context: it says 400
    trace = client.post_sync(relays[False].port, "/stream", body)
    assert trace.error is not None and "400" in str(trace.error) and "context" in str(trace.error)
    assert not trace.complete


def test_an_upstream_that_is_down_is_an_error_not_a_hang():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens here once it closes
    with serving(UpstreamSource(f"http://127.0.0.1:{port}", model="nobody")) as relay:
        started = time.monotonic()
        trace = client.post_sync(relay.port, "/stream", {"prompt": "Hi", "max_tokens": 5})
        assert trace.error is not None and time.monotonic() - started < 5
        request_id = client.get_json_sync(relay.port, "/log")[-1]["id"]
        assert client.wait_log_sync(relay.port, request_id, timeout=10)["stored_reason"] == "error"  # once it is closed


def test_serve_upstream_from_the_command_line(upstream):
    """``python -m streamlab serve --upstream URL`` loads no model and relays."""
    with runner.serve("--upstream", f"http://127.0.0.1:{upstream.port}", ready_timeout=60) as relay:
        trace = client.post_sync(relay.port, "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True})
        assert trace.text == DEFAULT_SCRIPT[:5]
        assert client.get_json_sync(relay.port, "/health")["engine"] == "upstream"


# --------------------------------------------------------------------------
# Chapter 10's cutting hop: a clean end before the terminator
# --------------------------------------------------------------------------

CUT = 4  # pieces the hop lets through


@pytest.fixture(scope="module")
def hop(upstream):
    with api_formats.CuttingHop(upstream.port, CUT) as hop:
        yield hop


@pytest.mark.parametrize("read", [api_formats.read_openai, api_formats.read_openai_responses, api_formats.read_anthropic,
                                  api_formats.read_httpx_sse], ids=["openai", "openai-responses", "anthropic", "httpx-sse"])
def test_the_sdks_hand_over_a_cleanly_cut_stream_as_if_it_were_whole(hop, read):
    kwargs = {} if read is api_formats.read_httpx_sse else {"model": "fake"}
    result = read(hop.url, LONG, **kwargs)
    assert result.raised is None and result.stop_reason is None  # no error: only the missing stop reason tells
    assert result.pieces == CUT and DEFAULT_SCRIPT.startswith(result.text) and result.text


def test_the_hop_counts_pieces_so_every_format_is_cut_after_the_same_text(hop):
    texts = {path: client.post_sync(hop.port, path, api_formats.request_body(fmt, LONG, model="fake")).text
             for fmt, path in api_formats.ROUTES.items()}
    assert len(set(texts.values())) == 1 and len(texts["/stream"]) == CUT  # the fake model's tokens are bytes


def test_the_hop_hangs_up_on_the_upstream_which_stops_generating(upstream, hop):
    cuts, before = hop.cuts, ids(upstream)
    trace = client.post_sync(hop.port, "/v1/chat/completions", BODIES["/v1/chat/completions"])
    assert trace.status == 200 and len(trace.text_events) == CUT and not trace.complete
    record = upstream_record(upstream, before)
    assert record["stop_signal"] == "eof" and record["tokens"] < LONG
    assert hop.cuts == cuts + 1


def test_a_relay_behind_the_hop_turns_the_cut_into_an_error_the_sdk_raises(hop):
    with serving(UpstreamSource(hop.url)) as relay:
        result = api_formats.read_openai(relay.url, LONG, model="fake")
    assert result.raised is not None and result.text == DEFAULT_SCRIPT[:CUT]


def test_behind_the_relay_the_responses_sdk_hands_the_cut_over_as_response_failed(hop):
    """The relay serves /v1/responses too: the cut is a ``response.failed``, an event this SDK does not raise."""
    with serving(UpstreamSource(hop.url)) as relay:
        result = api_formats.read_openai_responses(relay.url, LONG, model="fake")
    assert result.raised is None and result.stop_reason is None and result.text == DEFAULT_SCRIPT[:CUT]
    assert result.failed is not None and "without finish_reason" in result.failed


def test_the_responses_reading_takes_its_stop_reason_from_the_terminal_event(upstream):
    url = f"http://127.0.0.1:{upstream.port}"
    whole = api_formats.read_openai_responses(url, 200, model="fake")  # the script ends before 200 tokens
    short = api_formats.read_openai_responses(url, 3, model="fake")
    assert (whole.stop_reason, whole.text, whole.failed) == ("completed", DEFAULT_SCRIPT, None)
    assert short.stop_reason == "max_output_tokens" and short.pieces == 3
    assert api_formats.ending(client.post_sync(upstream.port, "/v1/responses", api_formats.request_body(
        api_formats.RESPONSES, 3, model="fake"))) == "max_output_tokens"


def test_health_asks_the_upstream(relays, upstream):
    """A relay is as well as its upstream: /health says which, and that it answers."""
    health = client.get_json_sync(relays[False].port, "/health")
    assert health["ok"] is True and health["upstream"] == {"url": f"http://127.0.0.1:{upstream.port}", "ok": True,
                                                           "error": None}
