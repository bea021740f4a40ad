"""What a client may ask for: a generation request parsed and validated, with no I/O.

Strict because a loose server teaches clients bad habits: ``"max_tokens":
"100"`` or ``true`` would work here and break elsewhere. And bounded, because
the body comes from a stranger: JSON nested thousands deep would exhaust the
parser's stack, and a prompt is measured in the model's own unit, tokens,
against the model's context window.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from streamlab.protocol.http_head import Request
from streamlab.server.config import MAX_JSON_DEPTH
from streamlab.server.answers.fields import REQUIRED, Field, Schema, bad


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request body (``/complete``, ``/stream``, ``/generations``, or a WebSocket message)."""

    prompt: str
    max_tokens: int = 100
    seed: int = 0
    chat: bool = True
    ignore_eos: bool = False
    temperature: float = 0.7
    top_p: float = 0.9
    keep_open: bool = False  # /ws only: after "done", wait for another request instead of closing
    conversation_id: str | None = None  # continue this conversation (None: start a new one)
    # The OpenAI and Anthropic routes send a whole transcript; ``prompt`` is then its last user message.
    messages: tuple[dict[str, str], ...] | None = None
    stop: tuple[str, ...] = ()  # stop sequences
    stream: bool = True  # the /v1 routes answer whole when false
    include_usage: bool = False  # OpenAI's stream_options.include_usage
    include_obfuscation: bool = False  # OpenAI's stream_options.include_obfuscation: filler in each delta
    model: str | None = None  # the model the client named (the response names the one we have)
    ignored: tuple[str, ...] = ()  # the API's fields the client sent that this server does nothing with


def _refuse_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity, which are not JSON.
    raise bad(f"{name} is not valid JSON")


# A JSON string (its escapes skipped; an unterminated one runs to the end) or one bracket.
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.S)


def json_depth(text: str, give_up_past: int | None = None) -> int:
    """How deeply brackets nest, ignoring those inside strings: checked before ``json.loads`` recurses.

    The regular expression steps over each string in one match, in C, so a
    long prompt costs microseconds; only brackets come back to Python. With
    ``give_up_past``, counting stops as soon as the depth passes it.
    """
    depth = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        char = text[match.start()]
        if char == '"':
            continue
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if give_up_past is not None and deepest > give_up_past:
                    break
        else:
            depth -= 1
    return deepest


