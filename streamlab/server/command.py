"""``python -m streamlab serve``: bind the port, open the store, load the model (or name an upstream, or a scripted
rate), serve until signalled."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import sys
from typing import Any, Callable, Coroutine, TypeVar

from streamlab.net.errors import UserError
from streamlab.net.processes import raise_open_files_limit
from streamlab.server.app import Server
from streamlab.server.config import ServerConfig, config_from_args, parse_args
from streamlab.net.serving import serve_until_signalled
from streamlab.server.answers.sources import UpstreamSource, load_and_say
from streamlab.server.answers.scripted import ScriptedEngine

SPARE_FILES = 64  # descriptors besides the connections: the store, the listener, pipes, imports
T = TypeVar("T")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``--loop`` names, as a factory for ``asyncio.Runner``; None for the standard library's.

    Named, never picked by what happens to be installed: a measurement that
    compares two servers must know that both ran on the same loop.
    """
    if name == "asyncio":
        return None
    if name != "uvloop":
        raise UserError(f"--loop {name}: the loops are asyncio and uvloop")
    try:
        import uvloop
    except ImportError:
        raise UserError("--loop uvloop: uvloop is not installed here (pip install uvloop), or use --loop asyncio"
                        ) from None
    return uvloop.new_event_loop


def run_on_loop(coroutine: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    """``asyncio.run`` on the loop ``loop`` names (``serve``, the rivals and the load driver of chapter 11)."""
    factory = loop_factory(loop)
    runner_type = getattr(asyncio, "Runner", None)
    if runner_type is not None:
        with runner_type(loop_factory=factory) as runner:
            return runner.run(coroutine)
    if factory is not None:  # Python 3.10: no Runner, so the loop asyncio.run makes is named through the policy
        asyncio.set_event_loop_policy(_FactoryPolicy(factory))
    return asyncio.run(coroutine)


class _FactoryPolicy(asyncio.DefaultEventLoopPolicy):  # Python 3.10's way to name the loop asyncio.run makes
    def __init__(self, factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
        super().__init__()
        self._factory = factory

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return self._factory()


async def serve(lm: Any, config: ServerConfig, *, exit_on_stdin_eof: bool = False) -> int:
    """Listen until SIGINT, SIGTERM (or stdin EOF); then stop everything and return 0."""
    return await _serve(Server(lm, config), None, exit_on_stdin_eof=exit_on_stdin_eof)


async def _serve(server: Server, lm: Any, *, exit_on_stdin_eof: bool) -> int:
    """Start ``server`` (with ``lm`` when it was loaded after binding), serve until signalled, shut down."""
    raise_open_files_limit(server.config.max_connections + SPARE_FILES)
    try:
        await server.start(lm)
    except BaseException:
        await server.shutdown()  # the port and the store, when bind() had opened them
        raise
    # Everything loaded so far (torch, the model, every module) lives as long as the process. Frozen,
    # the garbage collector's full passes skip it: unfrozen, each one walked ~170,000 objects and held
    # every stream still for ~0.1 s (chapter 11's benchmark saw it as its worst gaps between events).
    gc.freeze()
    await serve_until_signalled(server.url, exit_on_stdin_eof=exit_on_stdin_eof)
    await server.shutdown()
    return 0


def bind_load_serve(server: Server, load: Callable[[], Any] | None, *, exit_on_stdin_eof: bool,
                    loop: str = "asyncio") -> int:
    """Bind the port and open the store, then load the model (``load``), then serve: in that order.

    The port and the store are what a user gets wrong at the command line (a
    port in use, a folder that cannot hold the file), so they fail first, in
    a fraction of a second, not after seconds spent on a model that would go
    unused. The model loads between two runs of the loop, not inside one: an
    asyncio run defers Ctrl-C until the running code awaits, which a load
    never does, so the reader's Ctrl-C would wait for the whole load.
    """
    runner_type = getattr(asyncio, "Runner", None)
    if runner_type is None:  # Python 3.10: asyncio.run installs no SIGINT handler, so a load inside it still stops
        async def everything() -> int:
            await server.bind()
            return await _serve(server, load() if load is not None else None, exit_on_stdin_eof=exit_on_stdin_eof)

        return run_on_loop(everything(), loop)
    with runner_type(loop_factory=loop_factory(loop)) as runner:
        runner.run(server.bind())
        try:
            lm = load() if load is not None else None
        except BaseException:
            runner.run(server.shutdown())
            raise
        return runner.run(_serve(server, lm, exit_on_stdin_eof=exit_on_stdin_eof))


def main(argv: list[str] | None = None) -> int:
    """``python -m streamlab serve``: bind, open the store, load the model once (or, with ``--upstream`` or
    ``--scripted-rate``, none), then serve."""
    args = parse_args(argv)
    loop_factory(args.loop)  # a loop that is not installed is said now, before the port and the model
    load = None
    if args.scripted_rate is not None:
        engine: Any = ScriptedEngine(args.scripted_rate)
        print(f"streamlab: no model: a scripted source, {engine.name}", file=sys.stderr, flush=True)
    elif args.upstream:
        engine = UpstreamSource(args.upstream, args.upstream_model, os.environ.get("STREAMLAB_UPSTREAM_KEY"),
                                reachable_at_start=True)
        print(f"streamlab: relaying to {engine.url}", file=sys.stderr, flush=True)
    else:
        engine, load = None, functools.partial(load_and_say, args.model, args.engine, args.precision)
    server = Server(engine, config_from_args(args))
    return bind_load_serve(server, load, exit_on_stdin_eof=args.exit_on_stdin_eof, loop=args.loop)
