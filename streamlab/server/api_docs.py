"""docs/server.md's tables of routes and request fields, made from the declarations the server runs on.

``python -m streamlab.book.doc_tables docs/server.md`` rewrites what stands
between ``<!-- routes: streamlab.server.api_docs -->`` (and ``fields:``) and
its closing marker; ``tests/test_docs.py`` fails when the page is stale, so a
route or a field added to the code and not to the page cannot land.
"""

from __future__ import annotations

from streamlab.server.wire import anthropic_api, openai_api, responses_api
from streamlab.server.answers import requests
from streamlab.server.app import ROUTES, Server
from streamlab.server.answers.fields import Schema

# The fields each generating route reads (the others take no body, or an empty one).
ROUTE_FIELDS: dict[str, Schema] = {
    "/complete": requests.STREAM, "/stream": requests.STREAM, "/generations": requests.STREAM,
    "/ws": requests.WS_MESSAGE, "/v1/chat/completions": openai_api.CHAT_COMPLETIONS,
    "/v1/messages": anthropic_api.MESSAGES, "/v1/responses": responses_api.RESPONSES,
}
SCHEMAS: tuple[Schema, ...] = (requests.STREAM, requests.WS_MESSAGE, openai_api.CHAT_COMPLETIONS,
                               anthropic_api.MESSAGES, responses_api.RESPONSES)


def _said(handler: str) -> str:
    """What a handler's docstring says its route does: its first line, after the route it names."""
    first = (getattr(Server, handler).__doc__ or "").strip().splitlines()[0]
    said = first.split(": ", 1)[1] if ": " in first else first
    return said.replace("``", "`")


def routes_markdown() -> str:
    rows = ["| Route | What it does | Fields |", "|---|---|---|"]
    for path, methods in ROUTES:
        for method, handler in methods.items():
            schema = ROUTE_FIELDS.get(path)
            fields = f"[{schema.title}](#{_anchor(schema.title)})" if schema is not None else ""
            rows.append(f"| `{method} {path}` | {_said(handler)} | {fields} |")
    return "\n".join(rows) + "\n"


def _anchor(title: str) -> str:
    """The id GitHub gives a heading: lower case, spaces to dashes, other punctuation dropped."""
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def fields_markdown() -> str:
    return "\n".join(schema.markdown() for schema in SCHEMAS)
