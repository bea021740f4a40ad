"""OpenAI's and Anthropic's formats, read by their own SDKs: clients nobody here wrote.

In process over the fake model, except the last test, which checks against
the real model that the SDKs' joined text equals ``/complete``'s for the
same seed.
"""

from __future__ import annotations

import json
import socket

import anthropic
import httpx
import openai
import pytest

from fakes import DEFAULT_SCRIPT
from streamlab.client import timed as client

model = pytest.mark.model
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "seed": 3}


def openai_client(app) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{app.url}/v1", api_key="unused", max_retries=0)


def anthropic_client(app) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=app.url, api_key="unused", max_retries=0)


def last_log(app) -> dict:
    return app.logs()[-1]


def ask(text: str = "Say hello.") -> list[dict]:
    return [{"role": "user", "content": text}]


# -- OpenAI ---------------------------------------------------------------------


def test_openai_lists_the_model(app):
    assert [m.id for m in openai_client(app).models.list()] == ["fake"]


def test_openai_whole_answer_with_usage_matching_the_log(app):
    answer = openai_client(app).chat.completions.create(model="fake", messages=ask(), max_tokens=200)
    assert answer.object == "chat.completion" and answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == DEFAULT_SCRIPT and answer.choices[0].finish_reason == "stop"
    log = last_log(app)
    assert log["path"] == "/v1/chat/completions" and log["stop_reason"] == "eos" and log["stored_reason"] == "completed"
    assert answer.usage.completion_tokens == log["tokens"] and answer.usage.prompt_tokens == log["prompt_tokens"] > 0


def test_openai_stream_role_first_finish_reason_last_then_usage(app):
    chunks = list(openai_client(app).chat.completions.create(
        model="fake", messages=ask(), max_tokens=10, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert DEFAULT_SCRIPT.encode()[:10].decode() == text
    assert len({c.id for c in chunks}) == 1  # every chunk names the same completion
    log = last_log(app)
    assert log["stop_reason"] == "max_tokens" and chunks[-1].usage.prompt_tokens == log["prompt_tokens"]


def test_openai_stream_without_usage_has_no_usage_chunk(app):
    chunks = list(openai_client(app).chat.completions.create(model="fake", messages=ask(), max_tokens=5, stream=True))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_openai_stop_sequence_ends_the_answer_before_it(app):
    answer = openai_client(app).chat.completions.create(model="fake", messages=ask(), max_tokens=200, stop=[" This"])
    assert answer.choices[0].message.content == "Hello, world!" and answer.choices[0].finish_reason == "stop"
    assert last_log(app)["stop_reason"] == "stop_sequence"


def test_openai_system_and_history_reach_the_chat_template(app):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "developer", "content": "Still brief."},
                {"role": "user", "content": [{"type": "text", "text": "Again?"}]}]
    openai_client(app).chat.completions.create(model="fake", messages=messages, max_tokens=3)
    long = last_log(app)["prompt_tokens"]
    openai_client(app).chat.completions.create(model="fake", messages=ask("Again?"), max_tokens=3)
    assert long > last_log(app)["prompt_tokens"]  # the whole transcript was read, not just the last message


