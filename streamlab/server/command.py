"""``python -m streamlab serve``: bind the port, open the store, load the model (or name an upstream, or a scripted
rate), serve until signalled.

With ``--also FLAGS`` (repeatable) the same process serves more listeners
from the one model it loaded, each with its own port, store and limits: a
chapter that compares four configurations pays one load instead of four.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import shlex
import sys
from typing import Any, Callable, Coroutine, Sequence, TypeVar

from pathlib import Path

from streamlab.net.errors import UserError
from streamlab.net.processes import raise_open_files_limit
from streamlab.server.app import Server
from streamlab.server.config import COMMAND, ServerConfig, config_from_args, flag, parse_args
from streamlab.net.serving import serve_until_signalled
from streamlab.server.store.schema import default_path
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
    return await _serve([Server(lm, config)], None, exit_on_stdin_eof=exit_on_stdin_eof)


async def _serve(servers: Sequence[Server], lm: Any, *, exit_on_stdin_eof: bool) -> int:
    """Start each server (with ``lm`` when it was loaded after binding), serve until signalled, shut down."""
    raise_open_files_limit(sum(server.config.max_connections for server in servers) + SPARE_FILES)
    try:
        for server in servers:
            await server.start(lm)
    except BaseException:
        for server in servers:
            await server.shutdown()  # the port and the store, when bind() had opened them
        raise
    # Everything loaded so far (torch, the model, every module) lives as long as the process. Frozen,
    # the garbage collector's full passes skip it: unfrozen, each one walked ~170,000 objects and held
    # every stream still for ~0.1 s (chapter 11's benchmark saw it as its worst gaps between events).
    gc.freeze()

    async def stop_one(port: int) -> bool:
        """``stop PORT`` on stdin: that listener shuts down, the others serve on."""
        for server in servers:
            if server.listening and server.port == port:
                await server.shutdown()
                return True
        return False

    await serve_until_signalled([server.url for server in servers], exit_on_stdin_eof=exit_on_stdin_eof,
                                stop_one=stop_one if len(servers) > 1 else None)
    for server in servers:
        if server.listening:  # one stopped by ``stop PORT`` has shut down already
            await server.shutdown()
    return 0


def bind_load_serve(servers: Sequence[Server], load: Callable[[], Any] | None, *, exit_on_stdin_eof: bool,
                    loop: str = "asyncio") -> int:
    """Bind the ports and open the stores, then load the model (``load``), then serve: in that order.

    The ports and the stores are what a user gets wrong at the command line (a
    port in use, a folder that cannot hold the file), so they fail first, in
    a fraction of a second, not after seconds spent on a model that would go
    unused. The model loads between two runs of the loop, not inside one: an
    asyncio run defers Ctrl-C until the running code awaits, which a load
    never does, so the reader's Ctrl-C would wait for the whole load.
    """
    async def bind_all() -> None:
        try:
            for server in servers:
                await server.bind()
        except BaseException:
            await shut_all()
            raise

    async def shut_all() -> None:
        for server in servers:
            await server.shutdown()

    runner_type = getattr(asyncio, "Runner", None)
    if runner_type is None:  # Python 3.10: asyncio.run installs no SIGINT handler, so a load inside it still stops
        async def everything() -> int:
            await bind_all()
            return await _serve(servers, load() if load is not None else None, exit_on_stdin_eof=exit_on_stdin_eof)

        return run_on_loop(everything(), loop)
    with runner_type(loop_factory=loop_factory(loop)) as runner:
        runner.run(bind_all())
        try:
            lm = load() if load is not None else None
        except BaseException:
            runner.run(shut_all())
            raise
        return runner.run(_serve(servers, lm, exit_on_stdin_eof=exit_on_stdin_eof))


# Flags that belong to the process, not to one listener: where the tokens come from, and how the process runs.
PROCESS_FLAGS = tuple(setting.name for setting in COMMAND)


def also_configs(args: Any) -> list[ServerConfig]:
    """Each ``--also FLAGS``: its own listener's config, its store beside the first's unless it names one.

    Its port, unless FLAGS give one, is a free one (``listening on`` says which).

    FLAGS are ``serve``'s own, minus the process's (``--model``, ``--upstream``,
    ``--loop``...): those are given once, outside.
    """
    configs, defaults = [], parse_args([])
    for number, text in enumerate(args.also, start=2):
        try:
            words = shlex.split(text)
        except ValueError as err:
            raise UserError(f"{flag('also')} {text!r}: {err}") from None
        try:
            own = parse_args(words)
        except UserError as err:
            raise UserError(f"{flag('also')} {text!r}: {err}") from None
        given = [name for name in PROCESS_FLAGS if getattr(own, name) != getattr(defaults, name)]
        if given:
            raise UserError(f"{flag('also')} {text!r}: {flag(given[0])} belongs to the whole process; give it once,"
                            " outside --also")
        if not any(word == "--port" or word.startswith("--port=") for word in words):
            own.port = 0  # not the first's: a free one, said on its own "listening on" line
        if own.db is None:
            first = args.db or str(default_path())
            own.db = str(Path(first).with_name(f"{Path(first).stem}-{number}{Path(first).suffix}"))
        configs.append(config_from_args(own))
    return configs


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
    configs = [config_from_args(args), *also_configs(args)]
    if len(configs) > 1 and args.upstream:
        raise UserError(f"{flag('also')}: a relay serves one listener (start one {flag('upstream')} process each)")
    servers = [Server(engine, config) for config in configs]
    return bind_load_serve(servers, load, exit_on_stdin_eof=args.exit_on_stdin_eof, loop=args.loop)
