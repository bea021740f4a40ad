"""A reader whose network vanishes mid-answer: no FIN, no RST, nothing at all. When does the server notice?

A phone that goes to sleep or loses its signal closes nothing: its packets
just stop. The server's EOF watch never fires (no FIN comes), no write
fails while the bytes still fit in the socket buffers, and TCP itself
retransmits for about fifteen minutes before it gives up. This experiment
makes such a reader for real, inside a network namespace of its own
(``unshare -n``: a private loopback, nothing else on any network): the
reader reads a few pieces, then an nftables rule drops every packet to and
from its port, mid-answer. Two servers stream to such readers side by side,
both over the scripted source (the question is the server's, not the
model's): one with the kernel's defaults (``--tcp-user-timeout 0
--tcp-keepalive 0``, only the write timeout to catch it), one that asks the
kernel to give up after ``user_timeout`` seconds of unacknowledged bytes
(``TCP_USER_TIMEOUT``, ``streamlab.server.transport.connection.tune_socket``).
For each: when it noticed, by which signal, and the tokens it made for nobody.

Where no namespace can be made (not root, no user namespaces) or nftables
is missing, :func:`run` says why instead of measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from streamlab.client import timed as client
from streamlab.net.processes import find_program

PROMPT = "Tell me about lighthouses."
TABLE = "streamlab_vanished"  # the nftables table the experiment makes, in its own namespace only
DEFAULTS = "kernel defaults (write timeout only)"


TOOLS = ("unshare", "nft", "ip")  # util-linux, nftables, iproute2


def unavailable_reason() -> str | None:
    """Why the experiment cannot run here (None: it can)."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    for tool in TOOLS:
        if find_program(tool) is None:
            return f"{tool} is not installed (Debian: util-linux, nftables, iproute2)"
    return None


def _tool(name: str) -> str:
    """The path of one of :data:`TOOLS` (found on PATH or in /usr/sbin: ``unavailable_reason`` checked it)."""
    return find_program(name) or name


def _namespace_command() -> list[str]:
    """``unshare -n`` as root; ``unshare -rn`` (a user namespace, root inside it) for anyone else."""
    return [_tool("unshare"), "-n" if os.geteuid() == 0 else "-rn"]


def run(*, tokens: int = 80, rate: float = 20.0, drop_after: int = 10, user_timeout: float = 1.0,
        timeout: float = 60.0) -> dict[str, Any]:
    """Both servers, each with a reader that vanishes after ``drop_after`` pieces: ``{"rows": [...]}``.

    Or ``{"skipped": why}`` where it cannot run. Each row: the server, the
    tokens the reader had, the tokens made in all and for nobody, the
    signal the server noticed by (None: it never did, before the answer's
    end), and after how many seconds.
    """
    why = unavailable_reason()
    if why is not None:
        return {"skipped": why}
    settings = {"tokens": tokens, "rate": rate, "drop_after": drop_after, "user_timeout": user_timeout}
    command = [*_namespace_command(), sys.executable, "-m", "streamlab.lab.experiments.vanished", "--inside",
               json.dumps(settings)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_repo(), os.environ.get("PYTHONPATH", "")) if p)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"skipped": f"the experiment did not end within {timeout:.0f} s"}
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no word"])[-1]
        return {"skipped": f"the namespace could not be used: {said}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _repo() -> str:
    from streamlab.lab.results.records import REPO

    return str(REPO)


# -- inside the namespace ----------------------------------------------------------------------


def _drop(port: int) -> None:
    """Every packet to or from ``port`` dropped from now on, where it arrives: the reader's network is gone.

    Dropped on the input hook, not the output one: a packet dropped on its way out is refused to the
    sending socket (EPERM), and the server would hear of the drop from its own kernel at once, which a
    phone that went to sleep never tells it. Dropped on arrival, it is lost as on a network.
    """
    rules = (f"add table inet {TABLE}\n"
             f"add chain inet {TABLE} in {{ type filter hook input priority 0; policy accept; }}\n"
             f"add rule inet {TABLE} in tcp sport {port} drop\n"
             f"add rule inet {TABLE} in tcp dport {port} drop\n")
    subprocess.run([_tool("nft"), "-f", "-"], input=rules, text=True, check=True, capture_output=True)


def _read_then_vanish(port: int, body: dict, drop_after: int, out: dict) -> None:
    """Ask for an answer on a raw socket, read ``drop_after`` pieces, then cut the network under it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    seen, data = 0, b""
    while seen < drop_after:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        seen = data.count(b'data: {"text"')
    out["request_id"] = next((line.split(b":", 1)[1].strip().decode() for line in data.split(b"\r\n")
                              if line.lower().startswith(b"x-request-id:")), None)
    out["pieces"] = seen
    _drop(sock.getsockname()[1])
    out["dropped_at"] = time.time()
    out["socket"] = sock  # held open: the reader never closes, it is just gone


def _inside(settings: dict) -> dict[str, Any]:
    from streamlab.lab.setups.runner import start_listeners

    subprocess.run([_tool("ip"), "link", "set", "lo", "up"], check=True)
    user_timeout = settings["user_timeout"]
    listeners = start_listeners({
        DEFAULTS: ["--tcp-user-timeout", "0", "--tcp-keepalive", "0"],
        f"--tcp-user-timeout {user_timeout:g}": ["--tcp-user-timeout", f"{user_timeout:g}"],
    }, model=["--scripted-rate", f"{settings['rate']:g}"])
    body = {"prompt": PROMPT, "max_tokens": settings["tokens"], "ignore_eos": True, "chat": False}
    readers = {label: {} for label in listeners}
    try:
        threads = [threading.Thread(target=_read_then_vanish, args=(server.port, body, settings["drop_after"],
                                                                    readers[label]))
                   for label, server in listeners.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        answer_seconds = settings["tokens"] / settings["rate"]
        rows = []
        for label, server in listeners.items():
            reader = readers[label]
            record = client.wait_log_sync(server.port, reader["request_id"], timeout=answer_seconds + 30)
            noticed = record["stop_signal"]
            rows.append({
                "server": label,
                "pieces read before the network vanished": reader["pieces"],
                "tokens made": record["tokens"],
                "tokens made for nobody": record["tokens"] - reader["pieces"],
                "noticed by": noticed,
                "noticed after (s)": round(record["ended"] - reader["dropped_at"], 2) if noticed else None,
                "stored as": record["stored_reason"],
            })
    finally:
        for server in listeners.values():
            server.stop()
        for reader in readers.values():
            if "socket" in reader:
                reader["socket"].close()
    return {"rows": rows, "settings": settings, "answer_seconds": answer_seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run inside a network namespace of its own (see run()).")
    parser.add_argument("--inside", required=True, help="the settings, as JSON")
    args = parser.parse_args(argv)
    print(json.dumps(_inside(json.loads(args.inside))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
