"""Why the store's file cannot be used, said with its path and the flag that moves it.

sqlite3 says ``unable to open database file`` and ``file is not a database``
without naming the file, and ``mkdir`` under a file says ``FileExistsError``.
The reader of those needs the path and ``--db`` / ``STREAMLAB_DATA``: a
``UserError``, one line at the command line. Nothing here writes to a file
that turns out not to be SQLite: it is left exactly as it was.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from streamlab.net.errors import UserError
from streamlab.server.config import flag

__all__ = ["CHOOSE", "make_folder", "opening", "unusable"]

# The fix for every unusable file.
CHOOSE = f"choose another file with {flag('db_path')}, or another folder with STREAMLAB_DATA"


def make_folder(path: Path) -> None:
    """Make the folder of the file ``path``; a ``UserError`` naming what is in the way when it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        folders = (path.parent, *path.parent.parents)
        in_the_way = next((p for p in folders if p.exists() and not p.is_dir()), path.parent)
        raise UserError(f"cannot create the store {path}: {in_the_way} is a file, not a folder: {CHOOSE}") from None
    except OSError as err:
        raise UserError(f"cannot create the folder {path.parent} for the store {path}: {err.strerror or err}:"
                        f" {CHOOSE}") from None


@contextmanager
def opening(path: Path, close: Callable[[], None]) -> Iterator[None]:
    """Around the opening of ``path``: on any failure ``close()``; a SQLite error becomes a ``UserError``."""
    try:
        yield
    except sqlite3.Error as err:
        close()
        raise unusable(path, err) from err
    except BaseException:
        close()
        raise


def unusable(path: Path, err: sqlite3.Error) -> UserError:
    """Why SQLite could not use ``path``, in words that name it."""
    folder = path.parent
    if path.is_dir():
        return UserError(f"the store {path} is a folder, not a file: {CHOOSE}")
    if isinstance(err, sqlite3.DatabaseError) and "not a database" in str(err):
        return UserError(f"{path} is not a SQLite database (it is left as it was): {CHOOSE}")
    if not path.exists() and not os.access(folder, os.W_OK):
        return UserError(f"cannot create the store {path}: its folder {folder} is not writable: {CHOOSE}")
    if path.exists() and not (os.access(path, os.W_OK) and os.access(folder, os.W_OK)):
        what = path if not os.access(path, os.W_OK) else f"its folder {folder}"  # SQLite writes beside the file too
        return UserError(f"cannot write the store {path}: {what} is read-only: {CHOOSE}")
    return UserError(f"cannot open the store {path}: {err}: {CHOOSE}")
