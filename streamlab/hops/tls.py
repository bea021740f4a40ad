"""TLS for a hop: a throwaway certificate, its SPKI pin, and nginx listening with TLS and HTTP/2.

A browser speaks HTTP/2 only over TLS: the protocol is chosen inside the TLS
handshake (ALPN, Application-Layer Protocol Negotiation: the browser offers
``h2`` and ``http/1.1``, the server picks one). So an experiment that wants
HTTP/2 in Chromium needs a certificate. We make one per run with the
``openssl`` command (Debian: ``apt-get install openssl``), for the name the
browser connects to (``127.0.0.1``, as an IP subject alternative name), and
tell the browser to trust *that key only* with
``--ignore-certificate-errors-spki-list=PIN``, where the pin is the base64 of
the SHA-256 of the certificate's SubjectPublicKeyInfo (its public key and
algorithm, DER-encoded). Every other certificate error still counts.

``listen_lines`` is what goes into nginx's ``server`` block
(``streamlab.hops.nginx.run_nginx(extra=...)``): the same server then also
listens with TLS on one port, and with TLS and HTTP/2 on another, so the two
differ in the protocol alone.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Certificate", "TLSUnavailable", "listen_lines", "make_certificate", "spki_pin"]

HOST = "127.0.0.1"


class TLSUnavailable(RuntimeError):
    """No ``openssl`` command here: callers skip the TLS experiment."""


@dataclass(frozen=True)
class Certificate:
    """A self-signed certificate and its key, on disk, and the pin a browser is told to trust."""

    cert: Path
    key: Path
    pin: str  # base64(sha256(SubjectPublicKeyInfo, DER))

    def chromium_flag(self) -> str:
        """The one flag that makes Chromium accept this certificate, and no other bad one."""
        return f"--ignore-certificate-errors-spki-list={self.pin}"


def _openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        raise TLSUnavailable("the openssl command is not installed (Debian/Ubuntu: apt-get install openssl)")
    return found


def make_certificate(folder: Path | str, host: str = HOST, days: int = 1) -> Certificate:
    """A fresh P-256 key and a self-signed certificate for ``host`` (an IP address), valid ``days``, in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    openssl = _openssl()
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", str(days), "-subj", f"/CN={host}",
         "-addext", f"subjectAltName=IP:{host}"],
        check=True, capture_output=True, timeout=30,
    )
    return Certificate(cert, key, spki_pin(cert))


def spki_pin(cert: Path | str) -> str:
    """base64 of the SHA-256 of the certificate's SubjectPublicKeyInfo: the pin Chromium's flag takes."""
    public = subprocess.run(
        [_openssl(), "x509", "-in", str(cert), "-pubkey", "-noout"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout
    body = "".join(line for line in public.splitlines() if line and not line.startswith("-----"))
    return base64.b64encode(hashlib.sha256(base64.b64decode(body)).digest()).decode("ascii")


def listen_lines(certificate: Certificate, *, http1_port: int | None = None, http2_port: int | None = None) -> str:
    """nginx ``server`` lines: TLS on ``http1_port`` (HTTP/1.1 only), TLS with HTTP/2 on ``http2_port``.

    ``listen ... ssl http2`` is the spelling nginx 1.22 (Debian 12) knows;
    nginx 1.25 and later also take it, with a warning that ``http2 on`` is
    the newer one. ALPN then offers ``h2`` on that port only.
    """
    lines = []
    if http1_port is not None:
        lines.append(f"listen {HOST}:{http1_port} ssl;")
    if http2_port is not None:
        lines.append(f"listen {HOST}:{http2_port} ssl http2;")
    if not lines:
        raise ValueError("listen_lines needs http1_port, http2_port or both")
    lines += [f"ssl_certificate {certificate.cert.resolve()};", f"ssl_certificate_key {certificate.key.resolve()};"]
    return "\n".join(lines) + "\n"
