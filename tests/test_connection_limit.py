"""Chapter 14's pieces, in process: the certificate and its pin, nginx's TLS and HTTP/2 lines, the stream timings."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import socket
import ssl
import threading

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from streamlab.hops import tls  # noqa: E402
from streamlab.hops.nginx import find_nginx, run_nginx, write_config  # noqa: E402
from streamlab.lab.experiments.connection_limit import NGINX_LOCATION, PathRun, StreamTiming, connections_of  # noqa: E402

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command here")


def der_items(data: bytes):
    """The (tag, whole item, contents) of each DER item in ``data``, in order."""
    i = 0
    while i < len(data):
        tag, length, head = data[i], data[i + 1], 2
        if length & 0x80:
            count = length & 0x7F
            length, head = int.from_bytes(data[i + 2:i + 2 + count], "big"), 2 + count
        yield tag, data[i:i + head + length], data[i + head:i + head + length]
        i += head + length


def spki_by_hand(cert_pem: str) -> bytes:
    """The SubjectPublicKeyInfo of a certificate, walked out of its DER without openssl: tbsCertificate's 7th item."""
    der = ssl.PEM_cert_to_DER_cert(cert_pem)
    (_, _, certificate), = der_items(der)
    _, _, tbs = next(der_items(certificate))
    items = list(der_items(tbs))
    assert items[0][0] == 0xA0  # [0] version: v3
    return items[6][1]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command here")
    return tls.make_certificate(tmp_path_factory.mktemp("tls"))


@needs_openssl
def test_the_pin_is_the_sha256_of_the_certificates_public_key_info(certificate, tmp_path):
    spki = spki_by_hand(certificate.cert.read_text())
    assert certificate.pin == base64.b64encode(hashlib.sha256(spki).digest()).decode()
    assert certificate.chromium_flag() == f"--ignore-certificate-errors-spki-list={certificate.pin}"
    other = tls.make_certificate(tmp_path)  # a fresh key each time: another pin, which the browser would refuse
    assert other.pin != certificate.pin


@needs_openssl
def test_the_certificate_is_valid_for_127_0_0_1_and_alpn_picks_h2(certificate):
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(certificate.cert, certificate.key)
    server_side.set_alpn_protocols(["h2", "http/1.1"])
    client_side = ssl.create_default_context(cafile=str(certificate.cert))  # hostname checked: the IP SAN
    client_side.set_alpn_protocols(["h2", "http/1.1"])
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        picked = {}

        def serve():
            conn, _ = listener.accept()
            with server_side.wrap_socket(conn, server_side=True) as s:
                picked["server"] = s.selected_alpn_protocol()
                s.recv(1)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with socket.create_connection(listener.getsockname(), timeout=5) as raw:
            with client_side.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                assert s.selected_alpn_protocol() == "h2"
                s.sendall(b"x")
        thread.join(5)
    assert picked["server"] == "h2"


def test_nginx_config_listens_with_tls_on_one_port_and_http2_on_the_other(tmp_path):
    cert = tls.Certificate(tmp_path / "cert.pem", tmp_path / "key.pem", "pin")
    lines = tls.listen_lines(cert, http1_port=8441, http2_port=8442)
    config = write_config(tmp_path, 8080, 9000, extra=lines, location=NGINX_LOCATION).read_text()
    assert "listen 127.0.0.1:8441 ssl;" in config and "listen 127.0.0.1:8442 ssl http2;" in config
    assert config.count("http2") == 1  # HTTP/2 on its own port only: the other differs from it in that alone
    assert f"ssl_certificate {cert.cert.resolve()};" in config and f"ssl_certificate_key {cert.key.resolve()};" in config
    location = config.split("location / {")[1].split("}")[0]
    assert "proxy_pass http://127.0.0.1:9000;" in location and "proxy_buffering off;" in location
    with pytest.raises(ValueError):
        tls.listen_lines(cert)


@needs_openssl
@pytest.mark.skipif(find_nginx() is None, reason="nginx is not installed")
def test_real_nginx_offers_h2_on_its_http2_port_and_http1_on_the_other(certificate):
    from streamlab.net.processes import free_port

    http1, http2 = free_port(), free_port()
    with run_nginx(free_port(), extra=tls.listen_lines(certificate, http1_port=http1, http2_port=http2)):
        picked = {}
        for port in (http1, http2):
            context = ssl.create_default_context(cafile=str(certificate.cert))
            context.set_alpn_protocols(["h2", "http/1.1"])  # what a browser offers
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                    picked[port] = s.selected_alpn_protocol()
    assert picked == {http1: "http/1.1", http2: "h2"}


def timing(stream, opened, first, end, connection=None):
    return StreamTiming(stream, f"u{stream}", opened, first, end, pieces=10, errors=0, connection=connection)


def test_a_run_counts_the_streams_open_at_once_and_the_ones_that_waited():
    six = [timing(i, 0.01, 0.05, 2.0 + i / 100, connection=i) for i in range(1, 7)]
    late = [timing(7, 2.01, 2.06, 4.0, connection=1), timing(8, 2.02, 2.07, 4.0, connection=2)]
    run = PathRun("h1", "http://x", six + late)
    assert run.most_at_once() == 6 and run.connections == 6
    assert run.first_end() == 2.01 and [s.stream for s in run.waited()] == [7, 8]
    together = PathRun("h2", "https://x", [timing(i, 0.07, 0.08, 2.0, connection=9) for i in range(1, 9)])
    assert together.most_at_once() == 8 and together.connections == 1 and together.waited() == []
    # a stream that opens the moment another ends reuses its place: not one more at once
    assert PathRun("tie", "x", [timing(1, 0.0, 0.1, 1.0), timing(2, 1.0, 1.1, 2.0)]).most_at_once() == 1


def test_connections_are_read_from_chromiums_network_log():
    def entry(method, **params):
        return {"message": json.dumps({"message": {"method": method, "params": params}})}

    log = [
        entry("Network.requestWillBeSent", request={"url": "https://a/1"}),
        entry("Network.responseReceived", response={"url": "https://a/1", "protocol": "h2", "connectionId": 12}),
        entry("Network.responseReceived", response={"url": "http://b/2", "protocol": "http/1.1", "connectionId": 3.0}),
        {"message": "not json"},
    ]
    assert connections_of(log) == {"https://a/1": ("h2", 12), "http://b/2": ("http/1.1", 3)}


def test_the_stream_chart_can_be_read_at_the_notebooks_width():
    from test_plots import drawn, outside, overlaps

    from streamlab.book import connection_plots
    from streamlab.book import style

    h1 = [timing(i, 0.03, 0.07, 2.0) for i in range(1, 7)] + [timing(7, 2.03, 2.07, 4.0), timing(8, 2.05, 2.1, 4.05)]
    h2 = [timing(i, 0.07, 0.08, 2.03) for i in range(1, 9)]
    fig = drawn(lambda: connection_plots.stream_slots({"HTTP/1.1": h1, "HTTP/2": h2}))
    assert fig.get_figwidth() <= style.NOTEBOOK_WIDTH + 1e-9
    assert overlaps(fig) == [] and outside(fig) == []
    assert all(ax.get_ylabel() and ax.get_title(loc="left") for ax in fig.axes) and fig.axes[-1].get_xlabel()
