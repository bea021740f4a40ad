"""``GET /debug/queues``: where a slow reader's bytes are waiting right now, layer by layer.

Read-only, cheap, and answered only to a client on this machine (the peer
addresses of every connection are in it). For each open connection: the bytes
in asyncio's transport buffer (``write_buffer``: what ``writer.write`` took
and the socket would not), and the bytes in the kernel's send queue
(``kernel_unsent``: written to the socket, not yet acknowledged by the peer;
Linux only, else None). For each running generation: its tokens and its
:class:`~streamlab.model.backlog.Backlog` counters (pieces queued now, the most
queued, how long it has been waiting for its reader). For each reader waiting
in line for a generation: its place and how long it has waited. And the
process's resident memory. :mod:`streamlab.lab.experiments.backpressure` samples it a few times a
second; anyone can ``curl`` it.

The handler passes in the connections and generations to report, so that
this module needs nothing of the server that owns them (``app`` imports
``queues``, never the other way).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import struct
import termios
import time
from typing import TYPE_CHECKING, Any, Iterable

from streamlab.protocol.http_fields import HTTPError

if TYPE_CHECKING:
    from streamlab.server.transport.connection import ClientConnection
    from streamlab.server.answers.jobs import StartedJob, Ticket


def kernel_unsent(sock: Any) -> int | None:
    """Bytes in a TCP socket's send queue: not yet sent, or sent and not acknowledged (Linux's SIOCOUTQ)."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
    except (OSError, AttributeError, ValueError):
        return None
    return struct.unpack("i", raw)[0]


def rss_bytes() -> int | None:
    """This process's resident memory now (``/proc/self/statm``; None where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def is_loopback(client: ClientConnection) -> bool:
    peer = client.writer.get_extra_info("peername")
    try:
        return ipaddress.ip_address(peer[0]).is_loopback
    except (TypeError, ValueError, IndexError):
        return False


def _peer(client: ClientConnection) -> str:
    peer = client.writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"


def snapshot(asker: ClientConnection, clients: Iterable[ClientConnection], running: Iterable[StartedJob],
             waiting: Iterable[Ticket] = ()) -> dict[str, Any]:
    """Every connection's buffers, every running generation's backlog, the line, the process's memory.

    The asker's own connection is skipped: its buffers hold nothing but this answer.
    """
    if not is_loopback(asker):
        raise HTTPError(403, "/debug/queues answers only this machine")
    connections = []
    for client in list(clients):
        if client is asker:
            continue
        transport = client.writer.transport
        connections.append({
            "peer": _peer(client),
            "write_buffer": transport.get_write_buffer_size(),
            "kernel_unsent": kernel_unsent(client.writer.get_extra_info("socket")),
            "bytes_sent": client.bytes_sent,
        })
    generations = []
    for job in list(running):
        generation = job.generation
        backlog = getattr(generation, "backlog", None)
        generations.append({
            "id": job.record.id,
            "path": job.record.path,
            "tokens": job.record.tokens,
            "pieces_sent": job.record.pieces_sent,
            "stopping": bool(getattr(generation, "stopping", False)),
            "stopped_by": generation.stopped_by,
            "ended": generation.result is not None,
            **(backlog.snapshot() if backlog is not None else {}),
        })
    now = time.monotonic()
    line = [{"id": t.record.id, "path": t.record.path, "ahead": t.ahead, "waited_s": now - t.arrived}
            for t in list(waiting)]
    return {"time": time.time(), "rss_bytes": rss_bytes(), "connections": connections, "generations": generations,
            "waiting": line}
