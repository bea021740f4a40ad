"""Exercise 15, a model answer: UTF-8 decoded as it arrives, holding back only what can still become a character.

After each read, the bytes are decoded up to the start of a character that
is not whole yet and may still become one; those few bytes (three at most)
wait for the next read. Everything else is decoded at once, invalid bytes
included: a byte that can never be part of a character must not wait, or
an answer that really contains one stalls.
"""

CONTINUATION = range(0x80, 0xC0)


def _shape(first):
    """A character's length and the range of its second byte, from its first byte (length 0: never a first byte)."""
    if first < 0x80:
        return 1, CONTINUATION
    if 0xC2 <= first <= 0xDF:
        return 2, CONTINUATION
    if first == 0xE0:
        return 3, range(0xA0, 0xC0)
    if first == 0xED:
        return 3, range(0x80, 0xA0)  # not the surrogates
    if 0xE1 <= first <= 0xEF:
        return 3, CONTINUATION
    if first == 0xF0:
        return 4, range(0x90, 0xC0)
    if 0xF1 <= first <= 0xF3:
        return 4, CONTINUATION
    if first == 0xF4:
        return 4, range(0x80, 0x90)  # nothing past U+10FFFF
    return 0, range(0)


def _unfinished(data):
    """How many bytes at the end of ``data`` start a character that its next bytes may still complete."""
    start = len(data) - 1
    while start >= 0 and len(data) - start <= 3 and data[start] in CONTINUATION:
        start -= 1
    if start < 0 or len(data) - start > 3:
        return 0
    tail = data[start:]
    length, second = _shape(tail[0])
    if length < 2 or len(tail) >= length:
        return 0  # no first byte of a long character, or the character is whole (or over-long: invalid)
    if len(tail) > 1 and tail[1] not in second:
        return 0  # it can never be a character: decode it now, as U+FFFD
    return len(tail)


class Utf8Reader:
    def __init__(self):
        self._held = b""

    def feed(self, data):
        data = self._held + bytes(data)
        whole = len(data) - _unfinished(data)
        self._held = data[whole:]
        return data[:whole].decode("utf-8", "replace")

    def finish(self):
        held, self._held = self._held, b""
        return held.decode("utf-8", "replace")
