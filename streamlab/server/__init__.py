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

Its wings, along a request's path, each importing only those before it
(``tests/test_layers.py`` checks it):

    config.py        every limit as a named default, and the command line (every wing reads it)
    store/           SQLite: conversations, partial answers, their stop reasons, who owns a streaming one
      database.py      the Store; schema.py its tables and migrations; answers.py an answer written as it
                       streams; file.py opening the file (a folder, not writable, not SQLite: one line)
    transport/       one connection: reads with deadlines, writes with a timeout, whole responses, static files,
      connection.py    the guards at the door (guards.py), an SSE event (events.py) and the one SSE response
      responses.py     every SSE route uses (streams.py)
    answers/         what a request may ask (requests.py, each route's fields.py), the line at the door and the
      jobs.py          record (jobs.py), the one Answer every transport runs (answer.py), where tokens come
      answer.py        from (sources.py: the model, an upstream read by upstream.py, scripted.py's script),
                       and a keep-alive in a silence (silence.py)
    wire/            how each API spells an answer: formats.py (streamlab's own, and the payloads), openai_api.py,
                     anthropic_api.py, deliveries.py (an answer as SSE or one JSON body), websocket_session.py
    resources/       answers that outlive a connection: resumable.py (/generations in memory), shared_log.py
                     (in Redis, for many replicas), worker.py (python -m streamlab worker)
    app.py           the route table and thin handlers; queues.py /debug/queues; api_docs.py the docs' tables
    command.py       serve() and main(): python -m streamlab serve [--upstream URL]

    python -m streamlab serve --port 8000
"""