@pytest.mark.parametrize("body, field", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
    ({"messages": ask(), "n": 2}, "n must be 1"),
    ({"messages": ask(), "max_tokens": 0}, "max_tokens"),
    ({"messages": ask(), "temperature": 3}, "temperature"),
    ({"messages": ask(), "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "image_url"),
])
def test_openai_bad_requests_raise_bad_request_error_naming_the_field(app, body, field):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(app).chat.completions.create(model="fake", **body)
    assert caught.value.status_code == 400 and field in caught.value.message
    assert caught.value.body["type"] == "invalid_request_error"


def test_openai_refusals_use_openai_error_bodies(app):
    response = httpx.post(f"{app.url}/v1/chat/completions", content=b"{}", headers={"Content-Type": "text/plain"})
    assert response.status_code == 415 and set(response.json()["error"]) == {"message", "type", "param", "code"}
    missing = httpx.get(f"{app.url}/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_openai_busy_server_is_a_503_the_sdk_can_retry(apps):
    busy = apps(max_active=0)
    with pytest.raises(openai.InternalServerError) as caught:
        openai_client(busy).chat.completions.create(model="fake", messages=ask(), max_tokens=3)
    assert caught.value.status_code == 503 and caught.value.response.headers["retry-after"]


def test_openai_error_mid_stream_is_raised_by_the_sdk(apps):
    failing = apps(fail_after=5)
    texts = []
    with pytest.raises(openai.APIError, match="generation failed"):
        for chunk in openai_client(failing).chat.completions.create(model="fake", messages=ask(), max_tokens=50,
                                                                    stream=True):
            texts.append(chunk.choices[0].delta.content or "")
    assert "".join(texts) == DEFAULT_SCRIPT[:5]  # what came before the error, and no [DONE] after it


def test_openai_stream_read_over_a_raw_socket_ends_with_done(app):
    trace = client.post_sync(app.port, "/v1/chat/completions",
                             {"messages": ask(), "max_tokens": 200, "stream": True})
    kinds = [e.kind for e in trace.events]
    assert trace.text == DEFAULT_SCRIPT and kinds[-2:] == ["end", "done"] and trace.complete


# -- Anthropic ------------------------------------------------------------------


def test_anthropic_whole_message(app):
    message = anthropic_client(app).messages.create(model="fake", max_tokens=200, messages=ask(), system="Be brief.")
    assert message.type == "message" and message.role == "assistant" and message.content[0].text == DEFAULT_SCRIPT
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    log = last_log(app)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (log["prompt_tokens"], log["tokens"])


def test_anthropic_stream_text_and_final_message(app):
    with anthropic_client(app).messages.stream(model="fake", max_tokens=12, messages=ask()) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == DEFAULT_SCRIPT[:12] and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12 == last_log(app)["tokens"]


def test_anthropic_stop_sequence_is_named(app):
    with anthropic_client(app).messages.stream(model="fake", max_tokens=200, messages=ask(),
                                               stop_sequences=["world"]) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Hello, " and final.stop_reason == "stop_sequence"
    assert final.stop_sequence == "world"


def test_anthropic_event_protocol_in_order_with_pings_in_silences(apps):
    slow = apps(decode_seconds=0.05, ping_interval=0.02)
    trace = client.post_sync(slow.port, "/v1/messages",
                             {"messages": ask(), "max_tokens": 4, "stream": True, "model": "fake"})
    names = [e.kind for e in trace.events if e.kind != "ping"]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "end", "done"]  # message_delta (stop reason), message_stop
    assert sum(e.kind == "ping" for e in trace.events) >= 2  # Anthropic's own ping event, not an SSE comment
    assert trace.text == DEFAULT_SCRIPT[:4]


def test_anthropic_errors_in_anthropic_shape(app, apps):
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client(app).messages.create(model="fake", max_tokens=0, messages=ask())
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    missing = httpx.post(f"{app.url}/v1/messages", json={"messages": ask()})
    assert missing.status_code == 400 and "max_tokens is required" in missing.json()["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as busy:
        anthropic_client(apps(max_active=0)).messages.create(model="fake", max_tokens=3, messages=ask())
    assert busy.value.status_code == 503 and busy.value.body["error"]["type"] == "overloaded_error"


def test_anthropic_error_mid_stream_is_raised_by_the_sdk(apps):
    with pytest.raises(anthropic.APIStatusError, match="generation failed"):
        with anthropic_client(apps(fail_after=5)).messages.stream(model="fake", max_tokens=50, messages=ask()) as s:
            for _ in s.text_stream:
                pass


# -- the same machinery as every route ------------------------------------------


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": ask(), "max_tokens": 400, "stream": True, "ignore_eos": True}),
    ("/v1/messages", {"messages": ask(), "max_tokens": 400, "stream": True}),
])
def test_leaving_mid_stream_stops_generation_and_is_stored(apps, path, body):
    slow = apps(decode_seconds=0.01)
    trace = client.post_sync(slow.port, path, body, stop_after=5)
    assert len(trace.text_events) == 5
    record = client.wait_log_sync(slow.port, last_log(slow)["id"])
    assert record["stop_signal"] == "eof" and record["stored_reason"] == "client_left"
    assert record["tokens"] < 40  # stopped within a few tokens, not at 400 (nor the script's 63)


