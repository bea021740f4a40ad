"""The helpers every layer shares for child processes (streamlab.net.processes) and for interim answers (http_head)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from streamlab.net import processes
from streamlab.protocol.http_head import FinalResponseParser, is_interim

pytestmark = pytest.mark.timeout(60)

FINAL = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"


@pytest.mark.parametrize("interim", [b"", b"HTTP/1.1 100 Continue\r\n\r\n",
                                     b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"])
def test_the_final_response_comes_after_every_interim_one_however_the_bytes_are_cut(interim):
    data = interim + FINAL
    for cut in range(len(data) + 1):
        parser = FinalResponseParser()
        response, unread = parser.feed(data[:cut]), data[cut:]
        if response is None:
            response, unread = parser.feed(data[cut:]), b""
        assert response is not None and response.status == 200, cut
        assert parser.rest + unread == b"hi"  # the body's first bytes, whatever came with the head


def test_101_is_final_not_interim():
    assert is_interim(100) and is_interim(103) and not is_interim(101) and not is_interim(200)
    parser = FinalResponseParser()
    response = parser.feed(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x01a")
    assert response is not None and response.status == 101 and parser.rest == b"\x81\x01a"


def test_stop_process_insists_on_the_whole_group_when_sigterm_is_ignored():
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None and process.stdout.readline() == b"up\n"
    started = time.monotonic()
    assert processes.stop_process(process, 0.5, group=True) == -signal.SIGKILL
    assert time.monotonic() - started < 5


def test_stop_process_returns_the_code_of_one_that_already_ended():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    assert processes.stop_process(process) == 3


def test_the_open_files_limit_only_rises():
    resource = pytest.importorskip("resource")
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert processes.raise_open_files_limit(1) == soft  # already above: unchanged
    assert processes.raise_open_files_limit() >= soft


def test_wait_for_port_says_ready_exited_or_timed_out():
    import socket

    free_port, wait_for_port = processes.free_port, processes.wait_for_port
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert wait_for_port(alive, port, 5) is None
            assert wait_for_port(alive, port, 0.3, answers=lambda sock: False) == "timeout"
            assert wait_for_port(alive, free_port(), 0.3) == "timeout"
        finally:
            alive.kill()
            alive.wait()
    assert wait_for_port(alive, port, 5) == "exited"
