"""The server: a route table compiled once, guards in front of it, thin handlers behind it.

Each handler is ``async (client, request, **path_params) -> bool`` and
returns whether the connection may carry another request. What they share
lives in its own module: ``answer`` (one answer's steps, its generation's
life), ``jobs`` (the line at the door and the log), ``streams`` (the one SSE
response), ``resumable`` (``/generations``), ``websocket_session``,
``responses`` (whole responses and keep-alive), ``guards`` (Host, Origin,
Content-Type), ``connection`` (reads with deadlines, writes with a timeout).
"""

from __future__ import annotations

import asyncio
import re
import sys
import traceback
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from streamlab.net.errors import listen_error
from streamlab.protocol import websocket_handshake
from streamlab.protocol.http_fields import HTTPError
from streamlab.protocol.http_head import Request
from streamlab.server.store.schema import STREAMING
from streamlab.server.store.conversations import Conversations
from streamlab.server.store.database import Store
from streamlab.server.wire import anthropic_api, openai_api, responses_api
from streamlab.server import queues
from streamlab.server.transport import responses
from streamlab.server.config import RETRY_AFTER, ServerConfig
from streamlab.server.config import flag as config_flag
from streamlab.server.transport.connection import ClientConnection
from streamlab.net.serving import ClientGone
from streamlab.server.answers.sources import TokenSource, source_for
from streamlab.server.wire.formats import Format, StreamlabFormat, error_body
from streamlab.server.transport.guards import Guards
from streamlab.server.answers.answer import Answer, Job, title
from streamlab.server.wire.deliveries import EventDelivery, WholeDelivery
from streamlab.server.answers.jobs import Jobs, LogRecord
from streamlab.server.answers.requests import GenerationRequest, parse_generation_request
from streamlab.server.resources.resumable import GenerationRegistry, Registry
from streamlab.server.resources.shared_log import SharedRegistry
from streamlab.server.transport.streams import EventStream
from streamlab.server.wire.websocket_session import WebSocketSession

Handler = Callable[..., Awaitable[bool]]


class Route:
    """A path pattern compiled once (``/log/{id}`` → a regex with a named group) and its handlers by method."""

    def __init__(self, pattern: str, methods: dict[str, Handler]) -> None:
        parts = re.split(r"\{(\w+)\}", pattern)
        self.pattern = pattern
        self.regex = re.compile("".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts)))
        self.methods = dict(methods)
        if "GET" in self.methods:
            self.methods.setdefault("HEAD", self.methods["GET"])  # the same head, no body

    def match(self, path: str) -> dict[str, str] | None:
        found = self.regex.fullmatch(path)
        return None if found is None else found.groupdict()


def error_format(path: str) -> Any:
    """The error body a refusal on ``path`` is written in: the API's own under ``/v1/``, else ours."""
    if path.startswith("/v1/messages"):
        return anthropic_api.error
    if path.startswith("/v1/"):
        return openai_api.error
    return None


if TYPE_CHECKING:
    from streamlab.model.loading import LoadedModel

# Every route, declared once: the server's table, docs/server.md's and a 404's hint all read this.
# Each handler's docstring opens with its route and what it does (the docs' words).
ROUTES: tuple[tuple[str, dict[str, str]], ...] = (
    ("/complete", {"POST": "complete"}),
    ("/stream", {"POST": "stream"}),
    ("/v1/chat/completions", {"POST": "chat_completions"}),
    ("/v1/messages", {"POST": "messages"}),
    ("/v1/responses", {"POST": "responses"}),
    ("/v1/models", {"GET": "models"}),
    ("/ws", {"GET": "websocket"}),
    ("/log", {"GET": "get_log"}),
    ("/log/{id}", {"GET": "get_log_record"}),
    ("/health", {"GET": "health"}),
    ("/debug/queues", {"GET": "debug_queues"}),
    ("/generations", {"POST": "create_generation"}),
    ("/generations/{id}", {"GET": "get_generation"}),
    ("/generations/{id}/events", {"GET": "generation_events"}),
    ("/generations/{id}/cancel", {"POST": "cancel_generation"}),
    ("/conversations", {"GET": "get_conversations"}),
    ("/conversations/{id}", {"GET": "get_conversation"}),
    ("/", {"GET": "index"}),
    ("/static/{name}", {"GET": "static"}),
    ("/static/{folder}/{name}", {"GET": "static"}),
)


