"""``python -m streamlab serve``: load the model (or name an upstream to relay to), serve until signalled."""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import redirect_stdout
from typing import Any

from .app import Server
from .config import ServerConfig, config_from_args, parse_args
from .connection import serve_until_signalled
from .engines import UpstreamEngine


async def serve(lm: Any, config: ServerConfig, *, exit_on_stdin_eof: bool = False) -> int:
    """Listen until SIGINT, SIGTERM (or stdin EOF); then stop everything and return 0."""
    server = Server(lm, config)
    await server.start()
    await serve_until_signalled(server.url, exit_on_stdin_eof=exit_on_stdin_eof)
    await server.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m streamlab serve``: load the model once (or, with ``--upstream``, none), then serve."""
    from ..model import load_model

    args = parse_args(argv)
    if args.upstream:
        engine: Any = UpstreamEngine(args.upstream, args.upstream_model, os.environ.get("STREAMLAB_UPSTREAM_KEY"))
        print(f"streamlab: relaying to {engine.url}", file=sys.stderr, flush=True)
    else:
        with redirect_stdout(sys.stderr):  # stdout carries one line only: the one the runner waits for
            engine = load_model(args.model)
        print(f"streamlab: model {engine.name} on {engine.device} (loaded in {engine.load_seconds:.1f} s)",
              file=sys.stderr, flush=True)
    return asyncio.run(serve(engine, config_from_args(args), exit_on_stdin_eof=args.exit_on_stdin_eof))