def load_json(body: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON from a stranger: UTF-8, no NaN, nested at most ``max_depth`` deep, else 400."""
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            raise bad("the body is not UTF-8") from None
    if ("[" in body or "{" in body) and json_depth(body, give_up_past=max_depth) > max_depth:
        raise bad(f"the JSON is nested more than {max_depth} deep")
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise bad(f"the body is not valid JSON: {exc}") from None


def json_object(body: bytes | str) -> dict:
    """A request body that must be one JSON object (every generation route's): 400 otherwise."""
    obj = load_json(body)
    if not isinstance(obj, dict):
        raise bad(f"the request must be a JSON object, got {type(obj).__name__}")
    return obj


def text_field(value: Any, name: str, *, empty: bool = False) -> str:
    """A string of real Unicode (non-empty unless ``empty``); lengths are checked later, in tokens."""
    if value is None:
        raise bad(f"{name} is required")
    if not isinstance(value, str):
        raise bad(f"{name} must be a string, got {type(value).__name__}")
    if not value and not empty:
        raise bad(f"{name} must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # JSON may spell a lone surrogate: "\ud800"
        raise bad(f"{name} contains a lone surrogate, which is not Unicode text") from None
    return value


MAX_STOP_SEQUENCES = 16


def stop_field(value: Any, name: str, *, most: int = MAX_STOP_SEQUENCES) -> tuple[str, ...]:
    """Stop sequences: absent, one string, or a list of at most ``most`` non-empty strings."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > most:
        raise bad(f"{name} must be a string or a list of at most {most} strings")
    return tuple(text_field(item, f"{name}[{i}]") for i, item in enumerate(items))


def content_text(content: Any, name: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's content: a string, or a list of text parts (``{"type": "text", "text": ...}``) joined.

    ``kinds``: the part types that hold text in the API (the Responses API's are ``input_text`` and an earlier
    answer's ``output_text``).
    """
    if isinstance(content, str):
        return text_field(content, name, empty=True)
    if not isinstance(content, list):
        raise bad(f"{name} must be a string or a list of {kinds[0]} parts")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in kinds:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad(f"{name}[{i}] is a {kind!r} part: this server reads text only")
        texts.append(text_field(part.get("text"), f"{name}[{i}].text", empty=True))
    return "".join(texts)


def transcript(messages: Any, roles: dict[str, str], name: str = "messages", *, kinds: tuple[str, ...] = ("text",),
               item_type: str | None = None) -> tuple[dict[str, str], ...]:
    """A conversation sent whole, as ``{"role", "content"}`` dicts; ``roles`` maps the API's names to ours.

    It must hold at least one user message: the last one is what the turn stores. ``kinds`` are the text
    parts its content may hold; ``item_type``, where the API types its items (the Responses API's
    ``message``), the only type read (an item without one is taken for it).
    """
    if not isinstance(messages, list) or not messages:
        raise bad(f"{name} must be a non-empty list of messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad(f"{name}[{i}] must be an object")
        if item_type is not None and message.get("type", item_type) != item_type:
            raise bad(f"{name}[{i}] is a {message.get('type')!r} item: this server reads {item_type}s only")
        role = message.get("role")
        if role not in roles:
            raise bad(f"{name}[{i}].role must be one of {', '.join(sorted(roles))}, got {role!r}")
        out.append({"role": roles[role],
                    "content": content_text(message.get("content"), f"{name}[{i}].content", kinds)})
    if not any(m["role"] == "user" for m in out):
        raise bad(f"{name} must hold at least one user message")
    return tuple(out)


def last_user_text(messages: tuple[dict[str, str], ...]) -> str:
    """What the turn stores as the user's message: the last user message of a transcript."""
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def any_text(value: Any, name: str) -> str:
    """A string, empty or not (a ``model`` name: any is served by the model this server has)."""
    return text_field(value, name, empty=True)


def _conversation_id(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", value):
        raise bad(f"{name} must be an id returned by this server")
    return value


_OURS = (
    Field("prompt", "string", "what to answer (with `chat`, the user's message)", REQUIRED,
          parse=lambda value, name: text_field(value, name)),
    Field("max_tokens", "integer", "the most tokens to generate", 100, 1, 4096),
    Field("seed", "integer", "the sampling seed: the same seed, the same answer", 0, 0, 2**63 - 1),
    Field("chat", "boolean", "read the prompt through the model's chat template", True),
    Field("ignore_eos", "boolean", "generate past the end-of-answer token, to exactly `max_tokens`", False),
    Field("temperature", "number", "sampling temperature (0: greedy)", 0.7, 0.0, 2.0),
    Field("top_p", "number", "nucleus sampling: the smallest set of tokens holding this much probability", 0.9,
          0.0, 1.0, low_open=True),
    Field("stop", "string or list of strings", f"stop sequences (at most {MAX_STOP_SEQUENCES}): the answer ends"
          " before the first one", (), parse=stop_field, show="none"),
    Field("conversation_id", "string", "continue this conversation (an id this server returned)", None,
          parse=_conversation_id),
)
STREAM = Schema("POST /stream, /complete, /generations", *_OURS)
WS_MESSAGE = Schema("a /ws request message", *_OURS, Field(
    "keep_open", "boolean", "after `done`, wait on the same socket for another request instead of closing", False),
    note="Sent as one text frame; while an answer streams, `{\"stop\": true}` stops it.")
SCHEMAS = (STREAM, WS_MESSAGE)


def parse_generation_request(body: bytes | str, schema: Schema = STREAM) -> GenerationRequest:
    """Validate a request strictly; raise ``HTTPError(400)`` with a message that names the field.

    A field the route does not know is refused too, naming the nearest one it
    does: a typo (``max_token``) must not pass for a request that says nothing.
    """
    values, _ = schema.read(json_object(body))
    return GenerationRequest(**values)


def last_event_id(request: Request) -> int | None:
    """The ``Last-Event-ID`` of a reconnecting ``EventSource``: None when absent or not one of ours.

    A value we never sent (not a plain number) is treated as absent, so the
    reader gets the whole stream again rather than an error it cannot act on.
    """
    value = (request.header("last-event-id") or "").strip()
    return int(value) if re.fullmatch(r"[0-9]{1,18}", value) else None
