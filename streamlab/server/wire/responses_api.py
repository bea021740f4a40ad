"""OpenAI's Responses API, as the ``openai`` SDK's ``client.responses.create`` speaks it: ``POST /v1/responses``.

Where Chat Completions streams one kind of chunk, a response streams named,
typed events, each with a ``sequence_number`` counting from 0 that lets a
reader see a gap: ``response.created`` (the response, ``in_progress``),
``response.in_progress``, ``response.output_item.added`` (one assistant
message) and ``response.content_part.added`` (its one ``output_text`` part),
then a ``response.output_text.delta`` per piece, then the closing half in
reverse: ``response.output_text.done`` (the whole text),
``response.content_part.done``, ``response.output_item.done``, and one
terminal event carrying the final response with its usage:
``response.completed`` (the model ended its answer, or a stop sequence
did), ``response.incomplete`` with ``incomplete_details.reason``
``max_output_tokens`` (the length limit ended it), or ``response.failed``
with ``error`` (the generation failed, or stopped before its end). There is
no ``data: [DONE]``: the terminal event is the end. A reader waiting in line
is told so once, in the API's own word (``response.created`` with status
``queued``, then ``response.queued``); keep-alives are SSE comments, which the
SDK skips. Whole (``stream`` false), it is the final response object. Asked for
(``stream_options.include_obfuscation``), each delta carries ``obfuscation``,
random filler, as Chat Completions' chunks do (see ``openai_api.obfuscation``).

The input is ``input`` (a string, or a list of messages whose content is a
string or ``input_text`` / ``output_text`` parts) and ``instructions``, read
first, as a system message.
"""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any

from streamlab.protocol.endings import EOS, MAX_TOKENS, STOP_SEQUENCE
from streamlab.server.transport.events import Event
from streamlab.server.wire.formats import Format
from streamlab.server.wire.openai_api import (
    DEFAULT_MAX_TOKENS, INCLUDE_OBFUSCATION, OBFUSCATION_HELP, StreamOptions, error, obfuscation, stream_options,
)
from streamlab.server.answers.answer import Job
from streamlab.server.answers.jobs import Ticket
from streamlab.server.answers.fields import REQUIRED, Field, Schema, bad
from streamlab.server.answers.requests import (
    GenerationRequest, any_text, json_object, last_user_text, text_field, transcript,
)

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text")
# How each way a generation ends is told: completed, or incomplete for the length limit; anything else failed.
STATUSES = {EOS: "completed", STOP_SEQUENCE: "completed", MAX_TOKENS: "incomplete"}
INCOMPLETE = {MAX_TOKENS: "max_output_tokens"}


def _input(value: Any, name: str) -> tuple[dict[str, str], ...]:
    """``input``: one user message as a string, or a list of messages (``type`` ``message``, or none)."""
    if isinstance(value, str):
        return ({"role": "user", "content": text_field(value, name)},)
    if not isinstance(value, list) or not value:
        raise bad(f"{name} must be a string or a non-empty list of messages")
    return transcript(value, ROLES, name, kinds=TEXT_PARTS, item_type="message")


# The Responses API's stream_options hold only the filler (its usage is in every final response).
STREAM_OPTIONS = Schema("stream_options", Field("include_obfuscation", "boolean", "", INCLUDE_OBFUSCATION))


def _refused(why: str) -> Any:
    def parse(value: object, name: str) -> None:
        if value not in (None, False, [], {}, 0):
            raise bad(f"{name} is not supported by this server: {why}")

    return parse


def _text_format(value: object, name: str) -> None:
    """``text``: only plain text output (``{"format": {"type": "text"}}``), and any verbosity."""
    if not isinstance(value, dict):
        raise bad(f"{name} must be an object")
    shape = value.get("format")
    if shape not in (None, {"type": "text"}):
        raise bad(f"{name}.format must be {{\"type\": \"text\"}}: this server writes plain text only")


RESPONSES = Schema(
    "POST /v1/responses",
    Field("input", "string or list of messages", "what to answer: a user message, or the conversation (`system`,"
          " `developer`, `user`, `assistant`; content a string or `input_text` parts); the last user message is"
          " what the store keeps", REQUIRED, parse=_input),
    Field("instructions", "string", "the system prompt, read before the input", None,
          parse=lambda value, name: text_field(value, name, empty=True), null_default=True, show="none"),
    Field("model", "string", "any name: the response's `model` names the model this server has", None,
          parse=any_text, null_default=True),
    Field("max_output_tokens", "integer", "the most tokens to generate", None, 1, 4096, null_default=True,
          show=f"`{DEFAULT_MAX_TOKENS}`"),
    Field("temperature", "number", "sampling temperature", 1.0, 0.0, 2.0, null_default=True),
    Field("top_p", "number", "nucleus sampling", 1.0, 0.0, 1.0, low_open=True, null_default=True),
    Field("stream", "boolean", "stream the typed events, else one `response`", False, null_default=True),
    Field("stream_options", "object", OBFUSCATION_HELP, StreamOptions(), parse=stream_options(STREAM_OPTIONS),
          null_default=True, show="none"),
    Field("seed", "integer", "the sampling seed (streamlab's own: the Responses API has none)", None, 0, 2**63 - 1,
          null_default=True, show="random: a new answer each time"),
    Field("text", "object", "`format` `{\"type\": \"text\"}` only", None, parse=_text_format, null_default=True,
          show="none"),
    Field("tools", "list", "refused (400) unless empty: this server reads and writes text only", None,
          parse=_refused("it reads and writes text only"), null_default=True, show="none"),
    Field("previous_response_id", "string", "refused: this server keeps no responses to continue; send the"
          " conversation in `input`", None, parse=_refused("it keeps no responses; send the conversation in input"),
          null_default=True, show="none"),
    Field("background", "boolean", "refused when true: a response here streams or answers while you wait (a"
          " resumable one is `POST /generations`)", False, parse=_refused("use POST /generations for an answer that"
                                                                          " outlives its connection"),
          null_default=True),
    Field("top_logprobs", "integer", "refused unless 0: no log probabilities here", None,
          parse=_refused("no log probabilities here"), null_default=True, show="none"),
    ignored=("store", "metadata", "user", "service_tier", "parallel_tool_calls", "tool_choice", "truncation",
             "reasoning", "include", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
             "max_tool_calls", "prompt", "conversation"),
)


