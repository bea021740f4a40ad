"""OpenAI's Chat Completions, as the ``openai`` SDK speaks it: ``POST /v1/chat/completions``, ``GET /v1/models``.

The request is a transcript (``messages``) read through the model's chat
template. Streamed, the answer is ``chat.completion.chunk`` events: the
first carries the role, each then a ``delta.content``, the last an empty
delta with ``finish_reason`` (``stop`` or ``length``), an optional usage
chunk (``stream_options.include_usage``), and ``data: [DONE]``. Asked for
(``stream_options.include_obfuscation``), each chunk that carries text also
carries ``obfuscation``: random filler, so that its size stops giving away the
length of its text. An answer that fails or is cut short ends with
``data: {"error": ...}`` and no ``[DONE]``: the SDK raises on it, instead of
handing over half an answer as if it were whole. Whole (``stream: false``),
it is one ``chat.completion``.
A stream waiting in line for its turn carries only ``: ping`` comments, which
the SDK skips: OpenAI's format has no word for a place in line.
"""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any, NamedTuple

from streamlab.protocol import sse
from streamlab.protocol.endings import EOS, MAX_TOKENS, STOP_SEQUENCE
from streamlab.server.transport.events import Event
from streamlab.server.wire.formats import Format
from streamlab.server.answers.answer import Job
from streamlab.server.answers.jobs import Ticket
from streamlab.server.answers.fields import REQUIRED, Field, Schema, bad
from streamlab.server.answers.requests import (
    GenerationRequest, any_text, json_object, last_user_text, stop_field, transcript,
)

DEFAULT_MAX_TOKENS = 512  # OpenAI's default is "up to the context": a CPU should not start there
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
FINISH_REASONS = {EOS: "stop", STOP_SEQUENCE: "stop", MAX_TOKENS: "length"}
ERROR_TYPES = {400: "invalid_request_error", 403: "permission_error", 404: "not_found_error",
               413: "invalid_request_error", 415: "invalid_request_error", 503: "server_error"}


def _one(value: object, name: str) -> int:
    if value != 1 or isinstance(value, bool):
        raise bad(f"{name} must be 1: this server makes one answer per request")
    return 1


def _unsupported(value: object, name: str) -> None:
    if value not in (None, False, [], {"type": "text"}):
        raise bad(f"{name} is not supported by this server")


# OpenAI's stream obfuscation. TLS hides an event's bytes, not its size: with a piece per event, the sizes spell out
# the answer's token lengths (Weiss et al., USENIX Security 2024). With ``include_obfuscation`` each delta carries an
# ``obfuscation`` string of random length, uniform over 1 to 16 characters. Two texts whose lengths differ by less
# than 16 bytes can then make events of the same size, and 99.7% of the default tokenizer's tokens are 16 bytes or
# shorter: one size no longer names one length, and only the smallest and largest sizes a sample reaches still do
# (chapter 3 counts them). Random rather than up to a fixed size, which would be block padding (chapter 3 measures both): it
# costs 8.5 characters an event on average, plus the field's name.
OBFUSCATION_MAX = 16  # characters of filler, at most; at least 1
# Off unless asked for, where OpenAI's is on unless turned off: our readers are on localhost, where nobody watches
# the wire, and the book counts every byte. A deployment read over a network would flip this default.
INCLUDE_OBFUSCATION = False


def obfuscation() -> str:
    """One event's filler: 1 to ``OBFUSCATION_MAX`` characters, all of its randomness from ``secrets``.

    URL-safe base64 (``A-Z a-z 0-9 - _``): one byte each in UTF-8, and none
    that JSON escapes, so the field costs its length and its name, no more.
    """
    length = 1 + secrets.randbelow(OBFUSCATION_MAX)
    return secrets.token_urlsafe(length)[:length]  # n random bytes are 4n/3 characters: cut to length


class StreamOptions(NamedTuple):
    """``stream_options`` as read: a usage chunk at the end, filler in each delta."""

    include_usage: bool = False
    include_obfuscation: bool = INCLUDE_OBFUSCATION


def stream_options(schema: Schema) -> Any:
    """A ``stream_options`` parser for ``schema`` (Chat Completions' or the Responses API's own)."""

    def parse(value: object, name: str) -> StreamOptions:
        if not isinstance(value, dict):
            raise bad(f"{name} must be an object")
        values, _ = schema.read(value)
        return StreamOptions(**values)

    return parse


OBFUSCATION_HELP = (f"`include_obfuscation`: an `obfuscation` field of 1-{OBFUSCATION_MAX} random characters on each"
                    f" delta, so that event sizes stop giving away text lengths (off unless asked for here; OpenAI's"
                    f" is on)")
