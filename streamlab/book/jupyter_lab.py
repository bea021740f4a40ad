"""``python -m streamlab lab [FOLDER] [JUPYTERLAB FLAGS]``: JupyterLab on the chapters, or on a student copy.

``make lab`` runs it on ``notebooks/``; the student copy of the exercises
(``make exercises``) carries a Makefile whose ``lab`` target runs it on the
copy itself, so the copy opens without the course's folder around it.

JupyterLab refuses to run as root ("Running as root is not recommended. Use
--allow-root to bypass.") and exits within a second. In a classroom
container everyone is root, so there ``make lab`` would open nothing. As
root, then, this says so in one line and passes ``--allow-root``.

Everything after the folder goes to JupyterLab as it is (``--port=8890``,
``--no-browser``, ``--IdentityProvider.token=...``), and JupyterLab replaces
this process: its log, its Ctrl-C and its exit status are its own, and a
process group that is stopped stops JupyterLab itself.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from streamlab.net.errors import DEBUG_EPILOG, UserError

__all__ = ["ALLOW_ROOT", "command", "is_root", "main", "split_args"]

ALLOW_ROOT = "--allow-root"
ROOT_LINE = f"streamlab lab: running as root, so JupyterLab gets {ALLOW_ROOT} (it refuses root without it)"
USAGE = f"""usage: python -m streamlab lab [FOLDER] [JUPYTERLAB FLAGS ...]

Open JupyterLab on FOLDER (default: the current folder): `make lab` opens notebooks/, and
`make lab` in a student copy of the exercises opens the copy. As root it passes {ALLOW_ROOT},
which JupyterLab needs there, and says so in one line.

Every flag after FOLDER goes to JupyterLab unchanged, e.g. --port=8890 --no-browser
(`python -m jupyterlab --help-all` lists them).

{DEBUG_EPILOG}"""


def is_root() -> bool:
    """Whether this process runs as root (never on a system without user ids)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def split_args(argv: Sequence[str]) -> tuple[Path, list[str]]:
    """``[FOLDER] [FLAGS...]`` as the folder and the flags for JupyterLab: a first word not a flag is the folder."""
    argv = list(argv)
    if argv and not argv[0].startswith("-"):
        return Path(argv[0]), argv[1:]
    return Path("."), argv


def command(folder: Path, flags: Sequence[str], *, root: bool) -> list[str]:
    """The command that runs JupyterLab on ``folder`` with this Python, ``--allow-root`` added for root."""
    extra = [ALLOW_ROOT] if root and ALLOW_ROOT not in flags else []
    return [sys.executable, "-m", "jupyterlab", *extra, *flags, str(folder)]


def main(argv: Sequence[str] | None = None, *, run: Callable[[str, list[str]], object] = os.execv) -> int:
    """Check the folder and JupyterLab, tell root so, then become JupyterLab (``run`` is ``os.execv``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    folder, flags = split_args(argv)
    if not folder.is_dir():
        raise UserError(f"no folder {str(folder)!r} to open: name one that exists"
                        " (python -m streamlab lab FOLDER), or none for the current folder")
    if importlib.util.find_spec("jupyterlab") is None:
        raise UserError(f"JupyterLab is not installed for {sys.executable}:"
                        " pip install 'jupyterlab>=4' (make setup installs it with the course)")
    root = is_root()
    if root:
        print(ROOT_LINE, file=sys.stderr)
    cmd = command(folder, flags, root=root)
    sys.stdout.flush()
    sys.stderr.flush()
    run(cmd[0], cmd)  # os.execv does not return: this process is JupyterLab from here on
    return 0


if __name__ == "__main__":
    sys.exit(main())
