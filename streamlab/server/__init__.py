"""The model server: ``/complete``, ``/stream`` (SSE), ``/ws`` (WebSocket), ``/generations``; bare asyncio.

No web framework: the lesson is the protocol written out. Every byte of
protocol comes from the sans-IO modules of ``streamlab.protocol`` (``http_head``, ``sse``, ``websocket``);
this package is the glue that reads from sockets, writes to them, and decides
what to do when a reader goes away, and what to refuse from a stranger.

Generating costs compute for every token, so a server should stop as soon as
nobody is reading. How does it know?

- **Watching** (the default): while a response is produced, a task keeps
  reading the connection. For HTTP, a read that returns ``b""`` (EOF) means
  the client closed its end; for a WebSocket, a close frame, a
  ``{"stop": true}`` message or EOF. The generation is stopped within a token.
- **Naive** (``--naive``): nobody reads. The server learns nothing until a
  write fails, and even then it keeps generating to the end, for nobody.
- **Write timeout** (both): a reader that vanished without a word (a phone
  that lost its signal) sends no EOF; only a write that cannot drain for
  ``--write-timeout`` seconds reveals it.

Every answer is written to a SQLite ``Store`` as it is sent (``--db``), and
``/generations`` makes an answer a resource that outlives its connection
(``Last-Event-ID`` resume, ``--grace``, ``--forget`` as the contrast).

The modules, each one thing:

    config.py             every limit as a named default, and the command line
    connection.py         a client connection: reads with deadlines, writes with a timeout; serve until signalled
    requests.py           a generation request parsed and validated (pure)
    guards.py             Host allow-list, Origin, Content-Type: who may talk to us
    jobs.py               turns, admission and the line of waiting readers, generations, the /log, the stop vocabulary applied
    silence.py            Silence: a source's pieces, or a keep-alive when it has been quiet too long
    events.py             Event: one SSE event, what a Format makes and an EventStream sends
    streams.py            EventStream: the one SSE response every SSE route uses
    responses.py          whole responses, keep-alive, HEAD, static files
    resumable.py          /generations: runs whose events are kept (or, with --forget, not), grace
    shared_log.py         /generations in Redis (serve --events URL): one event log and job queue for every replica
    worker.py             python -m streamlab worker: takes jobs from Redis, generates, appends the pieces
    websocket_session.py  one WebSocket conversation with an explicit state
    formats.py            Format: how an API spells a beginning, a piece, a silence, an end; streamlab's own
    openai_api.py         OpenAI's Chat Completions (/v1/chat/completions, /v1/models) as a Format
    anthropic_api.py      Anthropic's Messages (/v1/messages) as a Format
    sources.py            where tokens come from: the local model, or an OpenAI-compatible upstream
    upstream.py           one streamed chat completion read from an upstream, stoppable mid-stream
    queues.py             /debug/queues: the bytes waiting, per connection and generation, handed in by app
    app.py                the route table and thin handlers
    command.py            serve() and main(): python -m streamlab serve [--upstream URL]
    store.py              SQLite: conversations, partial answers, their stop reasons, who owns a streaming one
    store_schema.py       the file's tables, their migrations, the rows read back
    store_answers.py      an answer written as it streams, every answer's tick flushed in one transaction
    store_file.py         opening the file: a path that is a folder, not writable or not SQLite is one line

    python -m streamlab serve --port 8000
"""

from __future__ import annotations

from streamlab.server.app import Route, Server
from streamlab.server.command import main, serve
from streamlab.server.config import ServerConfig, config_from_args, parse_args
from streamlab.server.connection import ClientConnection, ClientGone, in_background, until_client_leaves
from streamlab.server.events import Event
from streamlab.server.jobs import Job, Jobs, LogRecord, Turn
from streamlab.server.requests import GenerationRequest, parse_generation_request
from streamlab.server.responses import STATIC
from streamlab.server.streams import EventStream

__all__ = [
    "ClientConnection",
    "ClientGone",
    "Event",
    "EventStream",
    "GenerationRequest",
    "Job",
    "Jobs",
    "LogRecord",
    "Route",
    "STATIC",
    "Server",
    "ServerConfig",
    "Turn",
    "config_from_args",
    "in_background",
    "main",
    "parse_args",
    "parse_generation_request",
    "serve",
    "until_client_leaves",
]
