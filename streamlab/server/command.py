"""``python -m streamlab serve``: load the model (or name an upstream, or a scripted rate), serve until signalled."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from contextlib import redirect_stdout
from typing import Any

from streamlab.server.app import Server
from streamlab.server.config import ServerConfig, config_from_args, parse_args
from streamlab.server.connection import serve_until_signalled
from streamlab.server.sources import UpstreamSource
from streamlab.server.scripted import ScriptedEngine

SPARE_FILES = 64  # descriptors besides the connections: the store, the listener, pipes, imports


async def serve(lm: Any, config: ServerConfig, *, exit_on_stdin_eof: bool = False) -> int:
    """Listen until SIGINT, SIGTERM (or stdin EOF); then stop everything and return 0."""
    raise_open_files_limit(config.max_connections + SPARE_FILES)
    server = Server(lm, config)
    await server.start()
    # Everything loaded so far (torch, the model, every module) lives as long as the process. Frozen,
    # the garbage collector's full passes skip it: unfrozen, each one walked ~170,000 objects and held
    # every stream still for ~0.1 s (chapter 11's benchmark saw it as its worst gaps between events).
    gc.freeze()
    await serve_until_signalled(server.url, exit_on_stdin_eof=exit_on_stdin_eof)
    await server.shutdown()
    return 0


def raise_open_files_limit(needed: int) -> int:
    """Raise this process's soft limit on open files toward ``needed`` (at most the hard limit); return it.

    Every connection is a file descriptor, and the usual soft limit (1,024)
    would refuse the thousand-and-first reader with ``EMFILE`` long before
    ``--max-connections``. The hard limit is as far as a process may go.
    """
    try:
        import resource
    except ImportError:  # not on this platform
        return needed
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    return soft


def main(argv: list[str] | None = None) -> int:
    """``python -m streamlab serve``: load the model once (or, with ``--upstream`` or ``--scripted-rate``, none), then serve."""
    from streamlab.model.loading import load_model

    args = parse_args(argv)
    if args.scripted_rate is not None:
        engine: Any = ScriptedEngine(args.scripted_rate)
        print(f"streamlab: no model: a scripted source, {engine.name}", file=sys.stderr, flush=True)
    elif args.upstream:
        engine = UpstreamSource(args.upstream, args.upstream_model, os.environ.get("STREAMLAB_UPSTREAM_KEY"))
        print(f"streamlab: relaying to {engine.url}", file=sys.stderr, flush=True)
    else:
        with redirect_stdout(sys.stderr):  # stdout carries one line only: the one the runner waits for
            engine = load_model(args.model)
        print(f"streamlab: model {engine.name} on {engine.device} (loaded in {engine.load_seconds:.1f} s),"
              f" generations: {args.engine}", file=sys.stderr, flush=True)
    return asyncio.run(serve(engine, config_from_args(args), exit_on_stdin_eof=args.exit_on_stdin_eof))
