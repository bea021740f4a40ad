"""The npm ``openai`` SDK, for the tests and the chapters that read our server the way a JavaScript app would.

Installed once with npm into the cache's ``node/`` folder, beside the
converted model (``npm install --prefix``), and found there afterwards. Two
processes that need it at once (a test worker and a chapter, under ``make
test``'s workers) take turns on a lock file: the second finds the first's
install done, instead of writing into the same ``node_modules`` at the same time.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from pathlib import Path

from streamlab.model.loading import default_cache_dir

__all__ = ["NODE_PREFIX", "OPENAI_NPM_VERSION", "openai_sdk"]

OPENAI_NPM_VERSION = "6.30.1"  # the npm openai SDK (its 7.x needs Node 22; the machines have Node 20)
NODE_PREFIX = default_cache_dir() / "node"  # where npm packages are installed once, beside the converted model


def _installed(modules: Path) -> bool:
    package = modules / "openai" / "package.json"
    return package.is_file() and json.loads(package.read_text())["version"] == OPENAI_NPM_VERSION


def openai_sdk(install: bool = True, timeout: float = 240.0) -> tuple[Path | None, str | None]:
    """``node_modules`` holding the npm openai SDK (installed there with npm on first use), or None and why not."""
    modules = NODE_PREFIX / "node_modules"
    if _installed(modules):
        return modules, None
    if not install or shutil.which("npm") is None:
        return None, f"the npm openai SDK is not installed (npm install --prefix {NODE_PREFIX} openai@{OPENAI_NPM_VERSION})"
    NODE_PREFIX.mkdir(parents=True, exist_ok=True)
    with open(NODE_PREFIX / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one npm at a time in this folder
        if _installed(modules):
            return modules, None
        try:
            done = subprocess.run(["npm", "install", "--prefix", str(NODE_PREFIX), "--no-audit", "--no-fund",
                                   f"openai@{OPENAI_NPM_VERSION}"], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"npm install openai@{OPENAI_NPM_VERSION} took over {timeout:.0f} s (no registry?)"
    if done.returncode != 0 or not _installed(modules):
        return None, f"npm could not install openai@{OPENAI_NPM_VERSION}: {done.stderr.strip()[-200:]}"
    return modules, None
