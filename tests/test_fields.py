"""Each route's fields declared once (streamlab.server.answers.fields): unknown ones refused, the APIs' own ignored aloud.

In process, over the fake model: what a client that makes a typo, or one
written for OpenAI's or Anthropic's service, gets back.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from streamlab.protocol import websocket_frames
from streamlab.protocol.http_fields import HTTPError
from streamlab.server.wire import anthropic_api, openai_api
from streamlab.server.app import ROUTES, Server, not_found
from streamlab.server.answers.fields import REQUIRED, Field, Schema
from test_server import RawWebSocket

ASK = [{"role": "user", "content": "Say hello."}]


# -- the declaration -------------------------------------------------------------


def test_a_schema_gives_each_field_its_value_or_default_and_names_the_ignored():
    schema = Schema("POST /x", Field("n", "integer", "", 3, 1, 9), Field("name", "string", "", REQUIRED,
                    parse=lambda v, _: v), Field("p", "number", "", 1.0, 0.0, 2.0, null_default=True),
                    ignored=("user",))
    assert schema.read({"name": "a", "user": "u"}) == ({"n": 3, "name": "a", "p": 1.0}, ("user",))
    assert schema.read({"name": "a", "n": 9, "p": None})[0] == {"n": 9, "name": "a", "p": 1.0}
    for body, words in [({}, "name is required"), ({"name": "a", "n": None}, "n must be an integer"),
                        ({"name": "a", "n": 10}, "between 1 and 9"), ({"name": "a", "nn": 1}, "did you mean 'n'?")]:
        with pytest.raises(HTTPError) as info:
            schema.read(body)
        assert info.value.status == 400 and words in info.value.message


def test_every_field_the_openai_parser_reads_is_declared_and_every_declared_one_is_read():
    """The declaration is the parser's: a field read and not declared would be refused before it was read."""
    body = {"messages": ASK, "model": "m", "max_completion_tokens": 5, "max_tokens": 6, "seed": 1,
            "temperature": 0.5, "top_p": 0.5, "stop": "x", "stream": True, "stream_options": {"include_usage": True},
            "n": 1, "ignore_eos": True, "tools": [], "functions": [], "response_format": {"type": "text"},
            "logprobs": False}
    assert set(body) == {f.name for f in openai_api.CHAT_COMPLETIONS.fields}
    req = openai_api.parse_request(json.dumps(body))
    assert (req.max_tokens, req.seed, req.temperature, req.top_p, req.stop, req.stream, req.include_usage,
            req.ignore_eos, req.model, req.ignored) == (5, 1, 0.5, 0.5, ("x",), True, True, True, "m", ())


def test_every_field_the_anthropic_parser_reads_is_declared():
    body = {"messages": ASK, "max_tokens": 5, "model": "m", "system": "Be brief.", "temperature": 0.5,
            "top_p": 0.5, "stop_sequences": ["x"], "stream": True, "seed": 2, "tools": []}
    assert set(body) == {f.name for f in anthropic_api.MESSAGES.fields}
    req = anthropic_api.parse_request(json.dumps(body | {"top_k": 5}))
    assert (req.max_tokens, req.seed, req.stop, req.stream, req.messages[0]["role"], req.ignored) == (
        5, 2, ("x",), True, "system", ("top_k",))


def test_every_declared_route_is_routed_and_a_handler_says_what_it_does():
    for path, methods in ROUTES:
        for name in methods.values():
            doc = getattr(Server, name).__doc__ or ""
            assert doc.startswith("``") and ": " in doc.splitlines()[0], f"{name}'s docstring names no route"


# -- over HTTP -------------------------------------------------------------------


def test_a_typo_in_a_stream_request_is_a_400_naming_the_field_and_the_right_one(app):
    response = httpx.post(f"{app.url}/stream", json={"prompt": "Hi", "max_token": 3})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "'max_token'" in message and "'max_tokens'" in message


def test_openai_fields_with_no_use_here_are_served_and_named_back(app):
    body = {"model": "gpt-4o", "messages": ASK, "max_tokens": 5, "user": "u1", "logit_bias": {}}
    response = httpx.post(f"{app.url}/v1/chat/completions", json=body)
    assert response.status_code == 200 and response.headers["x-ignored-fields"] == "user, logit_bias"
    assert response.json()["model"] == "fake"  # the model that answered, not the name asked for
    plain = httpx.post(f"{app.url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 5})
    assert "x-ignored-fields" not in plain.headers


def test_openai_sdk_with_a_model_not_ours_gets_ours_named_in_each_chunk(app):
    llm = openai.OpenAI(base_url=f"{app.url}/v1", api_key="unused", max_retries=0)
    chunks = list(llm.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=5, stream=True))
    assert {chunk.model for chunk in chunks} == {"fake"}


def test_openai_sdk_raises_on_a_field_openai_does_not_have(app):
    llm = openai.OpenAI(base_url=f"{app.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        llm.chat.completions.create(model="fake", messages=ASK, extra_body={"max_token": 5})
    assert "did you mean 'max_tokens'?" in caught.value.message


def test_anthropic_stream_names_its_ignored_fields_in_the_head(app):
    body = {"model": "claude", "messages": ASK, "max_tokens": 5, "stream": True, "top_k": 5, "metadata": {}}
    with httpx.stream("POST", f"{app.url}/v1/messages", json=body) as response:
        assert response.status_code == 200 and response.headers["x-ignored-fields"] == "top_k, metadata"
        assert '"model":"fake"' in response.read().decode().replace(" ", "")
    llm = anthropic.Anthropic(base_url=app.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        llm.messages.create(model="fake", max_tokens=5, messages=ASK, extra_body={"stop_sequence": ["x"]})
    assert "did you mean 'stop_sequences'?" in caught.value.message


def test_a_v1_path_we_do_not_have_names_the_ones_we_do(app):
    response = httpx.post(f"{app.url}/v1/embeddings", json={"input": "Hi"})
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    message = response.json()["error"]["message"]
    assert all(path in message for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/models"))
    assert not_found("/nope").message == "no route for /nope"


def test_a_websocket_message_with_an_unknown_field_is_refused_then_closed_1008(app):
    with RawWebSocket(app.port) as sock:
        sock.send(websocket_frames.Opcode.TEXT, b'{"prompt": "hi", "keep_opn": true}')
        frames = sock.frames_until_close()
    assert "did you mean 'keep_open'?" in json.loads(frames[0].payload)["error"]["message"]
    assert websocket_frames.parse_close_payload(frames[-1].payload)[0] == 1008