def test_v1_routes_pass_the_same_guards(app):
    port = app.port
    with socket.create_connection(("127.0.0.1", port)) as sock:
        body = json.dumps({"messages": ask(), "max_tokens": 3}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert sock.recv(65536).startswith(b"HTTP/1.1 403")
    other_site = httpx.post(f"{app.url}/v1/messages", json={"messages": ask(), "max_tokens": 3},
                            headers={"Origin": "http://evil.example"})
    assert other_site.status_code == 403 and other_site.json()["type"] == "error"


def test_a_prompt_past_the_context_is_refused_in_the_api_shape(app):
    with pytest.raises(openai.BadRequestError, match="context"):
        openai_client(app).chat.completions.create(model="fake", messages=ask("x" * 9000), max_tokens=5)


# -- the real model ---------------------------------------------------------------


@model
def test_sdks_join_to_the_same_text_as_complete_for_the_same_seed(server):
    prompt = "Name three colours."
    whole = client.complete_sync(server.port, prompt, 16, seed=SAMPLING["seed"], extra={"temperature": 0.7, "top_p": 0.9})
    chunks = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused").chat.completions.create(
        model="any", messages=ask(prompt), max_tokens=16, stream=True, **SAMPLING)
    openai_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    with anthropic.Anthropic(base_url=server.url, api_key="unused").messages.stream(
            model="any", max_tokens=16, messages=ask(prompt), extra_body=SAMPLING) as stream:
        anthropic_text = "".join(stream.text_stream)
    assert whole.text and openai_text == whole.text == anthropic_text


# -- the /v1 routes read by httpx-sse and parsed strictly by h11 ------------------


V1_STREAMS = {
    "/v1/chat/completions": {"messages": ask(), "max_tokens": 8, "stream": True},
    "/v1/messages": {"messages": ask(), "max_tokens": 8, "stream": True},
}


def test_httpx_sse_pooled_client_reads_each_v1_stream_then_reuses_the_connection(app):
    from httpx_sse import connect_sse

    with httpx.Client(base_url=app.url, timeout=10) as pooled:
        for _ in range(5):
            for path, body in V1_STREAMS.items():
                with connect_sse(pooled, "POST", path, json=body) as source:
                    events = list(source.iter_sse())
                last = events[-1]
                assert (last.data == "[DONE]") if path.endswith("completions") else (last.event == "message_stop")
                assert pooled.get("/health").json()["ok"]


@pytest.mark.parametrize("path, body, status", [
    *((path, body, 200) for path, body in V1_STREAMS.items()),
    ("/v1/chat/completions", {"messages": ask(), "max_tokens": 4}, 200),
    ("/v1/messages", {"messages": ask(), "max_tokens": 4}, 200),
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/messages", {"messages": ask()}, 400),
])
def test_h11_finds_no_protocol_error_in_v1_responses(app, path, body, status):
    from test_clients import H11

    h = H11(app.port)
    try:
        h.send("POST", path, [("Content-Type", "application/json")], json.dumps(body).encode())
        response, headers, data = h.response()
        assert response.status_code == status and data
        if status == 200:
            assert h.after() == "keep-alive"
            h.send("GET", "/v1/models")
            assert h.response()[0].status_code == 200
        else:
            assert h.after() == "closed"
    finally:
        h.close()
