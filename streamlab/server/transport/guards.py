"""Who may talk to a model server on localhost: the Host, Origin and Content-Type checks.

A server on 127.0.0.1 feels private, but every web page the user opens can
send it requests. Three doors, three checks (Ollama's CVE-2024-28224 was the
first one left open):

- **DNS rebinding.** A page at ``evil.example`` points its own name at
  127.0.0.1; the browser then treats our responses as same-origin *to the
  page* and lets it read them. Only the ``Host`` header gives it away: refuse
  any name not on the allow-list, on every route.
- **Simple requests.** A form, or ``fetch`` with ``Content-Type: text/plain``,
  is sent cross-site without asking (no CORS preflight): the page cannot read
  the answer, but the model runs and the store fills. Requiring
  ``application/json`` forces a preflight, which this server never grants.
- **Origin.** A browser names the page that sends a POST or opens a WebSocket
  (which CORS does not cover at all). It must be this server's own origin
  (scheme, host *and port*: another port is another origin) or one allowed
  by a flag. Comparing Origin with Host is not enough: under rebinding both
  say the attacker's name.

Requests without an Origin come from programs (curl, scripts), which could
send any Origin they like: the check protects browsers' users, not the server.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import Request
from streamlab.server.config import LOOPBACK_HOSTS, flag


def host_name(value: str) -> str:
    """``127.0.0.1:8000`` → ``127.0.0.1``; ``[::1]:8000`` → ``[::1]``; lowercased, port dropped."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if ":" in value else value


class Guards:
    """The allow-lists of one server, fixed at start: names it answers to, origins it serves."""

    def __init__(self, port: int, allowed_hosts: tuple[str, ...] = (), allowed_origins: tuple[str, ...] = ()):
        self.hosts = frozenset(LOOPBACK_HOSTS) | {host_name(h) for h in allowed_hosts}
        own = {f"http://{name}:{port}" for name in self.hosts}
        self.origins = frozenset(own | {o.rstrip("/").lower() for o in allowed_origins})

    def check_host(self, request: Request) -> None:
        """403 unless ``Host`` names this server (HTTP/1.1 requires the header: 400 without it)."""
        value = request.header("host")
        if value is None:
            if request.version == "HTTP/1.1":
                raise HTTPError(400, "an HTTP/1.1 request needs a Host header")
            return
        if host_name(value) not in self.hosts:
            raise HTTPError(403, f"Host {value!r} is not one of this server's names: to answer it, start the"
                            f" server with {flag('allowed_hosts')} {host_name(value)}")

    def check_origin(self, request: Request) -> None:
        """403 when a browser says the request comes from a page of another origin."""
        origin = request.header("origin")
        if origin is None:
            return
        parts = urlsplit(origin.strip().lower())
        if parts.scheme not in ("http", "https") or not parts.netloc:  # 'null' (a sandboxed page), a file: URL
            raise HTTPError(403, f"origin {origin!r} is not allowed, and cannot be ({flag('allowed_origins')} takes"
                            " http(s) origins only)")
        if f"{parts.scheme}://{parts.netloc}" not in self.origins:
            raise HTTPError(403, f"origin {origin!r} is not allowed: to accept it, start the server with"
                            f" {flag('allowed_origins')} {parts.scheme}://{parts.netloc}")

    @staticmethod
    def check_json(request: Request) -> None:
        """415 unless the POST says ``application/json``: what a form or a preflight-free fetch cannot send."""
        media = (request.header("content-type") or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise HTTPError(415, f"POST needs Content-Type: application/json, got {media or 'none'!r}")
