"""Exercise 12, a model answer: gzip with a sync flush after every write.

One deflate stream per response, in gzip's wrapper (wbits 16 + 15). After
each piece, Z_SYNC_FLUSH hands over all the input so far on a byte boundary
and keeps the dictionary, so later events still compress against earlier ones.
"""

import zlib


class FlushingGzip:
    def __init__(self):
        self._deflate = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

    def feed(self, data):
        return self._deflate.compress(data) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def finish(self):
        return self._deflate.flush(zlib.Z_FINISH)
