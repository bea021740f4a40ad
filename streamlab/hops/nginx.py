"""Real nginx in front of our server, run by us from a temporary folder.

Our own proxy (``proxy.py``) shows buffering in its purest form; nginx is
what readers actually deploy, so the experiments also go through it, with
its *defaults*: ``proxy_buffering on``, ``proxy_http_version 1.0`` towards
the upstream, a 60 s ``proxy_read_timeout``. Nothing here tunes nginx for
streaming; the point is to watch what the defaults do to a stream, and that
a single response header (``X-Accel-Buffering: no``) undoes the buffering.

The configuration keeps everything an nginx writes (pid, logs, temporary
files) inside one folder, listens on 127.0.0.1 only, and runs in the
foreground (``daemon off``) so that the process we start is the one we stop.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from streamlab.net.processes import find_program, free_port, stop_process, wait_for_port

__all__ = [
    "CACHE_STATUS",
    "NginxError",
    "NginxProcess",
    "NginxUnavailable",
    "find_nginx",
    "nginx_version",
    "run_nginx",
    "write_config",
]

START_TIMEOUT = 10.0
# With ``cache=True`` every response says what the cache did: HIT, MISS, BYPASS, EXPIRED...
CACHE_STATUS = "X-Cache-Status"
# nginx 1.25.1 turned HTTP/2 from a parameter of ``listen`` (``listen ... ssl http2;``, deprecated from then on, with a
# warning) into a directive of its own, ``http2 on;``, which applies to a whole server block. Debian 12 ships 1.22.
HTTP2_DIRECTIVE_SINCE = (1, 25, 1)
_HTTP2_LISTEN = re.compile(r"^[ \t]*listen[ \t]+(\S+)[ \t]+ssl[ \t]+http2[ \t]*;[ \t]*\n?", re.M)


class NginxUnavailable(RuntimeError):
    """nginx is not installed here: callers (tests, notebooks) skip the experiment."""


class NginxError(RuntimeError):
    """nginx is there but refused the configuration or did not start; carries its error log."""


def find_nginx() -> str | None:
    """The nginx binary: on PATH, or where Debian puts it (/usr/sbin is not on every user's PATH)."""
    return find_program("nginx", "/usr/local/nginx/sbin/nginx")


def nginx_version(binary: str | None = None) -> tuple[int, ...] | None:
    """The installed nginx's version from ``nginx -v`` (which writes it to stderr): ``(1, 22, 1)``; None without one."""
    binary = binary or find_nginx()
    if binary is None:
        return None
    try:
        said = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=START_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", said.stderr + said.stdout)
    return tuple(int(part) for part in found.groups()) if found else None


def _http2_servers(extra: str, version: tuple[int, ...] | None) -> tuple[str, str]:
    """``extra`` for the main server, and the lines of a server block of its own for HTTP/2 ('' for none).

    An nginx older than 1.25.1 (or of a version not known) spells HTTP/2 on
    one port as ``listen ADDRESS ssl http2;``, and ``extra`` stays as it is.
    From 1.25.1, ``http2 on;`` turns HTTP/2 on for every ``listen`` of its
    server, so each such line moves into a server of its own, with that
    directive and the rest of ``extra`` (the certificate and its key):
    beside a ``listen`` meant for HTTP/1.1 alone it would offer h2 there too.
    """
    if version is None or tuple(version) < HTTP2_DIRECTIVE_SINCE or not _HTTP2_LISTEN.search(extra):
        return extra, ""
    addresses = _HTTP2_LISTEN.findall(extra)
    rest = _HTTP2_LISTEN.sub("", extra)
    shared = [line for line in textwrap.dedent(rest).strip().splitlines() if not line.strip().startswith("listen")]
    return rest, "\n".join([*(f"listen {address} ssl;" for address in addresses), "http2 on;", *shared])


def write_config(
    folder: Path,
    listen_port: int,
    upstream_port: int | Sequence[int],
    *,
    buffering: bool | None = None,
    extra: str = "",
    location: str = "",
    cache: bool = False,
    version: tuple[int, ...] | None = None,
) -> Path:
    """Write ``folder/nginx.conf``: nginx's defaults, proxying 127.0.0.1:listen_port to the upstream.

    ``upstream_port`` may be several ports (replicas of one server): then an
    ``upstream`` block holds them and nginx takes them in turn (round-robin),
    passing a request whose connection is refused on to the next one.

    ``buffering=None`` leaves ``proxy_buffering`` unset, i.e. on, as in a
    fresh install; True or False writes it out. ``extra`` is pasted into the
    ``server`` block (e.g. ``"proxy_read_timeout 5s;"``), where both
    locations inherit it; ``location`` goes into ``location /`` alone (e.g.
    ``gzip on;``, which the WebSocket location had better not get). ``cache``
    declares a cache zone in the folder (``proxy_cache streamlab;`` in
    ``location`` uses it) and adds an ``X-Cache-Status`` header to every
    response, so a reader sees what the cache did. ``/ws`` gets the three lines every WebSocket
    behind nginx needs: nginx speaks HTTP/1.0 to upstreams by default, which
    has no ``Upgrade``, and it does not forward hop-by-hop headers.

    When we run as root, the master process would hand the work to a worker
    running as ``nobody``, which cannot write our private folder: ``user
    root`` keeps it ours.

    ``version`` is the nginx that will read the file (``nginx_version()``):
    from 1.25.1 a ``listen ... ssl http2;`` line of ``extra`` is written the
    way that nginx asks for, ``http2 on;`` in a server of its own with the
    same locations (see ``_http2_servers``).
    """
    folder = Path(folder).resolve()
    user = "user root;\n" if os.geteuid() == 0 else ""
    setting = "" if buffering is None else f"\n            proxy_buffering {'on' if buffering else 'off'};"
    setting += _indent(location, 12).replace("\n\n", "\n", 1)
    zone = ""
    if cache:
        zone = (f"\n    proxy_cache_path {folder}/cache levels=1:2 keys_zone=streamlab:1m inactive=10m;"
                f"\n    add_header {CACHE_STATUS} $upstream_cache_status always;")
    upstream, pool, host = f"http://127.0.0.1:{upstream_port}", "", ""
    if not isinstance(upstream_port, int):  # several replicas: round-robin, nginx's default for an upstream block
        servers = "".join(f"\n        server 127.0.0.1:{port};" for port in upstream_port)
        upstream, pool = "http://replicas", f"\n\n    upstream replicas {{{servers}\n    }}"
        # nginx would send "Host: replicas", the block's name, which no server knows itself by: pass the client's
        # (in each location: one that sets any header of its own inherits none from the server block).
        host = "\n            proxy_set_header Host $host;"
    extra, http2 = _http2_servers(extra, version)
    locations = f"""
        location / {{
            proxy_pass {upstream};{host}{setting}
        }}

        location /ws {{
            proxy_pass {upstream};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";{host}
        }}"""
    second = f"\n\n    server {{{_indent(http2, 8)}\n{locations}\n    }}" if http2 else ""
    config = f"""\
# Written by streamlab.hops.nginx: nginx defaults, everything inside {folder}.
daemon off;
master_process on;
worker_processes 1;
{user}pid {folder}/nginx.pid;
error_log {folder}/error.log info;

events {{
    worker_connections 256;
}}

http {{
    # $request_time and $upstream_response_time show where the time went.
    log_format timing '$remote_addr "$request" $status $body_bytes_sent '
                      'request_time=$request_time upstream_time=$upstream_response_time '
                      'upstream=$upstream_addr';
    access_log {folder}/access.log timing;
    client_body_temp_path {folder}/client_body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;{zone}{pool}

    server {{
        listen 127.0.0.1:{listen_port};
{locations}{_indent(extra, 8)}
    }}{second}
}}
"""
    path = folder / "nginx.conf"
    path.write_text(config)
    return path


def _indent(text: str, spaces: int) -> str:
    """``extra`` as a block of its own inside ``server``, or nothing."""
    text = textwrap.dedent(text).strip()
    return "\n\n" + textwrap.indent(text, " " * spaces) if text else ""


@dataclass
class NginxProcess:
    """A running nginx: where it listens and what it logged."""

    port: int
    folder: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        return _read(self.folder / "error.log")

    def access_log(self) -> str:
        return _read(self.folder / "access.log")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


@contextmanager
def run_nginx(
    upstream_port: int | Sequence[int],
    *,
    buffering: bool | None = None,
    extra: str = "",
    port: int = 0,
    location: str = "",
    cache: bool = False,
) -> Iterator[NginxProcess]:
    """Run nginx in front of ``127.0.0.1:upstream_port`` for the duration of a ``with`` block.

    The configuration is checked first (``nginx -t``), so a mistake in
    ``extra`` fails with nginx's own message. nginx runs in the foreground
    in a session of its own; on the way out it gets SIGTERM (a fast stop: a
    graceful SIGQUIT would wait for every open stream to end), and SIGKILL
    for its whole process group if that is not enough.
    """
    binary = find_nginx()
    if binary is None:
        raise NginxUnavailable("nginx is not installed (Debian/Ubuntu: apt-get install nginx-light)")
    folder = Path(tempfile.mkdtemp(prefix="streamlab-nginx-"))
    process: subprocess.Popen | None = None
    try:
        port = port or free_port()
        config = write_config(folder, port, upstream_port, buffering=buffering, extra=extra, location=location,
                              cache=cache, version=nginx_version(binary))
        # -e: the error log before the configuration is read; the compiled-in
        # default (/var/log/nginx) may not be writable.
        base = [binary, "-p", f"{folder}/", "-c", str(config), "-e", str(folder / "error.log")]
        check = subprocess.run([*base, "-t"], capture_output=True, text=True, timeout=START_TIMEOUT)
        if check.returncode != 0:
            raise NginxError(f"nginx -t refused the configuration:\n{check.stderr or _read(folder / 'error.log')}")
        with open(folder / "stderr.log", "wb") as stderr:
            process = subprocess.Popen(
                base, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, start_new_session=True
            )
        nginx = NginxProcess(port, folder, process)
        _wait_until_listening(nginx)
        yield nginx
    finally:
        if process is not None:
            _stop(process)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_until_listening(nginx: NginxProcess) -> None:
    why = wait_for_port(nginx.process, nginx.port, START_TIMEOUT)
    if why == "exited":
        stderr = _read(nginx.folder / "stderr.log")
        raise NginxError(f"nginx exited with {nginx.process.returncode}:\n{stderr}{nginx.error_log()}")
    if why is not None:
        raise NginxError(f"nginx did not listen on port {nginx.port} within {START_TIMEOUT} s:\n{nginx.error_log()}")


def _stop(process: subprocess.Popen) -> None:
    # If the master does not stop its workers in time, SIGKILL goes to the whole
    # group we created, so no orphan worker keeps the port.
    stop_process(process, 5, group=True)
