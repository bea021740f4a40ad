"""OpenAI's stream obfuscation: ``stream_options.include_obfuscation`` puts random filler in each delta event.

What must hold: the field is there only when asked for, on the events that
carry text and on no other; its length is random within 1 to
``OBFUSCATION_MAX`` characters, and none of them costs JSON more than one
byte; the request's field is checked like any other; and the openai SDK
reads the text unchanged. Chapter 3 measures what it costs and what it hides.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import openai
import pytest

from fakes import DEFAULT_SCRIPT
from streamlab.client import timed as client
from streamlab.protocol.http_fields import HTTPError
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.wire import openai_api, responses_api
from streamlab.server.wire.openai_api import OBFUSCATION_MAX, ChatCompletionFormat, obfuscation
from streamlab.server.wire.responses_api import ResponseFormat

pytestmark = pytest.mark.timeout(60)
URL_SAFE = re.compile(r"[A-Za-z0-9_-]+")


def chunk_of(event) -> dict:
    return json.loads(event.encode().decode().removeprefix("data: ").split("\n")[-3])


def test_the_filler_is_random_in_length_within_its_bounds_and_costs_json_one_byte_a_character():
    fillers = [obfuscation() for _ in range(4000)]
    lengths = Counter(len(f) for f in fillers)
    assert set(lengths) == set(range(1, OBFUSCATION_MAX + 1))  # every length, and none outside (4000 draws of 16)
    assert max(lengths.values()) < 3 * min(lengths.values())  # near uniform: 250 each expected
    assert all(URL_SAFE.fullmatch(f) and json.dumps(f) == f'"{f}"' for f in fillers)
    long = [f for f in fillers if len(f) >= 8]  # 64 ** 8 strings each: a repeat would be a pattern, not chance
    assert len(set(long)) == len(long) and len(set(f[0] for f in fillers)) > 60


def test_a_chunk_carries_the_filler_only_when_asked_and_only_with_text():
    plain, padded = ChatCompletionFormat("m"), ChatCompletionFormat("m", include_obfuscation=True)
    assert "obfuscation" not in chunk_of(plain.piece("abc"))
    chunk = chunk_of(padded.piece("abc"))
    assert chunk["choices"][0]["delta"] == {"content": "abc"} and 1 <= len(chunk["obfuscation"]) <= OBFUSCATION_MAX
    assert "obfuscation" not in chunk_of(padded._chunk({"role": "assistant", "content": ""}))  # the opening: no text
    sizes = {len(padded.piece("abc").encode()) for _ in range(200)}
    assert len(sizes) > 8  # the same text, in events of many sizes


def test_a_response_delta_carries_the_filler_only_when_asked():
    def delta(**options) -> dict:
        event = ResponseFormat("m", GenerationRequest(prompt="x", **options)).piece("abc")
        return json.loads(event.encode().decode().split("data: ", 1)[1])

    assert "obfuscation" not in delta()
    padded = delta(include_obfuscation=True)
    assert padded["delta"] == "abc" and 1 <= len(padded["obfuscation"]) <= OBFUSCATION_MAX


@pytest.mark.parametrize("parse, body", [
    (openai_api.parse_request, {"messages": [{"role": "user", "content": "Hi"}]}),
    (responses_api.parse_request, {"input": "Hi"}),
], ids=["chat completions", "responses"])
def test_the_request_field_is_read_and_checked(parse, body):
    assert parse(json.dumps(body)).include_obfuscation is False  # off unless asked for
    asked = parse(json.dumps({**body, "stream_options": {"include_obfuscation": True}}))
    assert asked.include_obfuscation is True
    for wrong in ({"include_obfuscation": "yes"}, {"include_obfuscatoin": True}, "on"):
        with pytest.raises(HTTPError) as refused:
            parse(json.dumps({**body, "stream_options": wrong}))
        assert refused.value.status == 400


def test_chat_completions_keeps_include_usage_beside_it():
    req = openai_api.parse_request(json.dumps({"messages": [{"role": "user", "content": "Hi"}], "stream_options": {
        "include_usage": True, "include_obfuscation": True}}))
    assert (req.include_usage, req.include_obfuscation) == (True, True)


def test_responses_has_no_include_usage_in_its_stream_options():
    with pytest.raises(HTTPError):
        responses_api.parse_request(json.dumps({"input": "Hi", "stream_options": {"include_usage": True}}))


def sdk(app) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{app.url}/v1", api_key="unused", max_retries=0)


def test_the_responses_stream_carries_it_when_asked_and_the_sdk_reads_the_text_unchanged(app):
    asked = {"input": "Say hello.", "stream": True, "stream_options": {"include_obfuscation": True}}
    trace = client.post_sync(app.port, "/v1/responses", asked)
    deltas = [e for e in trace.events if e.kind == "text"]
    assert deltas and all(1 <= len(e.data["obfuscation"]) <= OBFUSCATION_MAX for e in deltas)
    others = [e for e in trace.events if e.kind != "text" and isinstance(e.data, dict)]
    assert others and not any("obfuscation" in e.data for e in others)
    assert trace.text == DEFAULT_SCRIPT and trace.complete
    plain = client.post_sync(app.port, "/v1/responses", {"input": "Say hello.", "stream": True})
    assert not any("obfuscation" in e.data for e in plain.events if isinstance(e.data, dict))
    events = list(sdk(app).responses.create(model="fake", input="Say hello.", stream=True,
                                            stream_options={"include_obfuscation": True}))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == DEFAULT_SCRIPT
    assert events[-1].type == "response.completed" and events[-1].response.output_text == DEFAULT_SCRIPT


def test_the_sdk_reads_obfuscated_chunks_unchanged(app):
    """The chunks with the filler, asked for as OpenAI's own clients ask (``stream_options``), read by the SDK."""
    chunks = list(sdk(app).chat.completions.create(model="fake", messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=200, stream=True,
                                                   stream_options={"include_obfuscation": True}))
    with_text = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(c.choices[0].delta.content for c in with_text) == DEFAULT_SCRIPT
    assert with_text and all(c.obfuscation and len(c.obfuscation) <= OBFUSCATION_MAX for c in with_text)
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].obfuscation is None


def test_chat_completions_carries_it_when_the_request_asks(app):
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True,
            "stream_options": {"include_obfuscation": True}}
    trace = client.post_sync(app.port, "/v1/chat/completions", body)
    deltas = [e for e in trace.events if e.kind == "text"]
    assert deltas and all(1 <= len(e.data.get("obfuscation", "")) <= OBFUSCATION_MAX for e in deltas)
