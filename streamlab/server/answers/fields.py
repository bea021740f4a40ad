"""A route's JSON fields declared once: the check that reads a request body, and the table in docs/server.md.

A field the server does not know is refused, not skipped: ``{"max_token": 3}``
(one letter short) would otherwise be a full-length answer with no word of
why. The refusal names the field and the nearest one the route knows. The
OpenAI and Anthropic routes take their APIs' own fields, so a client written
for the real service works here: those this server has no use for are
declared ``ignored``, accepted, and named back to the client in an
``X-Ignored-Fields`` header.

    STREAM = Schema("POST /stream", Field("prompt", "string", "what to answer", required=True), ...)
    values, ignored = STREAM.read(obj)     # {"prompt": ..., "max_tokens": 100, ...}, ("user",)
    STREAM.markdown()                      # | `prompt` | string | required | what to answer |
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamlab.protocol.http_fields import HTTPError

REQUIRED: Any = object()  # a field with no default: absent is a 400


def bad(message: str) -> HTTPError:
    return HTTPError(400, message)


def _integer(field: Field, value: Any) -> int:
    # bool is a subclass of int in Python, but `true` is not a number in JSON.
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{field.name} must be an integer, got {type(value).__name__}")
    if not field.low <= value <= field.high:
        raise bad(f"{field.name} must be between {field.low} and {field.high}, got {value}")
    return value


def _number(field: Field, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"{field.name} must be a number, got {type(value).__name__}")
    low, high = field.low, field.high
    if not (low < value if field.low_open else low <= value) or value > high:
        interval = f"({low}, {high}]" if field.low_open else f"[{low}, {high}]"
        raise bad(f"{field.name} must be in {interval}, got {value}")
    return float(value)


def _boolean(field: Field, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad(f"{field.name} must be true or false, got {type(value).__name__}")
    return value


def _object(field: Field, value: Any) -> dict:
    if not isinstance(value, dict):
        raise bad(f"{field.name} must be an object")
    return value


def _any(field: Field, value: Any) -> Any:
    return value


# What each kind of field accepts; a field with ``parse`` checks its value itself.
KINDS: dict[str, Callable[[Any, Any], Any]] = {
    "integer": _integer, "number": _number, "boolean": _boolean, "object": _object, "any": _any,
}


@dataclass(frozen=True)
class Field:
    """One JSON field: its name, its kind (how it is checked, and what the docs call it), default and help.

    ``kind`` is one of :data:`KINDS`, or any word when ``parse`` checks the
    value (``parse(value, name)`` returns it, or raises a 400 naming ``name``).
    ``low``/``high`` bound a number (``low_open``: ``low`` itself is out).
    ``null_default``: an explicit ``null`` means the default, as the OpenAI
    and Anthropic APIs read it; elsewhere ``null`` is a value of the wrong kind.
    ``show`` writes the default for the docs when its value says too little.
    """

    name: str
    kind: str
    help: str
    default: Any = None
    low: float = 0
    high: float = 0
    low_open: bool = False
    parse: Callable[[Any, str], Any] | None = None
    null_default: bool = False
    show: str | None = None

    def read(self, obj: dict) -> Any:
        """This field's value in ``obj``: checked, or its default when absent; a 400 naming it otherwise."""
        if self.name not in obj or (obj[self.name] is None and self.null_default):
            if self.default is REQUIRED:
                raise bad(f"{self.name} is required")
            return self.default
        value = obj[self.name]
        return self.parse(value, self.name) if self.parse is not None else KINDS[self.kind](self, value)

    def kind_shown(self) -> str:
        if self.kind in ("integer", "number") and (self.low or self.high):
            left = "(" if self.low_open else "["
            return f"{self.kind} in {left}{_plain(self.low)}, {_plain(self.high)}]"
        return self.kind

    def default_shown(self) -> str:
        if self.show is not None:
            return self.show
        if self.default is REQUIRED:
            return "required"
        if self.default is None:
            return "none"
        return f"`{_plain(self.default)}`"


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == 2**63 - 1:
        return "2^63 − 1"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def nearest(name: str, known: list[str]) -> str | None:
    """The known field closest in spelling to ``name`` (``max_token`` → ``max_tokens``), if one is close."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return close[0] if close else None


class Schema:
    """The fields one route (or one WebSocket message) takes, in the order the docs list them."""

    def __init__(self, title: str, *fields: Field, ignored: tuple[str, ...] = (), note: str = "") -> None:
        self.title = title  # "POST /stream": who refuses, in the refusal and in the docs
        self.fields = fields
        self.ignored = ignored  # the API's own fields this server accepts and does nothing with
        self.note = note
        self.known = [f.name for f in fields] + list(ignored)
        self._by_name = {f.name: f for f in fields}

    def __getitem__(self, name: str) -> Field:
        return self._by_name[name]

    def check(self, obj: dict) -> tuple[str, ...]:
        """Refuse a field the route does not know (400, naming it and the nearest known); the ignored ones given."""
        unknown = [key for key in obj if key not in self._by_name and key not in self.ignored]
        if unknown:
            key = unknown[0]
            near = nearest(key, self.known)
            hint = f"did you mean {near!r}?" if near else "the fields it takes: " + ", ".join(self.known)
            more = f" ({len(unknown) - 1} more unknown)" if len(unknown) > 1 else ""
            raise bad(f"unknown field {key!r}: {hint}{more}")
        return tuple(key for key in obj if key in self.ignored)

    def read(self, obj: dict) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Every declared field's value (checked, or its default) and the ignored fields the body held."""
        ignored = self.check(obj)
        return {f.name: f.read(obj) for f in self.fields}, ignored

    def markdown(self) -> str:
        """The route's fields as a Markdown table: what the docs show, made from this declaration."""
        rows = [f"#### {self.title}", ""]
        if self.note:
            rows += [self.note, ""]
        rows += ["| Field | Type | Default | What it does |", "|---|---|---|---|"]
        rows += [f"| `{f.name}` | {f.kind_shown()} | {f.default_shown()} | {_cell(f.help)} |" for f in self.fields]
        if self.ignored:
            rows += ["", "Accepted and ignored (named back in `X-Ignored-Fields`): "
                     + ", ".join(f"`{name}`" for name in self.ignored) + "."]
        return "\n".join(rows) + "\n"


def ignored_header(names: tuple[str, ...]) -> list[tuple[str, str]]:
    """``X-Ignored-Fields: user, metadata``: what the client sent that changed nothing (none: no header)."""
    return [("X-Ignored-Fields", ", ".join(names))] if names else []
