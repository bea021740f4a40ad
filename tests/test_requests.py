"""Tests for streamlab.server.answers.requests: a generation request parsed and validated, with no I/O."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlab.protocol.http_fields import HTTPError
from streamlab.server.answers.jobs import check_context
from streamlab.server.answers.requests import STREAM, WS_MESSAGE, json_depth, load_json, parse_generation_request


def test_request_defaults():
    req = parse_generation_request(b'{"prompt": "Hi"}')
    assert (req.max_tokens, req.seed, req.chat, req.ignore_eos, req.temperature, req.top_p) == (
        100,
        0,
        True,
        False,
        0.7,
        0.9,
    )


def test_an_unknown_field_is_refused_naming_it_and_the_nearest_known_one():
    with pytest.raises(HTTPError) as info:
        parse_generation_request('{"prompt": "Hi", "max_token": 3}')
    assert info.value.status == 400
    assert "'max_token'" in info.value.message and "did you mean 'max_tokens'?" in info.value.message


def test_an_unknown_field_with_no_near_name_is_refused_with_the_fields_the_route_takes():
    with pytest.raises(HTTPError) as info:
        parse_generation_request('{"prompt": "Hi", "model": "gpt", "stream": true}')
    assert "'model'" in info.value.message and "1 more unknown" in info.value.message
    assert all(name in info.value.message for name in STREAM.known)


def test_keep_open_belongs_to_the_websocket_message_only():
    assert parse_generation_request('{"prompt": "Hi", "keep_open": true}', WS_MESSAGE).keep_open
    with pytest.raises(HTTPError, match="keep_open"):
        parse_generation_request('{"prompt": "Hi", "keep_open": true}')


def test_every_declared_field_reaches_the_request():
    body = {"prompt": "Hi", "max_tokens": 7, "seed": 3, "chat": False, "ignore_eos": True, "temperature": 0.0,
            "top_p": 0.5, "stop": ["x"], "conversation_id": "abc"}
    assert set(body) == set(STREAM.known)
    req = parse_generation_request(json.dumps(body))
    assert (req.prompt, req.max_tokens, req.seed, req.chat, req.ignore_eos, req.temperature, req.top_p, req.stop,
            req.conversation_id) == ("Hi", 7, 3, False, True, 0.0, 0.5, ("x",), "abc")


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "JSON object"),
        (b"{}", "prompt is required"),
        (b'{"prompt": ""}', "empty"),
        (b'{"prompt": 5}', "prompt must be a string"),
        (b'{"prompt": "\\ud800"}', "surrogate"),
        (b'{"prompt": "a", "max_tokens": "100"}', "max_tokens must be an integer"),
        (b'{"prompt": "a", "max_tokens": 100.0}', "max_tokens must be an integer"),
        (b'{"prompt": "a", "max_tokens": true}', "max_tokens must be an integer"),
        (b'{"prompt": "a", "max_tokens": 0}', "between 1 and 4096"),
        (b'{"prompt": "a", "max_tokens": 4097}', "between 1 and 4096"),
        (b'{"prompt": "a", "seed": -1}', "seed"),
        (b'{"prompt": "a", "chat": "yes"}', "chat must be true or false"),
        (b'{"prompt": "a", "ignore_eos": 1}', "ignore_eos"),
        (b'{"prompt": "a", "temperature": 2.5}', "temperature"),
        (b'{"prompt": "a", "temperature": NaN}', "NaN"),
        (b'{"prompt": "a", "top_p": 0}', "top_p"),
        (b'{"prompt": "a", "top_p": 1.5}', "top_p"),
    ],
)
def test_request_refusals_name_the_problem(body, words):
    with pytest.raises(HTTPError) as info:
        parse_generation_request(body)
    assert info.value.status == 400
    assert words in info.value.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        name: json_values
        for name in (
            "prompt",
            "max_tokens",
            "seed",
            "chat",
            "ignore_eos",
            "temperature",
            "top_p",
            "keep_open",
        )
    },
)


@given(st.one_of(json_values, request_like))
@settings(max_examples=300, deadline=None)
def test_any_json_is_accepted_or_refused_with_400(value):
    try:
        req = parse_generation_request(json.dumps(value))
    except HTTPError as err:
        assert err.status == 400 and err.message
        return
    assert req.prompt and 1 <= req.max_tokens <= 4096 and 0 <= req.temperature <= 2 and 0 < req.top_p <= 1


@given(st.binary(max_size=64))
def test_any_bytes_are_accepted_or_refused_with_400(body):
    try:
        parse_generation_request(body)
    except HTTPError as err:
        assert err.status == 400


def test_deep_json_is_refused_with_400_before_parsing():
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(HTTPError) as info:
        parse_generation_request(deep)
    assert info.value.status == 400 and "nested" in info.value.message
    with pytest.raises(HTTPError):
        load_json(b'{"prompt": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b"}")


def test_json_depth_ignores_brackets_inside_strings():
    assert json_depth('{"prompt": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[ \\" {{{{{{{{{{{{{{{{{{"}') == 1
    assert parse_generation_request(json.dumps({"prompt": "[" * 1000})).prompt == "[" * 1000
    assert json_depth("[[1], {\"a\": [2]}]") == 3


def test_context_check_names_both_numbers():
    check_context(8000, 192, 8192)  # exactly the context: fine
    check_context(10**6, 1, None)  # a model that does not say: no check
    with pytest.raises(HTTPError) as info:
        check_context(8300, 3, 8192)
    assert info.value.status == 400
    assert "8300" in info.value.message and "8192" in info.value.message and "3" in info.value.message
