"""``python -m streamlab COMMAND``: one entry point for every program a reader runs.

Each command lives in its own module and takes its own argv, so the server and
the proxy are started in notebooks and tests exactly as a reader types them.

A mistake the reader can fix (a busy port, a wrong path, a misspelt name) is
raised as ``streamlab.net.errors.UserError`` wherever it is found, and told
here, once for every command: one line on stderr, exit status 2, the
traceback only with ``STREAMLAB_DEBUG=1``.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import traceback

from streamlab.net.errors import DEBUG_EPILOG, UserError, debugging, listen_error, one_line

COMMANDS = {
    "serve": ("streamlab.server.command", "run the model server (/complete, /stream, /ws)"),
    "worker": ("streamlab.server.resources.worker", "take /generations jobs from Redis and generate them (serve --events)"),
    "proxy": ("streamlab.hops.proxy", "run the buffering reverse proxy"),
    "platform": ("streamlab.hops.function_platform", "run a function-platform stand-in (execution limit, buffering, bill)"),
    "run-notebooks": ("streamlab.book.notebooks", "execute every chapter with papermill into build/"),
    "report": ("streamlab.book.report", "write build/report.html: each chapter's headline and key figure"),
    "book": ("streamlab.book.pages", "write build/book/: the executed chapters as web pages, with an index"),
    "info": ("streamlab.lab.experiments.model_speed", "load the model and print its load time and tokens/second"),
    "lab": ("streamlab.book.jupyter_lab", "open JupyterLab on a folder (make lab: notebooks/); as root with --allow-root"),
}
USAGE_ERROR = 2  # what argparse exits with for a bad flag: every mistake of the user's exits the same


def usage() -> str:
    lines = ["usage: python -m streamlab COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<14} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "python -m streamlab COMMAND --help: that command's options.", DEBUG_EPILOG]
    return "\n".join(lines)


def fail(message: str, error: BaseException | None = None) -> int:
    """Tell one mistake in one line (with the traceback first when debugging); return the exit status."""
    if error is not None and debugging():
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    print(f"streamlab: {one_line(message)}", file=sys.stderr, flush=True)
    return USAGE_ERROR


def unknown_command(name: str) -> int:
    close = difflib.get_close_matches(name, COMMANDS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return fail(f"no command {name!r}: {hint}the commands are {', '.join(COMMANDS)}"
                " (python -m streamlab --help says what each does)")


def run(name: str, argv: list[str]) -> int:
    """Run one command's ``main``; a ``UserError`` (or a port it could not listen on) becomes one line.

    The proxy and the platform bind through asyncio without naming a flag,
    so an ``OSError`` from listening is worded here from what asyncio wrote
    into it; any other exception is a bug and keeps its traceback.
    """
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(argv) or 0)
    except UserError as err:  # ModelError, the store's refusals, the notebooks' --only and -p ...
        return fail(str(err), err)
    except OSError as err:
        told = listen_error(err)
        if told is None:
            raise
        return fail(str(told), err)
    except KeyboardInterrupt:  # Ctrl-C before a server was up (loading a model): nothing to explain
        if debugging():
            raise
        print(f"streamlab {name}: interrupted", file=sys.stderr, flush=True)
        return 130  # what a shell reports for a process ended by SIGINT


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        return unknown_command(name)
    return run(name, rest)

if __name__ == "__main__":
    sys.exit(main())
