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

matplotlib is not imported ahead: it reads ``MPLBACKEND`` when it is
imported, and ipykernel sets that as the kernel starts.
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from streamlab.lab.setups.runner import WARM_PRELOAD, _child_env, warm_starts
from streamlab.net import warm

__all__ = ["KERNEL_PRELOAD", "WarmKernelManager", "warm_kernels"]

# What a kernel imports before a chapter's first cell, with what a chapter's first cells import. Not ipykernel's
# kernelapp: its class reads JPY_PARENT_PID as it is defined (the parent a kernel watches, to exit with it), so it is
# imported in the child, with the launch's env (a tenth of a second once the rest is in). Not matplotlib (below).
KERNEL_PRELOAD = ("ipykernel.ipkernel", "pandas", "streamlab.client.timed")


class WarmKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels the warm starter forks, where one runs and may (else started fresh).

    Either way a kernel gets the environment the servers get (this streamlab first on ``PYTHONPATH``,
    unbuffered output: ``runner._child_env``), so that one starter, started with it, may fork both.
    """

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        kw["env"] = _child_env(kw.get("env"))
        # Its output on our file descriptors 1 and 2, which a kernel started fresh inherits.
        process = warm.start(kernel_cmd, env=kw["env"], cwd=kw.get("cwd"), stdout_fd=1, stderr_fd=2, new_session=True)
        if process is None:
            await super()._async_launch_kernel(kernel_cmd, **kw)
            return
        provisioner = self.provisioner
        assert provisioner is not None
        provisioner.process = process  # type: ignore[attr-defined]  # poll, wait, send_signal, kill: as Popen's
        provisioner.pid = provisioner.pgid = process.pid  # type: ignore[attr-defined]  # its own session
        provisioner.cwd = kw.get("cwd") or os.getcwd()  # type: ignore[attr-defined]
        self._reconcile_connection_info(provisioner.connection_info)


def warm_kernels() -> Any:
    """A warm starter (``runner.warm_starts``) that forks the kernels as well as the model servers: the context
    manager, yielding its socket. ``run-notebooks`` keeps one for the run, the tests one per test process."""
    return warm_starts(preload=(*WARM_PRELOAD, *KERNEL_PRELOAD), modules=("streamlab", "ipykernel_launcher"))
