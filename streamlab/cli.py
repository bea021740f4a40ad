"""``python -m streamlab COMMAND``: one entry point for every program a reader runs.

Each command lives in its own module and takes its own argv, so the server and
the proxy are started in notebooks and tests exactly as a reader types them.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "serve": ("streamlab.server", "run the model server (/complete, /stream, /ws)"),
    "proxy": ("streamlab.hops.proxy", "run the buffering reverse proxy"),
    "platform": ("streamlab.hops.function_platform", "run a function-platform stand-in (execution limit, buffering, bill)"),
    "run-notebooks": ("streamlab.book.notebooks", "execute every chapter with papermill into build/"),
    "report": ("streamlab.book.report", "write build/report.html: each chapter's headline and key figure"),
    "info": ("streamlab.lab.info", "load the model and print its load time and tokens/second"),
}


def usage() -> str:
    lines = ["usage: python -m streamlab COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<14} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
