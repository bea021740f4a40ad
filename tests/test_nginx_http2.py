"""nginx's configuration says HTTP/2 the way the installed nginx reads it: ``listen ... ssl http2;`` up to 1.25.0,
``http2 on;`` in a server block of its own from 1.25.1 (where the ``listen`` parameter is deprecated)."""

from __future__ import annotations

import re

import pytest

from streamlab.hops import tls
from streamlab.hops.nginx import HTTP2_DIRECTIVE_SINCE, find_nginx, nginx_version, write_config
from streamlab.lab.experiments.connection_limit import NGINX_LOCATION


def lines(tmp_path):
    cert = tls.Certificate(tmp_path / "cert.pem", tmp_path / "key.pem", "pin")
    return cert, tls.listen_lines(cert, http1_port=8441, http2_port=8442)


def servers(config: str) -> list[str]:
    return re.split(r"\n    server \{", config)[1:]


@pytest.mark.parametrize("version", [None, (1, 22, 1), (1, 25, 0)])
def test_an_nginx_before_1_25_1_gets_http2_on_its_listen_line(tmp_path, version):
    _, extra = lines(tmp_path)
    config = write_config(tmp_path, 8080, 9000, extra=extra, location=NGINX_LOCATION, version=version).read_text()
    assert "listen 127.0.0.1:8442 ssl http2;" in config and "http2 on;" not in config
    assert len(servers(config)) == 1


@pytest.mark.parametrize("version", [HTTP2_DIRECTIVE_SINCE, (1, 27, 4)])
def test_from_1_25_1_the_http2_port_gets_a_server_of_its_own_with_http2_on(tmp_path, version):
    cert, extra = lines(tmp_path)
    config = write_config(tmp_path, 8080, 9000, extra=extra, location=NGINX_LOCATION, version=version).read_text()
    assert "ssl http2" not in config
    main, h2 = servers(config)
    # http2 on applies to every listen of its server: the HTTP/1.1 port and the plain one must not be in it
    assert "http2 on;" not in main and "listen 127.0.0.1:8441 ssl;" in main and "listen 127.0.0.1:8080;" in main
    assert "8442" not in main
    assert "listen 127.0.0.1:8442 ssl;" in h2 and "http2 on;" in h2 and h2.count("listen") == 1
    for server in (main, h2):  # the same certificate and the same locations on both
        assert f"ssl_certificate {cert.cert.resolve()};" in server
        assert "location / {" in server and "location /ws {" in server and "proxy_buffering off;" in server


@pytest.mark.skipif(find_nginx() is None, reason="nginx is not installed")
def test_the_installed_nginx_says_its_version():
    version = nginx_version()
    assert version is not None and len(version) == 3 and version >= (1, 0, 0)
