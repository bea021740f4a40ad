"""Whole responses (JSON, files, no content) and whether the connection outlives them.

The keep-alive decision lives here once: the connection stays open when the
request allows it, and a response after which we close says
``Connection: close``, so that a pooled client never sends its next request
down a connection we are closing. A ``HEAD`` gets the same head as a ``GET``
and no body.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import Request, error_response, json_response, response_head
from streamlab.server.transport.connection import ClientConnection
from streamlab.net.serving import ClientGone

STATIC = Path(__file__).resolve().parents[2] / "static"  # streamlab/static
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
STATIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a plain file name: no slash, no leading dot


class Refused(HTTPError):
    """An ``HTTPError`` whose response carries headers of its own (``Allow`` on a 405, ``Retry-After`` on a 503)."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(status, message)
        self.headers = list(headers)


async def respond(
    client: ClientConnection,
    request: Request,
    body: bytes | None,
    *,
    status: int = 200,
    content_type: str = "application/json",
    headers: Iterable[tuple[str, str]] = (),
) -> bool:
    """Send one response with a ``Content-Length`` (``body`` None: none, as a 204); return keep-alive."""
    keep_alive = request.keep_alive()
    items = list(headers)
    if body is not None:
        items.insert(0, ("Content-Type", content_type))
    if not keep_alive:
        items.append(("Connection", "close"))
    head = response_head(status, items, content_length=None if body is None else len(body))
    await client.send(head if body is None or request.method == "HEAD" else head + body)
    return keep_alive


async def respond_json(
    client: ClientConnection, request: Request, obj: Any, headers: Iterable[tuple[str, str]] = (), *, status: int = 200
) -> bool:
    # ensure_ascii=False: "é" travels as 2 UTF-8 bytes, not as the 6 of "\u00e9".
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    return await respond(client, request, body, status=status, headers=headers)


ErrorBody = Callable[[int, str], Any]


async def refuse(client: ClientConnection, status: int, message: str, headers: Any = (),
                 error_body: ErrorBody | None = None, *, head_only: bool = False) -> None:
    """A JSON error, then a lingering close; once a response has started, an error can only cut it.

    ``error_body`` writes the body in the route's API (OpenAI's and Anthropic's
    SDKs read their own shapes); streamlab's own is the default. The answer
    to a ``HEAD`` (``head_only``) is the same head with no body.
    """
    if not client.responding:
        if error_body is None:
            response = error_response(status, message, headers)
        else:
            response = json_response(status, error_body(status, message), [("Connection", "close"), *headers])
        if head_only:
            response = response[: response.index(b"\r\n\r\n") + 4]
        try:
            await client.send(response)
        except ClientGone:
            pass
    await client.linger_and_close()


def static_file(*parts: str, folder: Path | None = None) -> tuple[bytes, str]:
    """A file of the static folder, and nothing outside it: ``(body, content type)``, else 404.

    The routes already refuse a ``/`` inside a part (``%2F`` too: the path is
    decoded before matching). Each part must also be a plain name (no
    ``..``, no hidden file, no NUL or other control character), checked
    before the file system is asked anything; the file of a known type; and
    still inside the folder once symbolic links are followed.
    """
    folder = folder or STATIC
    missing = HTTPError(404, f"no file {'/'.join(parts)!r}")
    if not all(STATIC_NAME.fullmatch(part) and ".." not in part for part in parts):
        raise missing
    path = folder.joinpath(*parts)
    content_type = STATIC_TYPES.get(path.suffix.lower())
    if content_type is None or not path.is_file() or folder.resolve() not in path.resolve().parents:
        raise missing
    return path.read_bytes(), content_type
