"""The kernel's bounds on a silent peer (``tune_socket``), and the vanished-reader experiment's refusal to pretend.

Chapter 5's test measures the whole thing in a network namespace (a reader
cut off by nftables mid-answer); these check the pieces in milliseconds.
"""

from __future__ import annotations

import socket
import sys

import pytest

from streamlab.lab.experiments import vanished
from streamlab.server.config import ServerConfig
from streamlab.server.transport.connection import KEEPALIVE_PROBES, tune_socket

linux = pytest.mark.skipif(sys.platform != "linux", reason="TCP_USER_TIMEOUT and TCP_KEEPIDLE are Linux's names")


@linux
def test_the_bounds_are_set_on_the_socket():
    with socket.socket() as sock:
        tune_socket(sock, user_timeout=1.5, keepalive=30)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 1500  # milliseconds
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == KEEPALIVE_PROBES


@linux
def test_zero_leaves_the_kernels_defaults():
    with socket.socket() as sock:
        before = (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
                  sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))
        tune_socket(sock, user_timeout=0, keepalive=0)
        assert (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)) == before == (0, 0)


def test_the_server_bounds_a_silent_peer_by_default():
    config = ServerConfig()
    assert config.tcp_user_timeout == config.write_timeout > 0 and config.tcp_keepalive > 0


def test_the_experiment_says_why_it_cannot_run(monkeypatch):
    from streamlab.net import processes

    real = processes.find_program
    monkeypatch.setattr(vanished, "find_program", lambda tool, *also: None if tool == "nft" else real(tool, *also))
    assert vanished.run() == {"skipped": "nft is not installed (Debian: util-linux, nftables, iproute2)"}