def parse_request(body: bytes | str) -> GenerationRequest:
    """A Responses request: ``input`` read as a transcript, ``instructions`` first, OpenAI's defaults."""
    values, ignored = RESPONSES.read(json_object(body))
    messages = values["input"]
    if values["instructions"]:
        messages = ({"role": "system", "content": values["instructions"]}, *messages)
    return GenerationRequest(
        prompt=last_user_text(messages),
        messages=messages,
        max_tokens=values["max_output_tokens"] or DEFAULT_MAX_TOKENS,
        seed=secrets.randbits(63) if values["seed"] is None else values["seed"],
        temperature=values["temperature"],
        top_p=values["top_p"],
        stream=values["stream"],
        include_obfuscation=values["stream_options"].include_obfuscation,
        model=values["model"],
        ignored=ignored,
    )


class ResponseFormat(Format):
    """One response's typed events, numbered in the order they are written; one message with one text part."""

    def __init__(self, model: str, req: GenerationRequest) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.model = model
        self.req = req
        self.sequence = 0
        self.created = False  # whether response.created has gone out (in line, it goes first)

    def _event(self, kind: str, **fields: Any) -> Event:
        event = Event({"type": kind, "sequence_number": self.sequence, **fields}, kind)
        self.sequence += 1
        return event

    def response(self, status: str, output: list | None = None, usage: dict | None = None, *,
                 error: dict | None = None, incomplete: str | None = None) -> dict:
        """The response object as the events carry it, and as the whole answer is."""
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": output or [], "usage": usage, "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": None, "max_output_tokens": self.req.max_tokens, "temperature": self.req.temperature,
            "top_p": self.req.top_p, "parallel_tool_calls": False, "tool_choice": "none", "tools": [],
            "text": {"format": {"type": "text"}}, "metadata": {},
        }

    def _part(self, text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, status: str, text: str | None) -> dict:
        content = [] if text is None else [self._part(text)]
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant", "content": content}

    @staticmethod
    def _usage(job: Job) -> dict:
        record = job.record
        return {"input_tokens": record.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": record.tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": record.prompt_tokens + record.tokens}

    def queued(self, ahead: int) -> list[Event]:
        if self.created:
            return []  # the API has no word for a place that moves: keep-alives until the turn comes
        self.created = True
        queued = self.response("queued")
        return [self._event("response.created", response=queued), self._event("response.queued", response=queued)]

    def unserved(self, ticket: Ticket) -> list[Event]:
        failure = {"code": "server_error", "message": "the server is shutting down; this request's turn never came"}
        return [self._event("response.failed", response=self.response("failed", error=failure))]

    def opening(self, job: Job) -> list[Event]:
        events = [] if self.created else [self._event("response.created", response=self.response("in_progress"))]
        self.created = True
        return [*events, self._event("response.in_progress", response=self.response("in_progress")),
                self._event("response.output_item.added", output_index=0, item=self._item("in_progress", None)),
                self._event("response.content_part.added", item_id=self.item_id, output_index=0, content_index=0,
                            part=self._part(""))]

    def piece(self, text: str) -> Event:
        filler = {"obfuscation": obfuscation()} if self.req.include_obfuscation else {}
        return self._event("response.output_text.delta", item_id=self.item_id, output_index=0, content_index=0,
                           delta=text, logprobs=[], **filler)

    def _final(self, job: Job) -> tuple[dict, dict]:
        """The finished message and the final response (``completed`` or ``incomplete``), as both endings give them."""
        result = job.generation.result
        status = STATUSES[result.stop_reason]
        item = self._item("completed" if status == "completed" else "incomplete", result.text)
        return item, self.response(status, [item], self._usage(job), incomplete=INCOMPLETE.get(result.stop_reason))

    def ending(self, job: Job) -> list[Event]:
        failure = self.failure(job, STATUSES)
        if failure is not None:
            failed = self.response("failed", error={"code": "server_error", "message": failure},
                                   usage=self._usage(job))
            return [self._event("response.failed", response=failed)]
        text = job.generation.result.text
        item, final = self._final(job)
        return [
            self._event("response.output_text.done", item_id=self.item_id, output_index=0, content_index=0,
                        text=text, logprobs=[]),
            self._event("response.content_part.done", item_id=self.item_id, output_index=0, content_index=0,
                        part=self._part(text)),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event(f"response.{final['status']}", response=final),
        ]

    def whole(self, job: Job) -> tuple[int, Any]:
        failure = self.failure(job, STATUSES)
        if failure is not None:
            return 500, error(500, failure)
        return 200, self._final(job)[1]
