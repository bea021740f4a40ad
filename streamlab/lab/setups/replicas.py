"""More than one server (chapter 13): replicas behind nginx, workers as processes, one shared log in Redis.

The pieces a chapter or a test puts together:

- ``worker_in_process(lm, url)``: a ``Worker`` on an event loop of its own, in
  a thread of this process (the tests' fake model, the benchmark);
- ``start_workers(url, n)``: ``python -m streamlab worker`` processes, each
  loading the model once, started together;
- ``start_replicas(n, events=url)``: ``python -m streamlab serve`` processes
  with no model of their own (a scripted source answers their other routes),
  their ``/generations`` in the shared log when ``events`` is given;
- ``run_balancer(ports)``: real nginx in front of them, round-robin, no
  buffering (``hops/nginx.py``).
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from streamlab.hops.nginx import NginxProcess, run_nginx
from streamlab.lab.setups.runner import RunningServer, all_started, start_process, start_servers
from streamlab.server.resources.shared_log import open_client
from streamlab.server.resources.worker import Worker
from streamlab.server.store.shared import SharedStore

WORKER_READY = re.compile(r"ready on (redis://[^\s:/]+:(\d+))")
# A replica's own routes (/ws, /stream) answer from a scripted source at this rate: no model in the replicas.
REPLICA_RATE = 30.0


class InProcessWorker:
    """A ``Worker`` running on its own loop in a thread: ``stop()`` lets it finish its job, ``crash()`` does not."""

    def __init__(self, lm: Any, url: str, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="streamlab-worker", daemon=True)
        self.thread.start()
        self.worker: Worker = self._call(self._make(lm, url, options))
        self.stopping: asyncio.Event = self._call(self._event())
        self.running: asyncio.Task | None = None  # the worker's run, as a task of its loop
        self.task = asyncio.run_coroutine_threadsafe(self._run(), self.loop)

    async def _run(self) -> None:
        self.running = asyncio.current_task()
        await self.worker.run(self.stopping)

    async def _make(self, lm: Any, url: str, options: dict) -> Worker:
        # The replicas' conversations, as the worker command opens them (a store of its own: a writer of its own).
        options.setdefault("store", SharedStore.open(url))
        return Worker(lm, open_client(url), **options)

    async def _event(self) -> asyncio.Event:
        return asyncio.Event()

    def _call(self, coroutine: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @property
    def name(self) -> str:
        return self.worker.name

    def crash(self) -> None:
        """Stop at once, mid-answer, acknowledging nothing: what ``kill -9`` does to a worker process.

        The run is cancelled on its loop and waited for (its jobs cancelled,
        their generations stopped): a cancelled future would say "done" at
        once, while the worker's jobs still ran on the loop about to close.
        """
        self._call(self._cancel())
        self._settle(crashed=True)

    async def _cancel(self) -> None:
        if self.running is not None and not self.running.done():
            self.running.cancel()
            await asyncio.wait([self.running])

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)
        self._settle()

    async def _quiet(self, timeout: float = 2.0) -> None:
        """Let what else runs on the loop end first: a blocking read still waiting (its block is 0.5 s) would
        otherwise be left behind on a closed loop (fakeredis's shared server then fails every later write)."""
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=timeout)

    def _settle(self, crashed: bool = False) -> None:
        try:
            self.task.result(30)
        except BaseException:  # noqa: BLE001 - a crash is a cancelled task
            pass
        self._call(self._quiet())
        self._call(self.worker.redis.aclose())
        if self.worker.store is not None and not crashed:  # a crash closes nothing: what it wrote stays as it was
            self.worker.store.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@contextmanager
def worker_in_process(lm: Any, url: str, **options: Any) -> Iterator[InProcessWorker]:
    """``with worker_in_process(lm, redis.url, claim_idle=1.0) as w:`` a worker over ``lm`` in this process."""
    worker = InProcessWorker(lm, url, **options)
    try:
        yield worker
    finally:
        if not worker.loop.is_closed():
            worker.stop()


def worker_command(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "streamlab", "worker", "--redis", url, "--exit-on-stdin-eof", *args]


def start_worker(url: str, *args: str) -> RunningServer:
    return start_process(worker_command(url, *args), name="streamlab-worker", ready=WORKER_READY)


def start_workers(url: str, count: int, *args: str) -> list[RunningServer]:
    """``count`` worker processes at once (each loads the model: about a second apiece for SmolLM2-135M)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=count) as pool:
        return all_started([pool.submit(start_worker, url, "--name", f"worker-{i + 1}", *args) for i in range(count)])


def start_replicas(count: int, *, events: str | None = None, grace: float = 30.0,
                   dbs: Sequence[str] | None = None) -> list[RunningServer]:
    """``count`` model-less ``serve`` processes; with ``events`` their ``/generations`` live in that Redis.

    ``dbs``: each replica's SQLite file (the same path twice: two replicas sharing one store, as on one machine).
    """
    extra = ["--scripted-rate", str(REPLICA_RATE), "--grace", str(grace), *(["--events", events] if events else [])]
    started = start_servers({f"replica-{i + 1}": [*extra, *(["--db", dbs[i]] if dbs else [])] for i in range(count)})
    return [started[f"replica-{i + 1}"] for i in range(count)]


@contextmanager
def run_balancer(ports: Sequence[int]) -> Iterator[NginxProcess]:
    """nginx, round-robin over ``ports``, buffering off (event streams pass at once), WebSockets upgraded."""
    with run_nginx(list(ports), buffering=False) as nginx:
        yield nginx
