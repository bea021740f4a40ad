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
from streamlab.server.transport.events import Event
from streamlab.server.wire.formats import Format
from streamlab.server.answers.answer import Job
from streamlab.server.answers.jobs import Ticket
from streamlab.server.answers.fields import REQUIRED, Field, Schema, bad
from streamlab.server.answers.requests import (
    GenerationRequest, any_text, content_text, json_object, last_user_text, stop_field, transcript,
)

ROLES = {"user": "user", "assistant": "assistant"}
STOP_REASONS = {EOS: "end_turn", STOP_SEQUENCE: "stop_sequence", MAX_TOKENS: "max_tokens"}
ERROR_TYPES = {400: "invalid_request_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 415: "invalid_request_error", 503: "overloaded_error"}


def _no_tools(value: object, name: str) -> None:
    if value:
        raise bad(f"{name} are not supported by this server")


MESSAGES = Schema(
    "POST /v1/messages",
    Field("messages", "list of messages", "the conversation, `user` and `assistant` turns; the last user message is"
          " what the store keeps", REQUIRED, parse=lambda value, name: transcript(value, ROLES, name)),
    Field("max_tokens", "integer", "the most tokens to generate (required, as Anthropic requires it)", REQUIRED,
          1, 4096),
    Field("model", "string", "any name: the response's `model` names the model this server has", None,
          parse=any_text, null_default=True),
    Field("system", "string or list of text blocks", "the system prompt, read before the messages", None,
          parse=content_text, null_default=True),
    Field("temperature", "number", "sampling temperature", 1.0, 0.0, 1.0, null_default=True),
    Field("top_p", "number", "nucleus sampling", 1.0, 0.0, 1.0, low_open=True, null_default=True),
    Field("stop_sequences", "list of strings", "stop sequences: the answer ends before the first one", (),
          parse=stop_field, null_default=True, show="none"),
    Field("stream", "boolean", "stream the Messages events, else one `message`", False, null_default=True),
    Field("seed", "integer", "the sampling seed (streamlab's own: Anthropic's API has none)", 0, 0, 2**63 - 1,
          null_default=True),
    Field("tools", "list", "refused (400) unless empty: this server reads and writes text only", None,
          parse=_no_tools, null_default=True, show="none"),
    ignored=("metadata", "top_k", "tool_choice", "thinking", "service_tier", "container", "mcp_servers",
             "context_management"),
)


def parse_request(body: bytes | str) -> GenerationRequest:
    """A Messages request: ``max_tokens`` is required, as Anthropic requires it; ``system`` goes first."""
    values, ignored = MESSAGES.read(json_object(body))
    messages = values["messages"]
    if values["system"] is not None:
        messages = ({"role": "system", "content": values["system"]}, *messages)
    return GenerationRequest(
        prompt=last_user_text(messages),
        messages=messages,
        max_tokens=values["max_tokens"],
        seed=values["seed"],
        temperature=values["temperature"],
        top_p=values["top_p"],
        stop=values["stop_sequences"],
        stream=values["stream"],
        model=values["model"],
        ignored=ignored,
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
