"""A chapter's kernel, forked by the run's warm starter: it skips importing IPython, pandas, torch and transformers.

``run-notebooks`` executes each chapter in a fresh kernel, ``python -m
ipykernel_launcher -f CONNECTION_FILE``, and the first cells of most
chapters import the same libraries again: a second or two per chapter,
several where a chapter loads the model itself. Inside ``warm_kernels()``
there is one warm starter (``streamlab.net.warm``) that has imported them,
and :class:`WarmKernelManager` asks it for each kernel instead of starting
one: the kernel is forked with the launch's own command, environment,
folder and a session of its own (the kernel manager signals its process
group, as it does a kernel it started), its output where a fresh kernel's
would go. The model servers the chapters start are forked by the same
starter (``streamlab.lab.setups.runner.warm_starts``). Where the starter
may not fork the kernel (an environment that differs), it starts fresh.

matplotlib is not imported ahead: it reads ``MPLBACKEND``, which the
kernel's environment sets, when it is imported.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from jupyter_client.manager import AsyncKernelManager

from streamlab.lab.setups.runner import WARM_PRELOAD, _child_env, warm_starts
from streamlab.net import warm

__all__ = ["KERNEL_PRELOAD", "WarmKernelManager", "warm_kernels"]

# What a kernel imports before a chapter's first cell, with what a chapter's first cells import (not matplotlib).
KERNEL_PRELOAD = ("ipykernel.kernelapp", "pandas", "streamlab.client.timed")


class WarmKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels the warm starter forks, where one runs and may (else started fresh)."""

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        process = warm.start(kernel_cmd, env=kw.get("env"), cwd=kw.get("cwd"), stdout_fd=sys.stdout.fileno(),
                             stderr_fd=sys.stderr.fileno(), new_session=True)
        if process is None:
            await super()._async_launch_kernel(kernel_cmd, **kw)
            return
        provisioner = self.provisioner
        assert provisioner is not None
        provisioner.process = process  # type: ignore[attr-defined]  # poll, wait, send_signal, kill: as Popen's
        provisioner.pid = provisioner.pgid = process.pid  # type: ignore[attr-defined]  # its own session
        provisioner.cwd = kw.get("cwd") or os.getcwd()  # type: ignore[attr-defined]
        self._reconcile_connection_info(provisioner.connection_info)


@contextmanager
def warm_kernels() -> Iterator[str | None]:
    """While inside, the kernels (through :class:`WarmKernelManager`) and the servers are forked: the socket.

    The kernels get the environment the servers get (this streamlab first on ``PYTHONPATH``, unbuffered
    output), so that one starter, started with it, may fork them all.
    """
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "PYTHONUNBUFFERED")}
    os.environ.update({name: value for name, value in _child_env(None).items() if name in saved})
    try:
        with warm_starts(preload=(*WARM_PRELOAD, *KERNEL_PRELOAD), modules=("streamlab", "ipykernel_launcher")) as path:
            yield path
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
