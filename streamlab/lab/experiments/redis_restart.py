"""What a Redis restart costs the shared log (chapter 13): events appended at a steady rate, ``kill -9``, counted after.

With the append-only file on (``appendonly yes``, ``appendfsync everysec``),
Redis writes every command to the file before it answers and asks the disk
to keep it (``fsync``) once a second. A process killed with SIGKILL loses
nothing it answered: the file's bytes are in the kernel already, and only a
machine that loses power loses the last second. Without the file (``--save
''``, ``--appendonly no``, how ``run_redis`` starts it), a restart comes back
empty: every generation's log is gone, the job queue and its group too.

``restart_loss`` measures it: a writer appends events to one stream at
``rate`` a second, as a worker appends pieces, each answered before the next;
Redis is killed with SIGKILL right after the last answer (the worst moment:
the latest second not yet fsynced); it starts again on the same port and
folder, and the events still there are counted. ``RestartableRedis`` is the
redis-server it uses, one that the replicas' tests kill and start again on
the same port, so that a client reconnects to the same URL.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from streamlab.lab.outside.redis_server import RedisUnavailable, find_redis
from streamlab.net.processes import die_with_parent, free_port, stop_process, wait_for_port
from streamlab.server.resources.shared_log import encode_entry, open_client
from streamlab.server.wire.formats import text_data

START_TIMEOUT = 10.0


def _pongs(sock: socket.socket) -> bool:
    sock.sendall(b"PING\r\n")
    return sock.recv(64).startswith(b"+PONG")  # -LOADING while it reads its file back: not yet


class RestartableRedis:
    """A private redis-server on one port and one folder, that can be killed and started again there.

    ``appendonly``: keep the append-only file (``appendfsync everysec``) in the
    folder, so that a restart finds what was written; else nothing is kept.
    """

    def __init__(self, *, appendonly: bool = True, port: int | None = None) -> None:
        binary = find_redis()
        if binary is None:
            raise RedisUnavailable("redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)")
        self.binary = binary
        self.appendonly = appendonly
        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="streamlab-redis-restart-"))
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start it (again) on its port and folder; the seconds until it answered PING (its file read back)."""
        args = [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "everysec",
                "--dir", str(self.folder), "--logfile", str(self.folder / "redis.log"), "--daemonize", "no",
                "--protected-mode", "yes"]
        began = time.monotonic()
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, cwd=self.folder,
                                        preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
        why = wait_for_port(self.process, self.port, START_TIMEOUT, answers=_pongs)
        if why is not None:
            raise RuntimeError(f"redis-server did not start on port {self.port} ({why}):\n{self.log()[-2000:]}")
        self.starts += 1
        return time.monotonic() - began

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone (its port closed): what a crash does."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 5)

    def log(self) -> str:
        try:
            return (self.folder / "redis.log").read_text(errors="replace")
        except OSError:
            return ""

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def restartable_redis(*, appendonly: bool = True) -> Iterator[RestartableRedis]:
    """``with restartable_redis() as redis:`` started; ``redis.kill()``, ``redis.start()`` again; removed after."""
    redis = RestartableRedis(appendonly=appendonly)
    try:
        redis.start()
        yield redis
    finally:
        redis.remove()


async def _append(url: str, key: str, events: int, rate: float) -> list[float]:
    """``events`` entries at ``rate`` a second, each answered before the next; when each was answered."""
    client = open_client(url)
    answered: list[float] = []
    try:
        began = time.monotonic()
        for number in range(events):
            await asyncio.sleep(max(0.0, began + number / rate - time.monotonic()))
            await client.xadd(key, encode_entry("message", text_data(" word"), number + 1))
            answered.append(time.monotonic())
    finally:
        await client.aclose()
    return answered


async def _count(url: str, key: str) -> int:
    client = open_client(url)
    try:
        return int(await client.xlen(key))
    finally:
        await client.aclose()


def restart_loss(events: int = 300, rate: float = 100.0, *, appendonly: bool = True) -> dict[str, Any]:
    """Append ``events`` at ``rate``/s, SIGKILL Redis after the last answer, restart it, count what is left.

    ``lost_s`` is the loss in seconds of events at that rate (``appendfsync
    everysec`` promises at most about one on a power loss; a killed process
    should lose none). ``restart_s``: from the kill until Redis answered again.
    """
    key = "streamlab:restart-loss:events"
    with restartable_redis(appendonly=appendonly) as redis:
        answered = asyncio.run(_append(redis.url, key, events, rate))
        killed = time.monotonic()
        redis.kill()
        started = redis.start()
        restart_s = time.monotonic() - killed
        kept = asyncio.run(_count(redis.url, key))
    lost = len(answered) - kept
    return {"appendonly": appendonly, "events": len(answered), "rate": rate, "kept": kept, "lost": lost,
            "lost_s": lost / rate, "restart_s": restart_s, "start_s": started,
            "append_s": answered[-1] - answered[0] if answered else 0.0}
