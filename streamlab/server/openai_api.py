"""OpenAI's Chat Completions, as the ``openai`` SDK speaks it: ``POST /v1/chat/completions``, ``GET /v1/models``.

The request is a transcript (``messages``) read through the model's chat
template. Streamed, the answer is ``chat.completion.chunk`` events: the
first carries the role, each then a ``delta.content``, the last an empty
delta with ``finish_reason`` (``stop`` or ``length``), an optional usage
chunk (``stream_options.include_usage``), and ``data: [DONE]``. An answer
that fails or is cut short ends with ``data: {"error": ...}`` and no
``[DONE]``: the SDK raises on it, instead of handing over half an answer as
if it were whole. Whole (``stream: false``), it is one ``chat.completion``.
A stream waiting in line for its turn carries only ``: ping`` comments, which
the SDK skips: OpenAI's format has no word for a place in line.
"""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any

from streamlab.protocol import sse
from streamlab.protocol.endings import EOS, MAX_TOKENS, STOP_SEQUENCE
from streamlab.server.events import Event
from streamlab.server.formats import Format
from streamlab.server.jobs import Job, Ticket
from streamlab.server.requests import (
    GenerationRequest,
    bad,
    boolean_field,
    integer_field,
    json_object,
    last_user_text,
    number_field,
    stop_field,
    transcript,
)

DEFAULT_MAX_TOKENS = 512  # OpenAI's default is "up to the context": a CPU should not start there
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
FINISH_REASONS = {EOS: "stop", STOP_SEQUENCE: "stop", MAX_TOKENS: "length"}
ERROR_TYPES = {400: "invalid_request_error", 403: "permission_error", 404: "not_found_error",
               413: "invalid_request_error", 415: "invalid_request_error", 503: "server_error"}


def parse_request(body: bytes | str) -> GenerationRequest:
    """A Chat Completions request, validated; unknown fields are ignored, as OpenAI-compatible servers do."""
    obj = json_object(body)
    messages = transcript(obj.get("messages"), ROLES)
    if obj.get("n", 1) != 1:
        raise bad("n must be 1: this server makes one answer per request")
    for unsupported in ("tools", "functions", "response_format", "logprobs"):
        if obj.get(unsupported) not in (None, False, [], {"type": "text"}):
            raise bad(f"{unsupported} is not supported by this server")
    limit = "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
    options = obj.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options must be an object")
    seed = obj.get("seed")
    return GenerationRequest(
        prompt=last_user_text(messages),
        messages=messages,
        max_tokens=integer_field(obj, limit, DEFAULT_MAX_TOKENS, 1, 4096) if obj.get(limit) is not None
        else DEFAULT_MAX_TOKENS,
        # No seed: a different answer each time, as OpenAI's own sampling gives.
        seed=secrets.randbits(63) if seed is None else integer_field(obj, "seed", 0, 0, 2**63 - 1),
        temperature=number_field(obj, "temperature", 1.0, 0.0, 2.0) if obj.get("temperature") is not None else 1.0,
        top_p=number_field(obj, "top_p", 1.0, 0.0, 1.0, low_open=True) if obj.get("top_p") is not None else 1.0,
        stop=stop_field(obj.get("stop"), "stop", most=4),
        stream=boolean_field(obj, "stream", False),
        ignore_eos=boolean_field(obj, "ignore_eos", False),  # vLLM's extension, for experiments that need length
        include_usage=boolean_field(options or {}, "include_usage", False),
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
    )


def models_body(name: str) -> dict:
    """``GET /v1/models``: the one model this server has."""
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "streamlab"}]}


def error(status: int, message: str, param: str | None = None) -> dict:
    """OpenAI's error body, which the SDK turns into ``BadRequestError``, ``NotFoundError``..."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def usage(job: Job) -> dict:
    record = job.record
    return {"prompt_tokens": record.prompt_tokens, "completion_tokens": record.tokens,
            "total_tokens": record.prompt_tokens + record.tokens}


class ChatCompletionFormat(Format):
    """``chat.completion.chunk`` events, every one carrying the same id, time and model."""

    def __init__(self, model: str, *, include_usage: bool = False) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> Event:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "system_fingerprint": None,
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        if self.include_usage:
            chunk["usage"] = None  # every chunk says it; the last one fills it in
        return Event(chunk)

    def opening(self, job: Job) -> list[Event]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def unserved(self, ticket: Ticket) -> list[Event]:
        return [Event(error(503, "the server is shutting down; this request's turn never came"))]

    def piece(self, text: str) -> Event:
        return self._chunk({"content": text})

    def ending(self, job: Job) -> list[Event]:
        failure = self.failure(job, FINISH_REASONS)
        if failure is not None:
            return [Event(error(500, failure))]
        events = [self._chunk({}, FINISH_REASONS[job.generation.result.stop_reason])]
        if self.include_usage:
            events.append(Event({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                 "model": self.model, "system_fingerprint": None, "choices": [],
                                 "usage": usage(job)}))
        events.append(Event(sse.DONE))
        return events

    def whole(self, job: Job) -> tuple[int, Any]:
        failure = self.failure(job, FINISH_REASONS)
        if failure is not None:
            return 500, error(500, failure)
        result = job.generation.result
        message = {"role": "assistant", "content": result.text, "refusal": None}
        return 200, {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": FINISH_REASONS[result.stop_reason]}],
            "usage": usage(job),
        }
