"""Mistakes a user makes at the command line, told in one line that names what to change.

A busy port, a wrong path, a typo in a name: the person who made it needs to
read *which* port, path or name, and *which* flag or variable changes it, not
a traceback through asyncio or sqlite3 that ends, forty lines down, in
``[Errno 98]``. The layer that knows what went wrong (the server binding its
port, the store opening its file, the model loader) raises a
:class:`UserError` worded for that person; ``python -m streamlab`` prints it
as ``streamlab: MESSAGE`` and exits 2. ``STREAMLAB_DEBUG=1`` prints the full
traceback as well, for the times it was not the user's mistake after all.

It lives here, low, because every layer above may need to raise it, and the
net layer is where the I/O they share already lives.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import re
import socket
import sys
from typing import Any, NoReturn

__all__ = ["DEBUG", "DEBUG_EPILOG", "REQUIRED_NOTE", "ArgumentParser", "UserError", "debugging", "listen_error", "one_line"]

DEBUG = "STREAMLAB_DEBUG"
# The last line of every command's --help, so that the way to the traceback is written where it is looked for.
DEBUG_EPILOG = f"A mistake (a busy port, a wrong path or name) is one line on stderr and exit status 2; {DEBUG}=1" \
    " prints the full traceback too."


class UserError(RuntimeError):
    """A failure the user can fix: the message says what to change (a flag, a variable, a path).

    A RuntimeError, so that code that caught what these places raised before
    (``ModelError``, the store's refusal of a newer schema) still catches it.
    """


def debugging() -> bool:
    """Whether ``STREAMLAB_DEBUG`` asks for tracebacks (set, and not 0, no, false or off)."""
    return os.environ.get(DEBUG, "").strip().lower() not in ("", "0", "no", "false", "off")


def one_line(text: object) -> str:
    """``text`` with its line breaks and runs of blanks made single spaces: a message meant for one line."""
    return " ".join(str(text).split())


_BIND_ADDRESS = re.compile(r"address \('([^']*)', (\d+)")


def listen_error(err: OSError, host: str | None = None, port: int | None = None, *,
                 flags: tuple[str, str] = ("--host", "--port")) -> UserError | None:
    """The one line for a failure to listen on ``host:port``, or None when ``err`` is not one.

    ``host`` and ``port`` default to what asyncio writes into its own message
    (``error while attempting to bind on address ('127.0.0.1', 8000): ...``),
    so a caller that only holds the exception still names the port.
    """
    found = _BIND_ADDRESS.search(str(err))
    if found is not None:
        host = host if host is not None else found.group(1)
        port = port if port is not None else int(found.group(2))
    host_flag, port_flag = flags
    where = f"port {port} on {host or 'every address'}"
    if isinstance(err, socket.gaierror):
        return UserError(f"cannot listen on {host!r}: no such host name ({err.strerror or err}):"
                         f" name an address of this machine with {host_flag}")
    if err.errno == errno.EADDRINUSE:
        return UserError(f"{where} is in use: pick another with {port_flag} (0 picks a free one)")
    if err.errno == errno.EACCES:
        return UserError(f"{where} needs privileges this process lacks: pick one above 1023 with {port_flag}")
    if err.errno == errno.EADDRNOTAVAIL:
        return UserError(f"cannot listen on {host}: not an address of this machine: pick one with {host_flag}"
                         " (127.0.0.1: this machine only)")
    return None


_UNKNOWN = "unrecognized arguments: "
_MISSING = "the following arguments are required: "
REQUIRED_NOTE = " (required)"  # what the help of a flag that must be given ends with, in place of its default


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but a wrong flag is one line (with where to read every flag), and --help ends on DEBUG_EPILOG.

    argparse prints the whole usage first, which for ``serve`` is a screenful
    of flags above the line that matters. The line names the flag nearest to
    a misspelt one (``--modle``: did you mean ``--model``?), and what a
    missing required flag takes.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        epilog = kwargs.get("epilog")
        kwargs["epilog"] = f"{epilog}\n\n{DEBUG_EPILOG}" if epilog else DEBUG_EPILOG
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given = [str(word) for word in (sys.argv[1:] if args is None else args)]  # for error()
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{self._explained(message)}: {self.prog} --help lists every option")

    def _explained(self, message: str) -> str:
        """argparse's message, with the nearest flag to each one it did not know, and what a missing one is.

        argparse learnt to suggest a flag only in Python 3.14 (``suggest_on_error``),
        and says of a missing required flag only its name.
        """
        unknown = message.startswith(_UNKNOWN)
        missing = message.startswith(_MISSING)
        if not (unknown or missing):
            return message
        words = message.split(": ", 1)[1].replace(",", " ").split()
        strangers = [word for word in getattr(self, "_given", ()) if word.startswith("--") and not self._knows(word)]
        if missing and strangers:  # argparse tells a missing flag first, when the stranger is that flag misspelt
            unknown, words, message = True, strangers, _UNKNOWN + " ".join(strangers)
        if unknown:
            known = [flag for flag in self._option_string_actions if flag.startswith("--")]
            near = {word: difflib.get_close_matches(word.split("=", 1)[0], known, n=1) for word in words
                    if word.startswith("-")}
            hints = [f"{close[0]} for {word}" if len(near) > 1 else close[0] for word, close in near.items() if close]
            return f"{message} (did you mean {', '.join(hints)}?)" if hints else message
        needed = []
        for word in words:
            action = self._option_string_actions.get(word)
            if action is None:
                continue
            value = f" {action.metavar}" if action.metavar and action.nargs != 0 else ""
            what = (action.help or "").replace(REQUIRED_NOTE, "").replace("%%", "%").strip()
            needed.append(f"{word}{value}" + (f", {what}" if what else ""))
        return f"{message} ({self.prog} needs {'; '.join(needed)})" if needed else message

    def _knows(self, word: str) -> bool:
        """Whether ``word`` is one of the flags, or an abbreviation argparse takes for one."""
        name = word.split("=", 1)[0]
        return name == "--" or any(flag.startswith(name) for flag in self._option_string_actions)
