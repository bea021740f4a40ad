"""What the shared log costs per event: Redis round trips, Redis commands and CPU, against the log in memory.

Both sides run the server's own code, one writer and one reader per round:

- in memory: ``resumable.Run.add`` for each event, a reader following with
  ``Run.follow`` (a list append and a wake-up);
- in Redis: the worker's ``Worker.step`` for each event (one pipelined round
  trip: the guarded script that reads the hash, appends and counts, and
  Redis's time) and a replica's ``SharedRegistry.follow`` (``XREAD BLOCK``) as
  the reader. Redis counts a script's commands as it counts a client's: the
  script, the three it runs, ``TIME``, and the reader's ``XREAD``.

CPU is this process's (``time.process_time``) plus, for Redis, what
redis-server spent (``/proc/PID/stat``, Linux). Rounds alternate the two,
so a busy spell on a shared machine lands on both alike.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from types import SimpleNamespace
import uuid
from typing import Any

from streamlab.model.lifecycle import Piece
from streamlab.server.config import ServerConfig
from streamlab.server.answers.jobs import LogRecord, Ticket
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.resources.resumable import Run
from streamlab.server.resources.shared_log import SharedRegistry, ensure_group, meta_key, open_client
from streamlab.server.resources.worker import Worker

TEXT = " word"  # one piece: a short word, as most tokens are


def server_cpu(pid: int | None) -> float:
    """Seconds of CPU a process has used (user + system), from /proc; 0 where there is none."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def memory_round(events: int) -> dict[str, float]:
    # A run with no generation behind it (an answer that never started): what is measured is its kept events.
    ticket = Ticket(GenerationRequest(prompt="x"), LogRecord(id="1", path="/generations"), [], ())
    run = Run(SimpleNamespace(ticket=ticket, job=None))
    got = 0

    async def read() -> None:
        nonlocal got
        async for event in run.follow(0, 0):
            got += event is not None

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(0)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(events):
        run.add("message", {"text": TEXT})
        await asyncio.sleep(0)  # the reader takes each event before the next is made, as it would live
    run.add("end", {"stop_reason": "max_tokens", "tokens": events}, last=True)
    await reader
    assert got == events + 1
    return {"cpu_us": (time.process_time() - cpu) / events * 1e6, "wall_us": (time.perf_counter() - wall) / events * 1e6,
            "round_trips": 0.0, "commands": 0.0}


async def redis_round(url: str, events: int, redis_pid: int | None) -> dict[str, float]:
    writer_client, reader_client = open_client(url), open_client(url)
    try:
        await ensure_group(writer_client)
        worker = Worker(None, writer_client, name="bench")
        registry = SharedRegistry(reader_client, ServerConfig(ping_interval=0))
        generation_id = uuid.uuid4().hex
        await writer_client.hset(meta_key(generation_id), mapping={
            "request": "{}", "status": "running", "worker": "bench", "readers": 1, "orphaned_ms": 0,
            "grace_ms": 30000, "tokens": 0})
        reads, got = 0, 0
        xread = reader_client.xread

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await xread(*args, **kwargs)

        reader_client.xread = counted

        async def read() -> None:
            nonlocal got
            async for event in registry.follow(generation_id, "0-0"):
                got += event is not None

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0.01)
        before = int((await writer_client.info("stats"))["total_commands_processed"])
        cpu, server, wall = time.process_time(), server_cpu(redis_pid), time.perf_counter()
        for number in range(1, events + 1):
            await worker.step("0-0", generation_id, Piece(TEXT, 0.0, number), number)
        await worker.finish("0-0", generation_id, "end", worker._ending("max_tokens", events))
        await reader
        elapsed = time.perf_counter() - wall
        used = time.process_time() - cpu + server_cpu(redis_pid) - server
        after = int((await writer_client.info("stats"))["total_commands_processed"])
        assert got == events + 1
        return {"cpu_us": used / events * 1e6, "wall_us": elapsed / events * 1e6,
                "round_trips": (events + 1 + reads) / events, "commands": (after - before - 1) / events}
    finally:
        await writer_client.aclose()
        await reader_client.aclose()


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


async def compare(url: str, *, events: int = 300, rounds: int = 5, redis_pid: int | None = None) -> dict[str, Any]:
    """``rounds`` alternating rounds of ``events`` each: per-event figures for both logs, and their ratio per round."""
    rows: list[dict[str, Any]] = []
    await memory_round(20)  # warm both paths once: imports, connections, the first pipeline
    await redis_round(url, 20, redis_pid)
    for number in range(rounds):
        memory = await memory_round(events)
        shared = await redis_round(url, events, redis_pid)
        rows.append({"round": number + 1, "memory": memory, "redis": shared,
                     "cpu_ratio": shared["cpu_us"] / memory["cpu_us"]})
    return {
        "events": events, "rounds": rounds, "rows": rows,
        "memory_cpu_us": spread([r["memory"]["cpu_us"] for r in rows]),
        "redis_cpu_us": spread([r["redis"]["cpu_us"] for r in rows]),
        "cpu_ratio": spread([r["cpu_ratio"] for r in rows]),
        "redis_wall_us": spread([r["redis"]["wall_us"] for r in rows]),
        "round_trips": spread([r["redis"]["round_trips"] for r in rows]),
        "commands": spread([r["redis"]["commands"] for r in rows]),
    }
