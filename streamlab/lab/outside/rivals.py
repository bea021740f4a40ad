"""The same scripted source served by other people's servers: the yardstick for ours.

    python -m streamlab.lab.outside.rivals starlette     --port 0 --rate 20   # uvicorn + Starlette's StreamingResponse
    python -m streamlab.lab.outside.rivals sse-starlette --port 0 --rate 20   # uvicorn + sse-starlette's EventSourceResponse
    python -m streamlab.lab.outside.rivals websockets    --port 0 --rate 20   # the websockets library's asyncio server
    ... --loop uvloop                                                 # on uvloop instead of asyncio's own loop

Each serves :class:`streamlab.server.answers.scripted.ScriptedGeneration`, the very
source ``python -m streamlab serve --scripted-rate 20`` serves: the same
words on the same schedule (one every 50 ms on absolute deadlines). The SSE
rivals take ``POST /stream`` with ``{"prompt", "max_tokens"}`` and answer
with our framing: ``data: {"text": ...}`` per piece, then ``event: end``
and ``data: [DONE]``; the WebSocket rival takes the same request as its first
message and sends ``{"text"}`` messages, then ``{"done": true, ...}``, then
closes, as our ``/ws`` does. What they do not do is what makes ours longer:
no admission limit, no store, no ``/log``, no stop message on the WebSocket.

Every rival runs on the event loop ``--loop`` names, as ``python -m
streamlab serve --loop`` does: a comparison of two servers on two loops
would measure the loops. uvicorn picks uvloop by itself when it is
installed, but only in ``uvicorn.run``; these servers run inside a loop
of our making (``command.run_on_loop``), so the loop is the one named,
whatever is installed (the ``loop`` of uvicorn's config says the same,
for the record). The HTTP parser stays h11, pure Python like ours:
httptools (C) would compare parsers, not servers.

Each prints ``rivals: listening on http://127.0.0.1:PORT`` when ready, the
line :func:`streamlab.lab.setups.runner.start_process` waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
from typing import Any

from streamlab.net.serving import on_stdin_eof

LOOPS = ("asyncio", "uvloop")

KINDS = ("starlette", "sse-starlette", "websockets")
PING_SECONDS = 15.0  # keep-alive comments in silences, as our server's --ping-interval default


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _max_tokens(body: Any) -> int:
    """The one field the rivals read from ``{"prompt", "max_tokens"}`` (the script ignores the prompt)."""
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
        raise ValueError("a request is a JSON object with a prompt")
    max_tokens = body.get("max_tokens", 100)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError("max_tokens must be a positive integer")
    return max_tokens


def _ending(generation: Any) -> dict[str, Any]:
    result = generation.result
    return {"stop_reason": result.stop_reason, "tokens": result.tokens}


def starlette_app(rate: float, *, sse_starlette: bool = False) -> Any:
    """A Starlette app with ``POST /stream``: ``StreamingResponse``, or sse-starlette's ``EventSourceResponse``."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from streamlab.server.answers.scripted import ScriptedGeneration

    async def stream(request: Any) -> Any:
        try:
            max_tokens = _max_tokens(await request.json())
        except ValueError as exc:
            return JSONResponse({"error": {"status": 400, "message": str(exc)}}, status_code=400)
        generation = ScriptedGeneration(rate, max_tokens)
        headers = {"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}

        if sse_starlette:
            from sse_starlette import EventSourceResponse

            async def events() -> Any:
                try:
                    async for piece in generation.pieces():
                        yield {"data": _dumps({"text": piece.text})}
                    await generation.wait()
                    yield {"event": "end", "data": _dumps(_ending(generation))}
                    yield {"data": "[DONE]"}
                finally:
                    generation.stop()  # the reader left: the generator was closed

            # sep="\n": its default is "\r\n"; ours is "\n", and the bytes should match.
            return EventSourceResponse(events(), headers=headers, ping=PING_SECONDS, sep="\n")

        async def chunks() -> Any:
            try:
                async for piece in generation.pieces():
                    yield f"data: {_dumps({'text': piece.text})}\n\n"
                await generation.wait()
                yield f"event: end\ndata: {_dumps(_ending(generation))}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                generation.stop()

        return StreamingResponse(chunks(), media_type="text/event-stream; charset=utf-8", headers=headers)

    return Starlette(routes=[Route("/stream", stream, methods=["POST"])])


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """Bound and listening before the server starts, so ``--port 0`` can say which port it got."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def _ready(sock: socket.socket, what: str) -> None:
    host, port = sock.getsockname()[:2]
    print(f"rivals: {what} listening on http://{host}:{port}", flush=True)


async def serve_starlette(sock: socket.socket, rate: float, *, sse_starlette: bool, stdin_eof: bool = False,
                          loop: str = "asyncio") -> None:
    import uvicorn

    app = starlette_app(rate, sse_starlette=sse_starlette)
    config = uvicorn.Config(app, loop=loop, http="h11", ws="none", lifespan="off", log_level="warning",
                            access_log=False, backlog=2048)
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))  # uvicorn handles SIGTERM and SIGINT itself
    if stdin_eof:
        on_stdin_eof(lambda: setattr(server, "should_exit", True))
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        _ready(sock, "uvicorn + sse-starlette" if sse_starlette else "uvicorn + Starlette")
    await task


async def serve_websockets(sock: socket.socket, rate: float, *, stdin_eof: bool = False) -> None:
    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosed

    from streamlab.server.answers.scripted import ScriptedGeneration

    async def handler(connection: Any) -> None:
        try:
            max_tokens = _max_tokens(json.loads(await connection.recv()))
        except (ValueError, TypeError) as exc:
            await connection.send(_dumps({"error": {"status": 400, "message": str(exc)}}))
            await connection.close(1008, "bad request")
            return
        except ConnectionClosed:
            return
        generation = ScriptedGeneration(rate, max_tokens)
        try:
            async for piece in generation.pieces():
                await connection.send(_dumps({"text": piece.text}))
            await generation.wait()
            await connection.send(_dumps({"done": True, **_ending(generation)}))
        except ConnectionClosed:
            pass
        finally:
            generation.stop()
        # Returning closes the connection with 1000, as our /ws does after "done".

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    if stdin_eof:
        on_stdin_eof(stopping.set)
    # compression=None: our server offers none, and the driver asks for none.
    async with serve(handler, sock=sock, compression=None, ping_interval=20, ping_timeout=20, max_size=1 << 20):
        _ready(sock, "websockets")
        await stopping.wait()


def _load_and_freeze(kind: str) -> None:
    """Import everything now, then ``gc.freeze()`` it, as ``python -m streamlab serve`` does.

    The scripted source comes with torch (``streamlab.model.generation`` imports
    it), which a bare Starlette app would not have: unfrozen, each full pass
    of the garbage collector would walk its ~170,000 objects and hold every
    stream for ~0.1 s, a cost of this benchmark's making, not of the rival.
    """
    import gc

    from streamlab.server.answers import scripted  # noqa: F401

    if kind == "websockets":
        import websockets.asyncio.server  # noqa: F401
    else:
        import sse_starlette  # noqa: F401
        import starlette.applications  # noqa: F401
        import uvicorn  # noqa: F401
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamlab.lab.outside.rivals",
                                description="Serve the scripted source with someone else's server.")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--rate", type=float, default=20.0, help="tokens per second (the scripted source's)")
    p.add_argument("--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (the parent died)")
    p.add_argument("--loop", choices=LOOPS, default="asyncio", help="the event loop (as serve's --loop)")
    args = p.parse_args(argv)
    from streamlab.net.processes import raise_open_files_limit
    from streamlab.server.command import loop_factory, run_on_loop

    loop_factory(args.loop)  # not installed: said before anything starts
    raise_open_files_limit()
    sock = listening_socket(args.host, args.port)
    _load_and_freeze(args.kind)
    if args.kind == "websockets":
        run_on_loop(serve_websockets(sock, args.rate, stdin_eof=args.exit_on_stdin_eof), args.loop)
    else:
        run_on_loop(serve_starlette(sock, args.rate, sse_starlette=args.kind == "sse-starlette",
                                    stdin_eof=args.exit_on_stdin_eof, loop=args.loop), args.loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
