"""A compressing hop, as a forwarder of the proxy: why gzip holds a stream, and the flush that releases it.

A gzip middleware (Starlette's before it learnt to skip
``text/event-stream``, Express's ``compression``, a CDN's "compress text")
feeds the body to a deflate stream and writes what the compressor gives
back. For a big page that is nothing but good. For a stream of small events
it is a buffer: deflate keeps its input until it has enough to encode well
(tens of kilobytes), so a few hundred bytes of events go in and *nothing*
comes out until the body ends. ``Z_SYNC_FLUSH`` after each write makes the
compressor hand over everything it holds, on a byte boundary the reader
can decode at once: the stream streams again, a few bytes worse off.

Pure: bytes in, bytes out, no sockets. ``Gzip`` plugs into the proxy's
forwarding loop like the forwarders of ``streamlab.hops.forwarders``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from streamlab.protocol.http_head import Request, Response

__all__ = ["GZIP_MODES", "Gzip", "accepts_gzip", "compressed_sizes", "no_transform"]

GZIP_MODES = ("off", "buffered", "flush")
GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream, as Content-Encoding: gzip
LEVEL = 6  # zlib's and nginx's usual trade-off (gzip_comp_level defaults to 1, Starlette's to 9)


def accepts_gzip(request: Request) -> bool:
    """Whether the reader said it can decode gzip: no hop compresses for a client that did not ask."""
    codings = (request.header("accept-encoding") or "").lower()
    return any(part.split(";")[0].strip() == "gzip" for part in codings.split(","))


def no_transform(response: Response) -> bool:
    """``Cache-Control: no-transform``: the server asks every hop to leave its body as it is (RFC 9111 5.2.2.6)."""
    directives = (response.header("cache-control") or "").lower()
    return any(part.strip() == "no-transform" for part in directives.split(","))


class Gzip:
    """Compress a body on its way through: ``flush=False`` as most middlewares do, ``True`` with a sync flush.

    ``took`` and ``gave`` count body bytes in and compressed bytes out: a
    stream that took a kilobyte and gave 10 bytes (the gzip header) is one
    the reader is still waiting for.
    """

    holds_head = False
    ended = False  # a compressor never ends a body itself

    def __init__(self, *, flush: bool, level: int = LEVEL) -> None:
        self.flush = flush
        self.label = f"gzip {'sync-flush' if flush else 'buffered'}"
        self.headers = [("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")]
        self._zlib = zlib.compressobj(level, zlib.DEFLATED, GZIP_WBITS)
        self.took = self.gave = 0

    def feed(self, data: bytes) -> list[bytes]:
        """Compress ``data``; return what the compressor released (often nothing without the flush)."""
        out = self._zlib.compress(data)
        if self.flush:
            out += self._zlib.flush(zlib.Z_SYNC_FLUSH)
        self.took += len(data)
        self.gave += len(out)
        return [out] if out else []

    def finish(self) -> bytes:
        """The body ended: the compressor's last bytes and the gzip trailer."""
        out = self._zlib.flush(zlib.Z_FINISH)
        self.gave += len(out)
        return out


def compressed_sizes(pieces: Iterable[bytes], *, flush: bool) -> list[int]:
    """Bytes the compressor released after each piece went in, then (last) at the end of the body."""
    gzip = Gzip(flush=flush)
    sizes = [sum(map(len, gzip.feed(piece))) for piece in pieces]
    return [*sizes, len(gzip.finish())]
