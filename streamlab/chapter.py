"""Small helpers the chapters share: where things are, showing source, recording figures and runs, saving charts.

Every chapter records its headline figures to a JSON file named by its
``results_path`` parameter, so ``make run`` can print them and the notebook
tests can assert them from the executed notebook itself.

A chapter that needs what an earlier one already measured reads that run back
instead of generating it again (``recorded``): chapter 2 records its three
ways of delivering to ``build/runs/``, chapters 3 and 4 read them when they
match, and make them (and record them) when they run alone.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .figures import save_figures  # noqa: F401 - the chapters' first cell: every figure shown is also saved

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
NOTEBOOKS = REPO / "notebooks"
BUILD = REPO / "build"
RUNS = BUILD / "runs"
# Set by ``run-notebooks`` for the chapters it executes: a recording made
# under the same value was made earlier in the same run of the book.
RUN_ID = "STREAMLAB_RUN_ID"


def load_prompts() -> list[dict[str, str]]:
    """The 20 paragraph openings and the human continuations they were cut from."""
    return json.loads((DATA / "prompts.json").read_text(encoding="utf-8"))


def bare_tokenizer(model_name: str | None = None) -> Any:
    """The model's tokenizer for counting tokens, without importing transformers (and torch) when it can.

    A chapter that only counts tokens reads the model folder's
    ``tokenizer.json`` with the ``tokenizers`` library that transformers'
    fast tokenizers run on (the same ids, in 0.1 s instead of ~5 s of
    imports); a model without one gets ``load_tokenizer``'s. Count with
    ``streamlab.metrics.count_tokens``, which takes either.
    """
    from .model import load_tokenizer, resolve_model

    folder = Path(resolve_model(model_name)[1])
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    return load_tokenizer(model_name)


def show_source(obj: Any) -> Any:
    """Display the library's real source for ``obj``: the chapter never pastes a copy."""
    from IPython.display import Code

    return Code(inspect.getsource(obj), language="python")


def _plain(value: Any) -> Any:
    """Make numpy scalars, NaN and tuples JSON-friendly."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def record(results_path: str | Path | None, headline: str, **figures: Any) -> dict[str, Any]:
    """Write the chapter's headline and figures as JSON (when a path is given) and return them."""
    payload = {"headline": headline, "figures": _plain(figures)}
    if results_path:
        path = Path(results_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(headline)
    return payload


# --------------------------------------------------------------------------
# Runs shared between chapters
# --------------------------------------------------------------------------


def runs_folder(results_path: str | Path | None = None) -> Path:
    """Where the chapters of one run of the book record runs for each other.

    Beside the results folder (``build/runs/`` for ``make run``; a test's own
    temporary folder in CI, so tests never share), else ``build/runs/``.
    """
    return Path(results_path).resolve().parent.parent / "runs" if results_path else RUNS


@dataclass
class Recorded:
    """A run read back, or made now: its value, and where it came from."""

    name: str
    value: Any
    by: str  # the chapter that made it, e.g. "chapter 2"
    made_at: float  # time.time() when it was recorded
    run: str | None  # the RUN_ID it was made under
    path: Path
    made_here: bool

    @property
    def source(self) -> str:
        """Where the data came from, for the chapter's prose."""
        if self.made_here:
            return "generated here"
        if self.run and self.run == os.environ.get(RUN_ID):
            return f"recorded by {self.by} in this run"
        return f"recorded by {self.by} on {time.strftime('%Y-%m-%d at %H:%M', time.localtime(self.made_at))}"


def _json_key(key: Any) -> Any:
    """The key as JSON gives it back (tuples become lists), so a fresh key compares equal to a saved one."""
    return json.loads(json.dumps(_plain(key), ensure_ascii=False))


def recorded(
    name: str,
    key: dict[str, Any],
    make: Callable[[], Any],
    *,
    by: str,
    folder: str | Path | None = None,
    dump: Callable[[Any], Any] = lambda value: value,
    load: Callable[[Any], Any] = lambda data: data,
    covers: Callable[[dict[str, Any], dict[str, Any]], bool] | None = None,
    reuse: bool = True,
) -> Recorded:
    """Read the run ``name`` back when it was recorded with a matching ``key``; else ``make`` it and record it.

    ``key`` says what the run was made with (model, prompts, seed, sizes): a
    recording is used only when ``covers(saved_key, key)`` (equality unless
    given), so a chapter never reads figures made for other sizes. ``dump``
    and ``load`` turn the value into JSON and back. The chapter that owns an
    experiment passes ``reuse=False``: it always measures, and records what it
    measured for the chapters after it.
    """
    path = Path(folder or RUNS) / f"{name}.json"
    key = _json_key(key)
    if reuse and path.exists():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            if (covers or (lambda old, new: old == new))(saved["key"], key):
                return Recorded(name, load(saved["value"]), saved["by"], saved["made_at"], saved.get("run"), path, False)
        except (ValueError, KeyError, TypeError):
            pass  # a damaged or older recording: make it again
    value = make()
    payload = {"name": name, "key": key, "by": by, "made_at": time.time(), "run": os.environ.get(RUN_ID),
               "value": dump(value)}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(payload, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, path)  # a reader never sees half a recording
    return Recorded(name, value, by, payload["made_at"], payload["run"], path, True)


# --------------------------------------------------------------------------
# Servers a chapter needs, started together
# --------------------------------------------------------------------------


def start_servers(servers: dict[str, Sequence[str]], *, model_name: str | None = None) -> dict[str, Any]:
    """Start every server a chapter needs at once (``label -> serve arguments``): label -> running server.

    Each start is seconds of imports and loading the model, so a chapter
    starts its servers once, together, at the top, and stops them at the end.
    ``model_name`` adds ``--model`` to every server that loads one (not to
    ``--upstream`` relays). If one fails, the others are stopped and its error raised.
    """
    from .runner import server_command

    def args(extra: Sequence[str]) -> list[str]:
        relay = "--upstream" in extra or "--scripted-rate" in extra
        return [*extra, *(["--model", model_name] if model_name and not relay else [])]

    return _start_together({label: server_command(*args(extra)) for label, extra in servers.items()}, "streamlab-serve")


def start_proxies(proxies: dict[str, Sequence[str]]) -> dict[str, Any]:
    """Start every ``python -m streamlab proxy`` a chapter needs at once (``label -> proxy arguments``)."""
    from .runner import proxy_command

    return _start_together({label: proxy_command(*extra) for label, extra in proxies.items()}, "streamlab-proxy")


def start_platforms(platforms: dict[str, Sequence[str]]) -> dict[str, Any]:
    """Start every ``python -m streamlab platform`` a chapter needs at once (``label -> platform arguments``)."""
    from .platform import platform_command

    return _start_together({label: platform_command(*extra) for label, extra in platforms.items()}, "streamlab-platform")


def _start_together(commands: dict[str, list[str]], name: str) -> dict[str, Any]:
    """Start each command (one that says ``listening on URL``) in a thread of its own; label -> running process."""
    from .runner import start_process

    with ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
        futures = {label: pool.submit(start_process, cmd, name=name) for label, cmd in commands.items()}
        started, failed = {}, None
        for label, future in futures.items():
            try:
                started[label] = future.result()
            except Exception as exc:  # noqa: BLE001 - stop the others, then say which failed
                failed = failed or exc
    if failed is not None:
        for running in started.values():
            running.stop()
        raise failed
    return started
