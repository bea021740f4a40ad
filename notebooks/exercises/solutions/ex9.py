"""Exercise 9, a model answer: the Host, Origin and Content-Type checks.

Names are compared whole, after dropping the port and lowercasing: a prefix
test would let ``127.0.0.1.evil.example`` in. An origin is compared whole
too, scheme and port included, since another port is another origin.
"""

NAMES = ("127.0.0.1", "localhost", "[::1]")


def _name(host):
    """``LocalHost:8000`` -> ``localhost``; ``[::1]:8000`` -> ``[::1]``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


def check_host(host, port):
    if host is None:
        return 400
    return None if _name(host) in NAMES else 403


def check_origin(origin, port):
    if origin is None:
        return None
    own = {f"http://{name}:{port}" for name in NAMES}
    return None if origin.strip().lower().rstrip("/") in own else 403


def check_content_type(value):
    media = (value or "").split(";", 1)[0].strip().lower()
    return None if media == "application/json" else 415