STREAM_OPTIONS = Schema("stream_options", Field("include_usage", "boolean", "", False),
                        Field("include_obfuscation", "boolean", "", INCLUDE_OBFUSCATION))
LENGTH = "the most tokens to generate"
CHAT_COMPLETIONS = Schema(
    "POST /v1/chat/completions",
    Field("messages", "list of messages", "the conversation: `system`, `developer`, `user`, `assistant`; the last"
          " user message is what the store keeps", REQUIRED, parse=lambda value, name: transcript(value, ROLES, name)),
    Field("model", "string", "any name: the response's `model` names the model this server has", None,
          parse=any_text, null_default=True),
    Field("max_completion_tokens", "integer", LENGTH, None, 1, 4096, null_default=True, show=f"`{DEFAULT_MAX_TOKENS}`"),
    Field("max_tokens", "integer", LENGTH + " (the older name; `max_completion_tokens` wins)", None, 1, 4096,
          null_default=True, show=f"`{DEFAULT_MAX_TOKENS}`"),
    Field("seed", "integer", "the sampling seed", None, 0, 2**63 - 1, null_default=True,
          show="random: a new answer each time"),
    Field("temperature", "number", "sampling temperature", 1.0, 0.0, 2.0, null_default=True),
    Field("top_p", "number", "nucleus sampling", 1.0, 0.0, 1.0, low_open=True, null_default=True),
    Field("stop", "string or list of strings", "at most 4 stop sequences", (), null_default=True, show="none",
          parse=lambda value, name: stop_field(value, name, most=4)),
    Field("stream", "boolean", "stream `chat.completion.chunk` events, else one `chat.completion`", False,
          null_default=True),
    Field("stream_options", "object", "`include_usage`: end the stream with a usage chunk; " + OBFUSCATION_HELP,
          StreamOptions(), parse=stream_options(STREAM_OPTIONS), null_default=True, show="none"),
    Field("n", "integer", "how many answers: only 1", 1, parse=_one, null_default=True),
    Field("ignore_eos", "boolean", "vLLM's extension: generate to exactly the length asked", False, null_default=True),
    *(Field(name, "any", "refused (400) unless empty: this server reads and writes text only", None,
            parse=_unsupported, show="none") for name in ("tools", "functions", "response_format", "logprobs")),
    ignored=("frequency_penalty", "presence_penalty", "logit_bias", "top_logprobs", "user", "metadata", "store",
             "service_tier", "parallel_tool_calls", "tool_choice", "function_call", "modalities", "audio",
             "prediction", "reasoning_effort", "verbosity", "web_search_options", "prompt_cache_key",
             "safety_identifier"),
)


def parse_request(body: bytes | str) -> GenerationRequest:
    """A Chat Completions request, validated: OpenAI's fields, those with no use here named back as ignored."""
    values, ignored = CHAT_COMPLETIONS.read(json_object(body))
    limit = values["max_completion_tokens"] or values["max_tokens"] or DEFAULT_MAX_TOKENS
    messages = values["messages"]
    return GenerationRequest(
        prompt=last_user_text(messages),
        messages=messages,
        max_tokens=limit,
        # No seed: a different answer each time, as OpenAI's own sampling gives.
        seed=secrets.randbits(63) if values["seed"] is None else values["seed"],
        temperature=values["temperature"],
        top_p=values["top_p"],
        stop=values["stop"],
        stream=values["stream"],
        ignore_eos=values["ignore_eos"],
        include_usage=values["stream_options"].include_usage,
        include_obfuscation=values["stream_options"].include_obfuscation,
        model=values["model"],
        ignored=ignored,
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

    def __init__(self, model: str, *, include_usage: bool = False,
                 include_obfuscation: bool = INCLUDE_OBFUSCATION) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self.include_obfuscation = include_obfuscation

    def _chunk(self, delta: dict, finish_reason: str | None = None, *, filler: bool = False) -> Event:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "system_fingerprint": None,
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        if self.include_usage:
            chunk["usage"] = None  # every chunk says it; the last one fills it in
        if filler:
            chunk["obfuscation"] = obfuscation()
        return Event(chunk)

    def opening(self, job: Job) -> list[Event]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def unserved(self, ticket: Ticket) -> list[Event]:
        return [Event(error(503, "the server is shutting down; this request's turn never came"))]

    def piece(self, text: str) -> Event:
        return self._chunk({"content": text}, filler=self.include_obfuscation)

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
