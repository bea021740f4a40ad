"""``Event``: one Server-Sent Event as a route hands it over, before any stream frames it.

It has a module of its own because two sides meet on it and neither may
import the other: a ``Format`` (``formats.py`` and the API modules) makes
events, and ``EventStream`` (``streams.py``) sends them. Both import this.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from streamlab.protocol import sse

# ensure_ascii=False: "é" travels as 2 UTF-8 bytes, not as the 6 of "\u00e9". One encoder, made once:
# json.dumps with any option makes a new JSONEncoder on every call, a few µs for every event.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def dumps(obj: Any) -> str:
    return _ENCODER.encode(obj)


@dataclass(frozen=True)
class Event:
    """One event to send: ``data`` as JSON (a ``str`` as it is), an event name, an ``id:`` and a ``retry:``."""

    data: Any
    name: str = "message"
    id: int | None = None
    retry: int | None = None

    def encode(self) -> bytes:
        data = self.data if isinstance(self.data, str) else dumps(self.data)
        event = None if self.name == "message" else self.name
        return sse.encode_event(data, event=event, id=None if self.id is None else str(self.id), retry=self.retry)
