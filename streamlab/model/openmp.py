"""One OpenMP team in the process, so that the thread that runs the model gets the CPU's threads to itself.

torch runs its parallel operations on OpenMP (GNU libgomp in the pip wheels),
and every thread that starts one gets a team of worker threads of its own,
kept after the operation for the next. A server loads the model on its main
thread (the conversions are parallel operations) and then runs it on another
(``BatchedEngine``'s loop, a ``Generation``'s thread): two teams. Once libgomp
counts more of its threads than the machine has cores, it stops letting
idle workers spin and puts them to sleep after every parallel region, and each
operation pays for waking them. Measured on the 2-core machine: one
``Int4Linear`` of the default model took 15 µs on the main thread and 33-64 µs
on a second thread while the main thread's team lived, and the bare decode
loop made 88 tokens/s on the main thread against 37-44 on a thread of its own.
Without the main thread's team, a thread's operations run as fast as the main
thread's (23 µs against 19 µs for a 400,000-element multiply).

``release_idle_team()`` frees the calling thread's team (OpenMP 5's
``omp_pause_resource_all``): the thread that loaded the model calls it right
before it starts the thread that will run it. It is cheap, does nothing where
there is no team, and where torch does not use libgomp (or the library
predates OpenMP 5) it does nothing at all. The caller's next parallel
operation makes a new team, so the main thread should leave the model to the
thread it started.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any

__all__ = ["release_idle_team"]

OMP_PAUSE_SOFT = 1  # omp_pause_soft: free the threads, keep the settings


def _libgomp() -> Any:
    """torch's own libgomp (the copy its operations use), or None where there is none to ask (yet: no torch)."""
    if not sys.platform.startswith("linux") or "torch" not in sys.modules:
        return None
    return _find_libgomp()


@functools.lru_cache(maxsize=1)
def _find_libgomp() -> Any:
    path = None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                name = line.rsplit(" ", 1)[-1].strip()
                if os.path.basename(name).startswith("libgomp"):
                    path = name
                    break
    except OSError:
        return None
    if path is None:
        return None
    try:
        library = ctypes.CDLL(path)
        pause = library.omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause


def release_idle_team() -> bool:
    """Free this thread's idle OpenMP workers before another thread takes the model; True if libgomp did it.

    Only between operations, never inside one (libgomp refuses there, and says so with a non-zero answer).
    """
    pause = _libgomp()
    return bool(pause is not None and pause(OMP_PAUSE_SOFT) == 0)
