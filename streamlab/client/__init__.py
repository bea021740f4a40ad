"""The reader's side: a raw-socket client that times every byte and event, the trace it fills, and the metrics read from it.

    timed.py            POST /complete, /stream, the OpenAI and Anthropic routes, GET events, resume, fetch
    event_source.py     an EventSource: reconnects after every drop with Last-Event-ID, until a 204 or a failure
    timed_websocket.py  the same conversation over a WebSocket
    wire.py             connecting, reading with a deadline, the request's bytes
    tracing.py          the Trace (what a reader observed, with times) and the recorders that fill it
    metrics.py          first text, gaps, time per token, reading speed

``from streamlab.client import timed`` gives the client's calls (``timed.stream_sync(port, prompt)``);
each has a ``*_sync`` twin for scripts and notebooks.
"""