def not_found(path: str) -> HTTPError:
    """A 404 that says where to go: under ``/v1/``, the API routes this server does speak."""
    if path.startswith("/v1/"):
        spoken = ", ".join(p for p, _ in ROUTES if p.startswith("/v1/"))
        return HTTPError(404, f"no route for {path}: this server speaks {spoken}")
    return HTTPError(404, f"no route for {path}")


class Server:
    """Routes, generations and their log, behind one listening socket."""

    def __init__(self, lm: LoadedModel | TokenSource, config: ServerConfig | None = None) -> None:
        """``lm``: a loaded model (or a fake one), or a token source (``sources.UpstreamSource`` to relay)."""
        self.source = source_for(lm)
        self.config = config or ServerConfig()
        self.routes = [Route(path, {method: getattr(self, name) for method, name in methods.items()})
                       for path, methods in ROUTES]
        self._store: Store | None = None  # opened by start(), with jobs and the registry
        self.jobs: Jobs | None = None
        self.registry: GenerationRegistry | None = None  # this process's, or the replicas' in Redis
        self.guards = Guards(self.config.port, self.config.allowed_hosts, self.config.allowed_origins)
        self._connections: dict[asyncio.Task, ClientConnection] = {}
        self._listener: asyncio.AbstractServer | None = None
        self.port = 0  # the bound port once started (the kernel's pick for port 0)
        # The event loop start() ran on, once started: a caller in another thread (a test, a
        # notebook serving in process) runs coroutines there with run_coroutine_threadsafe.
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle -------------------------------------------------------------

    async def bind(self) -> int:
        """Bind the port, then open the store (closing what a crash left open); accept nothing yet. The port.

        What a user can get wrong at the command line (a port in use, a data
        folder that cannot hold the file) fails here, as a ``UserError``: the
        ``serve`` command binds before it loads a model, so a busy port costs
        a fraction of a second and leaves no database file behind.
        """
        if self._listener is not None:
            return self.port
        self.loop = asyncio.get_running_loop()
        host, port = self.config.host, self.config.port
        try:
            self._listener = await asyncio.start_server(self._on_connect, host, port, limit=65536,
                                                        backlog=self.config.backlog, start_serving=False)
        except OSError as err:
            told = listen_error(err, host, port)
            if told is None:
                raise
            raise told from err
        self.port = self._listener.sockets[0].getsockname()[1]
        self.guards = Guards(self.port, self.config.allowed_hosts, self.config.allowed_origins)
        try:
            self._store = Store(self.config.db_path, flush_interval=self.config.flush_interval)
        except BaseException:
            self._listener.close()
            self._listener = None
            raise
        recovered = self._store.recover_interrupted()
        # The operator's line: where the store is, and only when a crash left some, how many answers it marked.
        answers = "1 answer" if recovered == 1 else f"{recovered} answers"
        crashed = f": {answers} left streaming by a crash, marked interrupted" if recovered else ""
        print(f"streamlab: store {self._store.path}{crashed}", file=sys.stderr, flush=True)
        return self.port

    async def start(self, lm: Any = None) -> int:
        """Bind (unless ``bind`` did), start the source, then accept connections; return the port.

        ``lm``: the model, when it was loaded after ``bind`` (``Server(None)``, then ``start(lm)``).
        """
        if lm is not None:
            self.source = source_for(lm)
        await self.bind()
        assert self._listener is not None and self._store is not None
        await self.source.start()
        self.jobs = Jobs(self.source, self.config, self._store)
        # --events redis://...: the /generations of every replica in one shared log, generated by workers.
        self.registry = (await SharedRegistry.open(self.config.events, self.config, self.url) if self.config.events
                         else Registry(self.jobs, self.config))
        try:
            await self._listener.start_serving()
        except OSError as err:  # Linux lets two sockets bind one port with SO_REUSEADDR: the second to listen fails
            told = listen_error(err, self.config.host, self.config.port)
            if told is None:
                raise
            raise told from err
        return self.port

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def listening(self) -> bool:
        """Whether connections are accepted now: after start() has bound the port, until shutdown()."""
        return self._listener is not None and self._listener.is_serving()

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the server has not been started: no store is open")
        return self._store

    @property
    def conversations(self) -> Conversations:
        """Where the turns are: this server's file, or with ``--events`` the replicas' one store in Redis."""
        return self.jobs.store if self.jobs is not None else self.store

    @property
    def log(self) -> dict[str, LogRecord]:
        return self.jobs.log if self.jobs is not None else {}

    async def shutdown(self) -> None:
        """Stop every generation, stop listening, close every connection.

        Streams get a moment to send their end event (stopped within one
        token); idle keep-alive connections are simply closed.
        """
        if self.jobs is not None:
            self.jobs.stop_all()
        if self._listener is not None:
            self._listener.close()
        tasks = list(self._connections)
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for task, client in list(self._connections.items()):
            client.abort()
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        if self.jobs is not None:
            await self.jobs.wait_all()
        if self.registry is not None:
            await self.registry.shutdown()
        if self.jobs is not None and self.jobs.store is not self._store:
            self.jobs.store.close()  # the shared store: endings kept while Redis was away get a last try
        if self._store is not None:
            self._store.close()  # whatever is still being written is closed as interrupted

    # -- connections -----------------------------------------------------------

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = ClientConnection(reader, writer, self.config.write_timeout,
                                  tcp_user_timeout=self.config.tcp_user_timeout, tcp_keepalive=self.config.tcp_keepalive)
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.config.max_connections:
            headers = [("Retry-After", str(RETRY_AFTER))]
            message = (f"{len(self._connections)} connections are open, the limit"
                       f" ({config_flag('max_connections')} {self.config.max_connections})")
            await responses.refuse(client, 503, message, headers)
            return
        self._connections[task] = client
        try:
            await self._serve_connection(client)
        except (ClientGone, ConnectionError, asyncio.TimeoutError):
            pass
        finally:
            del self._connections[task]
            client.abort()

    async def _serve_connection(self, client: ClientConnection) -> None:
        """Requests one after another on the same connection, while both sides keep it alive."""
        config = self.config
        while True:
            try:
                request = await client.read_head(
                    idle_timeout=config.idle_timeout, head_timeout=config.head_timeout, max_head=config.max_head
                )
            except HTTPError as err:
                await responses.refuse(client, err.status, err.message)
                return
            if request is None or not await self._dispatch(client, request):
                await client.close()
                return

    async def _dispatch(self, client: ClientConnection, request: Request) -> bool:
        """Check the request at the door, find its handler, run it; refusals become JSON errors."""
        errors = error_format(request.path)
        head_only = request.method == "HEAD"
        try:
            handler, params = self._route(request)
            return await handler(client, request, **params)
        except (HTTPError, websocket_handshake.HandshakeError) as err:
            headers = getattr(err, "headers", ())
            await responses.refuse(client, err.status, err.message, headers, errors, head_only=head_only)
        except (ClientGone, ConnectionError):
            pass
        except Exception:  # noqa: BLE001 - a bug must not take the server down, nor show its insides
            print(f"streamlab: {request.method} {request.target!r} failed:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            await responses.refuse(client, 500, "internal server error", (), errors, head_only=head_only)
        return False

    def _route(self, request: Request) -> tuple[Handler, dict[str, str]]:
        """The guards every request passes, in order: Host, route, method, then for a POST its type and Origin."""
        self.guards.check_host(request)
        if "\x00" in request.path:
            raise HTTPError(400, "the path contains a NUL character")
        for route in self.routes:
            params = route.match(request.path)
            if params is None:
                continue
            handler = route.methods.get(request.method)
            if handler is None:
                allow = [("Allow", ", ".join(sorted(route.methods)))]
                raise responses.Refused(405, f"{request.method} is not allowed on {request.path}", allow)
            if request.method == "POST":
                self.guards.check_json(request)
                self.guards.check_origin(request)
            return handler, params
        raise not_found(request.path)

    async def _body(self, client: ClientConnection, request: Request) -> bytes:
        return await client.read_body(request, max_body=self.config.max_body, timeout=self.config.body_timeout)

    # -- generating --------------------------------------------------------------

    async def complete(self, client: ClientConnection, request: Request) -> bool:
        """``POST /complete``: generate it all, then send one JSON body with a Content-Length."""
        req = parse_generation_request(await self._body(client, request))
        return await self._whole(client, request, req, StreamlabFormat())

    async def stream(self, client: ClientConnection, request: Request) -> bool:
        """``POST /stream``: one Server-Sent Event per piece, as soon as it exists; then ``end`` and ``[DONE]``."""
        req = parse_generation_request(await self._body(client, request))
        return await self._stream(client, request, req, StreamlabFormat())

    async def chat_completions(self, client: ClientConnection, request: Request) -> bool:
        """``POST /v1/chat/completions``: OpenAI's Chat Completions, streamed or whole."""
        req = openai_api.parse_request(await self._body(client, request))
        fmt = openai_api.ChatCompletionFormat(self.source.name, include_usage=req.include_usage,
                                               include_obfuscation=req.include_obfuscation)
        return await (self._stream if req.stream else self._whole)(client, request, req, fmt)

    async def messages(self, client: ClientConnection, request: Request) -> bool:
        """``POST /v1/messages``: Anthropic's Messages, streamed or whole."""
        req = anthropic_api.parse_request(await self._body(client, request))
        fmt = anthropic_api.MessagesFormat(self.source.name)
        return await (self._stream if req.stream else self._whole)(client, request, req, fmt)

    async def responses(self, client: ClientConnection, request: Request) -> bool:
        """``POST /v1/responses``: OpenAI's Responses, its typed events streamed, or the response whole."""
        req = responses_api.parse_request(await self._body(client, request))
        fmt = responses_api.ResponseFormat(self.source.name, req)
        return await (self._stream if req.stream else self._whole)(client, request, req, fmt)

    async def models(self, client: ClientConnection, request: Request) -> bool:
        """``GET /v1/models``: the model this server answers with (what the ``openai`` SDK lists)."""
        return await responses.respond_json(client, request, openai_api.models_body(self.source.name))

    async def _whole(self, client: ClientConnection, request: Request, req: GenerationRequest, fmt: Format) -> bool:
        """The whole answer in one JSON body, in the route's format (``WholeDelivery``); True: keep the connection."""
        answer = Answer(self.jobs, request.path, req, client=client, counts_pieces=False)
        delivery = WholeDelivery(client, request, fmt, self._refusal(client, request))
        try:
            await answer.run(delivery)
        except ClientGone:
            return False
        return delivery.keep_alive and answer.gone is None

    async def _stream(self, client: ClientConnection, request: Request, req: GenerationRequest, fmt: Format) -> bool:
        """The one streaming path of every generating SSE route: the answer's steps as the format's events."""
        answer = Answer(self.jobs, request.path, req, client=client)
        stream = EventStream(client, request, accel_header=self.config.accel_header)  # its head: the delivery's
        delivery = EventDelivery(stream, fmt, self._refusal(client, request))
        try:
            await answer.run(delivery)
        except ClientGone:
            return False
        return delivery.keep_alive and answer.served and answer.job.record.stop_signal is None

    def _refusal(self, client: ClientConnection, request: Request) -> Callable[[Job, tuple[int, str]], Awaitable[None]]:
        """How this route says its upstream failed, not this server (502, 504...): as a gateway does, in its API."""

        async def refuse(job: Job, failure: tuple[int, str]) -> None:
            status, message = failure
            errors = error_format(request.path) or (lambda code, text: {**error_body(code, text),
                                                                         "id": job.record.id, **job.ids()})
            await responses.refuse(client, status, message, job.headers(), errors)

        return refuse

    async def websocket(self, client: ClientConnection, request: Request) -> bool:
        """``GET /ws``: check the upgrade and its Origin, answer 101, then speak frames."""
        self.guards.check_origin(request)
        key = websocket_handshake.validate_upgrade_request(request.method, dict(request.headers))
        request_id = self.jobs.new_id()
        await client.send(websocket_handshake.server_handshake_response(key, [("X-Request-Id", request_id)]))
        await WebSocketSession(self.jobs, self.config, client, request_id).run()
        return False

    # -- generations as resources --------------------------------------------------

    async def create_generation(self, client: ClientConnection, request: Request) -> bool:
        """``POST /generations``: start an answer that outlives its connection; ``201`` says where to read it."""
        req = parse_generation_request(await self._body(client, request))
        body, headers = await self.registry.created(req)
        return await responses.respond_json(client, request, body, headers, status=201)

    async def generation_events(self, client: ClientConnection, request: Request, id: str) -> bool:  # noqa: A002
        """``GET /generations/{id}/events``: the answer as numbered Server-Sent Events, resumable.

        A GET with no body, so a browser's ``EventSource`` can read it; a
        reconnect with ``Last-Event-ID`` resumes (see the registry's ``events``).
        The stream ends by closing the connection; a 204 leaves it open for the next request.
        """
        return await self.registry.events(client, request, id)

    async def cancel_generation(self, client: ClientConnection, request: Request, id: str) -> bool:  # noqa: A002
        """``POST /generations/{id}/cancel``: the user pressed stop. Answers once generation has stopped.

        The reader's connection may be gone (a closed tab), so stopping is a
        request of its own, not a message on the stream.
        """
        await self._body(client, request)  # a body, if any, says nothing the URL does not
        return await responses.respond_json(client, request, await self.registry.cancelled(id))

    async def get_generation(self, client: ClientConnection, request: Request, id: str) -> bool:  # noqa: A002
        """``GET /generations/{id}``: how far it has come, its text so far, how it ended."""
        return await responses.respond_json(client, request, await self.registry.describe(id))

    # -- reading back: the log, conversations, health ----------------------------

    async def get_log(self, client: ClientConnection, request: Request) -> bool:
        """``GET /log``: every generation request, how it ended, and how the server noticed."""
        return await responses.respond_json(client, request, [asdict(r) for r in self.log.values()])

    async def get_log_record(self, client: ClientConnection, request: Request, id: str) -> bool:  # noqa: A002
        """``GET /log/{id}``: one record (the id is in each response's X-Request-Id)."""
        record = self.log.get(id)
        if record is None:
            raise HTTPError(404, f"no request with id {id!r}")
        return await responses.respond_json(client, request, asdict(record))

    async def health(self, client: ClientConnection, request: Request) -> bool:
        """``GET /health``: up, which model, which mode, how busy (running, and waiting in line); a relay's upstream.

        With ``--events``, whether Redis answers (``redis``): 503 while it does not, so that a balancer
        sends new work elsewhere.
        """
        config, jobs = self.config, self.jobs
        body = {"ok": True, "model": self.source.name, "engine": self.source.kind, "naive": config.naive,
                "active": len(jobs.running), "max_active": config.max_active, "admission": config.admission,
                "waiting": len(jobs.queue), "max_waiting": config.max_waiting, "left_queue": jobs.left_queue}
        upstream = await self.source.health()
        if upstream is not None:  # a relay is only as well as what it relays to: asked now
            body["upstream"] = upstream
            body["ok"] = upstream["ok"]
        status = 200
        if isinstance(self.registry, SharedRegistry):  # /generations live in Redis: asked now too
            body["redis"] = await self.registry.health()
            if not body["redis"]["ok"]:
                body["ok"], status = False, 503
        return await responses.respond_json(client, request, body, status=status)

    async def debug_queues(self, client: ClientConnection, request: Request) -> bool:
        """``GET /debug/queues``: where a slow reader's bytes wait now, layer by layer (this machine only; see queues.py)."""
        running = self.jobs.running if self.jobs is not None else ()
        waiting = self.jobs.queue if self.jobs is not None else ()
        body = queues.snapshot(client, self._connections.values(), running, waiting)
        return await responses.respond_json(client, request, body)

    async def get_conversations(self, client: ClientConnection, request: Request) -> bool:
        """``GET /conversations``: every stored conversation, newest first, for a history list."""
        store = self.conversations
        items = []
        for c in reversed(store.conversations()):
            if not c.title:  # stored without one: its first user message, cut short
                first = next((m for m in store.history(c.id) if m.role == "user"), None)
                c_title = title(first.content) if first is not None else None
            else:
                c_title = c.title
            items.append({"id": c.id, "title": c_title, "created": c.created})
        return await responses.respond_json(client, request, items)

    async def get_conversation(self, client: ClientConnection, request: Request, id: str) -> bool:  # noqa: A002
        """``GET /conversations/{id}``: every message, with why each answer ended.

        An answer still being generated shows its text so far, from memory:
        the file lags up to one flush interval behind.
        """
        store = self.conversations
        conversation = store.conversation(id)
        if conversation is None:
            raise HTTPError(404, f"no conversation {id!r}")
        live = {job.answer.message_id: job.answer for job in self.jobs.running}
        messages = []
        for m in store.history(id):
            writer = live.get(m.id) if m.status == STREAMING else None
            content, tokens = (writer.text, writer.tokens) if writer is not None else (m.content, m.tokens)
            messages.append({"id": m.id, "role": m.role, "content": content, "status": m.status,
                             "stop_reason": m.stop_reason, "incomplete": m.incomplete, "tokens": tokens})
        body = {"id": conversation.id, "title": conversation.title, "created": conversation.created,
                "messages": messages}
        return await responses.respond_json(client, request, body)

    # -- the browser page ----------------------------------------------------------

    async def index(self, client: ClientConnection, request: Request) -> bool:
        """``GET /``: the browser page, ``static/index.html``."""
        return await self.static(client, request, "index.html")

    async def static(self, client: ClientConnection, request: Request, name: str, folder: str | None = None) -> bool:
        """``GET /static/{name}`` (or ``/static/{folder}/{name}``): a file of ``streamlab/static``.

        ``no-cache`` makes a browser revalidate, so an edited page shows on the next reload.
        """
        body, content_type = responses.static_file(*((name,) if folder is None else (folder, name)))
        headers = [("Cache-Control", "no-cache"), ("X-Content-Type-Options", "nosniff")]
        return await responses.respond(client, request, body, content_type=content_type, headers=headers)
