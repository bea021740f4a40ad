"""Anthropic's Messages API, as the ``anthropic`` SDK speaks it: ``POST /v1/messages``.

Streamed, an answer is a little protocol of named events: ``message_start``
(the message with empty content and the input tokens), ``content_block_start``,
a ``content_block_delta`` (``text_delta``) per piece, ``content_block_stop``,
``message_delta`` (the ``stop_reason``: ``end_turn``, ``max_tokens`` or
``stop_sequence``, and the output tokens), ``message_stop``. Silences are
filled with ``ping`` events, and a failure is an ``error`` event, which the
SDK raises. Whole (``stream`` false), it is one ``message`` object. A stream
waiting in line for its turn carries ``ping`` events alone, before its
``message_start`` (the SDK skips pings wherever they come).
"""

from __future__ import annotations

import uuid
from typing import Any

from streamlab.protocol.endings import EOS, MAX_TOKENS, STOP_SEQUENCE
from streamlab.server.events import Event
from streamlab.server.formats import Format
from streamlab.server.jobs import Job, Ticket
from streamlab.server.requests import (
    GenerationRequest,
    bad,
    boolean_field,
    content_text,
    integer_field,
    json_object,
    last_user_text,
    number_field,
    stop_field,
    transcript,
)

ROLES = {"user": "user", "assistant": "assistant"}
STOP_REASONS = {EOS: "end_turn", STOP_SEQUENCE: "stop_sequence", MAX_TOKENS: "max_tokens"}
ERROR_TYPES = {400: "invalid_request_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 415: "invalid_request_error", 503: "overloaded_error"}


def parse_request(body: bytes | str) -> GenerationRequest:
    """A Messages request: ``max_tokens`` is required, as Anthropic requires it; ``system`` goes first."""
    obj = json_object(body)
    if obj.get("max_tokens") is None:
        raise bad("max_tokens is required")
    messages = transcript(obj.get("messages"), ROLES)
    system = obj.get("system")
    if system is not None:
        messages = ({"role": "system", "content": content_text(system, "system")}, *messages)
    if obj.get("tools"):
        raise bad("tools are not supported by this server")
    return GenerationRequest(
        prompt=last_user_text(messages),
        messages=messages,
        max_tokens=integer_field(obj, "max_tokens", 0, 1, 4096),
        seed=integer_field(obj, "seed", 0, 0, 2**63 - 1) if obj.get("seed") is not None else 0,
        temperature=number_field(obj, "temperature", 1.0, 0.0, 1.0) if obj.get("temperature") is not None else 1.0,
        top_p=number_field(obj, "top_p", 1.0, 0.0, 1.0, low_open=True) if obj.get("top_p") is not None else 1.0,
        stop=stop_field(obj.get("stop_sequences"), "stop_sequences"),
        stream=boolean_field(obj, "stream", False),
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
    )


def error(status: int, message: str) -> dict:
    """Anthropic's error body (and the data of its ``error`` event)."""
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class MessagesFormat(Format):
    """The Messages event protocol for one answer, with one text content block."""

    def __init__(self, model: str) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model

    def _message(self, job: Job, content: list, stop_reason: str | None, output_tokens: int) -> dict:
        result = job.generation.result
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": result.stop_sequence if result is not None else None,
                "usage": {"input_tokens": job.record.prompt_tokens, "output_tokens": output_tokens}}

    def opening(self, job: Job) -> list[Event]:
        start = {"type": "message_start", "message": self._message(job, [], None, 0)}
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        return [Event(start, "message_start"), Event(block, "content_block_start"), self.silence()]

    def unserved(self, ticket: Ticket) -> list[Event]:
        return [Event(error(503, "the server is shutting down; this request's turn never came"), "error")]

    def piece(self, text: str) -> Event:
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        return Event(delta, "content_block_delta")

    def silence(self) -> Event:
        return Event({"type": "ping"}, "ping")

    def ending(self, job: Job) -> list[Event]:
        failure = self.failure(job, STOP_REASONS)
        if failure is not None:
            return [Event(error(500, failure), "error")]
        result = job.generation.result
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": STOP_REASONS[result.stop_reason], "stop_sequence": result.stop_sequence},
                 "usage": {"output_tokens": job.record.tokens}}
        return [Event({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                Event(delta, "message_delta"), Event({"type": "message_stop"}, "message_stop")]

    def whole(self, job: Job) -> tuple[int, Any]:
        failure = self.failure(job, STOP_REASONS)
        if failure is not None:
            return 500, error(500, failure)
        result = job.generation.result
        content = [{"type": "text", "text": result.text}]
        return 200, self._message(job, content, STOP_REASONS[result.stop_reason], job.record.tokens)
