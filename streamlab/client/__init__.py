"""The reader's side: a raw-socket client that times every byte and event, the trace it fills, and the metrics read from it.

    timed.py            POST /complete, /stream, the OpenAI and Anthropic routes, GET events, resume, fetch
    event_source.py     an EventSource: reconnects after every drop with Last-Event-ID, until a 204 or a failure
    timed_websocket.py  the same conversation over a WebSocket
    wire.py             connecting, reading with a deadline, the request's bytes
    tracing.py          the Trace (what a reader observed, with times) and the recorders that fill it
    metrics.py          first text, gaps, time per token, reading speed

``from streamlab import client`` gives the client's calls (``client.stream_sync(port, prompt)``);
each has a ``*_sync`` twin for scripts and notebooks.
"""

from __future__ import annotations

from streamlab.client.timed import *  # noqa: F403 - the client's calls, as client.stream_sync(...)
from streamlab.client.timed import __all__  # noqa: F401
