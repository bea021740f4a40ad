"""Autobahn|Testsuite's WebSocket cases, groups 1-7, 9 and 10, as a table our own code runs.

Autobahn|Testsuite (crossbario/autobahn-testsuite) is how WebSocket
implementations prove themselves: a client that sends, case by numbered
case, the frames a careless implementation gets wrong (lengths at the 7-,
16- and 64-bit edges, pings of 125 and 126 bytes, reserved bits and
opcodes, control frames between fragments, UTF-8 cut in every place, every
close code) and checks what comes back from an *echo* server. The cases
here follow its numbering and its expectations (the case's ``id`` is its
number, ``1.1.1`` to ``10.1.1``); the code is ours.

Each case is a ``Script``: the byte strings the client writes (``parts``,
each a frame unless a case cuts a frame itself), how they are chopped into
writes, and what an echo peer must answer: pongs, echoed messages, then
its CLOSE and the code in it. ``run_echo`` plays the peer with
``streamlab.protocol.websocket.Connection`` alone, the way the server uses
it (pong every ping, echo the peer's close code, close with the code of
any ``ProtocolError``), so the protocol layer is judged exactly as
Autobahn judges a server. tests/test_conformance_websocket.py runs the same
scripts against the server's ``/ws``, whose messages are requests, not
echoes: that is why every text message here that Autobahn fills with
``*`` is a request padded to the case's length.

Two rules of the cases' own: "fail fast" (6.4.x) means the peer must have
failed once part ``fail_by`` arrived, before the rest is sent; the limit
of group 9 is ours, ``MAX_MESSAGE`` (1 MiB, python-websockets' default):
a message up to it is echoed, a larger one closes with 1009.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Callable

from streamlab.protocol import websocket as ws
from streamlab.protocol import websocket_frames

__all__ = ["CASES", "GROUPS", "MAX_MESSAGE", "Outcome", "Script", "WSCase", "check", "frame", "request", "run_echo",
           "strict"]

MAX_MESSAGE = 1 << 20  # the Connection's default max_message, and the server's max_ws_message
KEY = bytes.fromhex("37fa213d")  # RFC 6455 section 5.7's example masking key
TEXT, BINARY, CLOSE, PING, PONG, CONT = 0x1, 0x2, 0x8, 0x9, 0xA, 0x0

GROUPS = {
    1: "framing: text and binary at the 7/16/64-bit length edges",
    2: "pings and pongs, the 125-byte limit",
    3: "reserved bits",
    4: "reserved opcodes",
    5: "fragmentation, control frames between fragments",
    6: "UTF-8: valid, invalid, split code points, failing fast",
    7: "closing: codes, reasons, frames after CLOSE",
    9: "large messages against the limit, many small ones",
    10: "a message in many small fragments",
}


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True, rsv: int = 0) -> bytes:
    """A masked client frame of any shape, legal or not (a 126-byte ping, a reserved opcode, RSV bits)."""
    head = bytearray([(0x80 if fin else 0) | (rsv & 7) << 4 | opcode & 0xF])
    n = len(payload)
    if n <= 125:
        head.append(0x80 | n)
    elif n <= 0xFFFF:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    return bytes(head) + KEY + websocket_frames.apply_mask(payload, KEY)


def close(code: int | None = 1000, reason: bytes = b"") -> bytes:
    return frame(CLOSE, b"" if code is None else struct.pack("!H", code) + reason)


_REQUEST = b'{"prompt": "Hello", "max_tokens": 1, "keep_open": true}'


def request(size: int | None = None, prompt: bytes = b"Hello") -> bytes:
    """A ``/ws`` request of exactly ``size`` bytes (JSON, then spaces); under the smallest request, ``*`` x size."""
    body = _REQUEST.replace(b"Hello", prompt)
    if size is None:
        return body
    return body + b" " * (size - len(body)) if size >= len(body) else b"*" * size


def reply(opcode: int, payload: bytes) -> tuple:
    """What an echo peer's message is compared by: its type, its length, a digest (some are megabytes)."""
    return ("message", opcode, len(payload), hashlib.sha1(payload).hexdigest()[:16])


@dataclass
class Script:
    """What the client writes, and what an echo peer must answer.

    ``chop``: ``"frame"`` (each part one write), ``"all"`` (every part in
    one write) or a number (each part in writes of that many bytes).
    ``client_closes``: the client ends with CLOSE 1000 (else the parts end
    it, or the peer fails it). ``fails``: the peer fails the connection
    itself. ``live_count``: against /ws, only the first parts are sent
    (9.7/9.8 send 1000 messages; each is a generation there).
    ``non_strict``: other replies Autobahn also passes, as "non-strict"
    (a message's echo lost because a broken frame came in the same read).
    """

    parts: list[bytes]
    replies: list[tuple] = field(default_factory=list)
    close: int = 1000
    fails: bool = False
    client_closes: bool = True
    chop: str | int = "frame"
    fail_by: int | None = None
    live_count: int | None = None
    non_strict: list[tuple] | None = None


@dataclass(frozen=True)
class WSCase:
    id: str  # Autobahn|Testsuite's case number
    title: str
    build: Callable[[], Script] = field(repr=False)

    @property
    def group(self) -> int:
        return int(self.id.split(".")[0])


CASES: list[WSCase] = []


def case(id: str, title: str) -> Callable[[Callable[[], Script]], Callable[[], Script]]:  # noqa: A002
    def add(build: Callable[[], Script]) -> Callable[[], Script]:
        CASES.append(WSCase(id, title, build))
        return build
    return add


def echo(opcode: int, payload: bytes, *, chop: str | int = "frame") -> Script:
    return Script([frame(opcode, payload)], [reply(opcode, payload)], chop=chop)


def failure(parts: list[bytes], code: int = 1002, replies: list[tuple] | None = None, **kw) -> Script:
    return Script(parts, replies or [], code, fails=True, client_closes=False, **kw)


# -- 1: framing ----------------------------------------------------------------

for _n, (_size, _chop) in enumerate([(0, "frame"), (125, "frame"), (126, "frame"), (127, "frame"), (128, "frame"),
                                     (65535, "frame"), (65536, "frame"), (65536, 997)], 1):
    case(f"1.1.{_n}", f"text message of {_size} bytes" + (", chopped in 997-byte writes" if _chop != "frame" else ""))(
        lambda size=_size, chop=_chop: echo(TEXT, request(size), chop=chop))
    case(f"1.2.{_n}", f"binary message of {_size} bytes" + (", chopped in 997-byte writes" if _chop != "frame" else ""))(
        lambda size=_size, chop=_chop: echo(BINARY, b"\xfe" * size, chop=chop))


# -- 2: pings and pongs --------------------------------------------------------

def pings(payloads: list[bytes], chop: str | int = "frame") -> Script:
    return Script([frame(PING, p) for p in payloads], [("pong", p) for p in payloads], chop=chop)


case("2.1", "ping without payload")(lambda: pings([b""]))
case("2.2", "ping with a small text payload")(lambda: pings([b"Hello, world!"]))
case("2.3", "ping with a small binary payload")(lambda: pings([b"\x00\xff\xfe\xfd\xfc\xfb\x00\xff"]))
case("2.4", "ping with 125 bytes")(lambda: pings([b"\xfe" * 125]))
case("2.5", "ping with 126 bytes: over a control frame's limit")(lambda: failure([frame(PING, b"\xfe" * 126)]))
case("2.6", "ping with 125 bytes, in 1-byte writes")(lambda: pings([b"\xfe" * 125], chop=1))
case("2.7", "unsolicited pong without payload: nothing comes back")(lambda: Script([frame(PONG)]))
case("2.8", "unsolicited pong with payload: nothing comes back")(
    lambda: Script([frame(PONG, b"unsolicited pong payload")]))
case("2.9", "unsolicited pong, then a ping: one pong, for the ping")(
    lambda: Script([frame(PONG, b"unsolicited pong payload"), frame(PING, b"ping payload")],
                   [("pong", b"ping payload")]))
case("2.10", "10 pings")(lambda: pings([b"payload-%d" % i for i in range(10)]))
case("2.11", "10 pings, in 1-byte writes")(lambda: pings([b"payload-%d" % i for i in range(10)], chop=1))


# -- 3: reserved bits, 4: reserved opcodes -------------------------------------

def echoed_then_failed(bad: bytes, chop: str | int = "all") -> Script:
    """A good message, then a broken frame, then a ping: the message echoed, the connection failed, no pong.

    In one write, the peer may fail before echoing (Autobahn: non-strict).
    """
    return failure([frame(TEXT, request()), bad, frame(PING)], replies=[reply(TEXT, request())], chop=chop,
                   non_strict=[] if chop == "all" else None)


case("3.1", "text with RSV = 1")(lambda: failure([frame(TEXT, request(), rsv=1)]))
case("3.2", "text, text with RSV = 2, ping, in one write")(lambda: echoed_then_failed(frame(TEXT, request(), rsv=2)))
case("3.3", "text, text with RSV = 3, ping, frame by frame")(
    lambda: echoed_then_failed(frame(TEXT, request(), rsv=3), "frame"))
case("3.4", "text, text with RSV = 4, ping, in 1-byte writes")(
    lambda: echoed_then_failed(frame(TEXT, request(), rsv=4), 1))
case("3.5", "binary with RSV = 5")(lambda: failure([frame(BINARY, b"\x00\xff" * 4, rsv=5)]))
case("3.6", "ping with RSV = 6")(lambda: failure([frame(PING, b"", rsv=6)]))
case("3.7", "close with RSV = 7")(lambda: failure([frame(CLOSE, struct.pack("!H", 1000), rsv=7)]))

for _group, _kind, _opcodes in (("4.1", "non-control", [3, 4, 5, 6, 7]), ("4.2", "control", [11, 12, 13, 14, 15])):
    for _n, _op in enumerate(_opcodes, 1):
        if _n <= 2:
            case(f"{_group}.{_n}", f"frame with reserved {_kind} opcode {_op}")(
                lambda op=_op, n=_n: failure([frame(op, b"reserved opcode payload" if n == 2 else b"")]))
        else:
            case(f"{_group}.{_n}", f"text, frame with reserved {_kind} opcode {_op}, ping")(
                lambda op=_op, n=_n: echoed_then_failed(frame(op, b"" if n == 3 else b"reserved opcode payload")))


# -- 5: fragmentation ----------------------------------------------------------

def fragments(payload: bytes, count: int, opcode: int = TEXT) -> list[bytes]:
    """``payload`` in ``count`` fragments of about equal size (the last may be empty)."""
    return fragmented(payload, -(-len(payload) // count) or 1, opcode, count)


def fragmented(payload: bytes, size: int, opcode: int = TEXT, count: int | None = None) -> list[bytes]:
    """``payload`` in fragments of ``size`` bytes, the last one shorter (Autobahn's ``fragmentSize``)."""
    count = count if count is not None else max(1, -(-len(payload) // size))
    pieces = [payload[i * size:(i + 1) * size] for i in range(count)]
    return [frame(opcode if i == 0 else CONT, piece, fin=i == count - 1) for i, piece in enumerate(pieces)]


case("5.1", "ping in 2 fragments")(lambda: failure([frame(PING, b"fragment1", fin=False), frame(CONT, b"fragment2")]))
case("5.2", "pong in 2 fragments")(lambda: failure([frame(PONG, b"fragment1", fin=False), frame(CONT, b"fragment2")]))
def _how(chop: str | int) -> str:
    return {"all": "in one write", "frame": "frame by frame"}.get(str(chop), f"in {chop}-byte writes")


for _n, _chop in [(3, "all"), (4, "frame"), (5, 1)]:
    case(f"5.{_n}", f"text in 2 fragments, {_how(_chop)}")(
        lambda chop=_chop: Script(fragments(request(), 2), [reply(TEXT, request())], chop=chop))
for _n, _chop in [(6, "all"), (7, "frame"), (8, 1)]:
    case(f"5.{_n}", f"text in 2 fragments with a ping between, {_how(_chop)}")(
        lambda chop=_chop: Script(
            [(parts := fragments(request(), 2))[0], frame(PING, b"ping payload"), parts[1]],
            [("pong", b"ping payload"), reply(TEXT, request())], chop=chop))
for _n, (_fin, _chop) in enumerate([(True, "all"), (True, "frame"), (True, 1), (False, "all"), (False, "frame"),
                                    (False, 1)], 9):
    case(f"5.{_n}", f"continuation (FIN = {_fin}) with nothing to continue, then a text, {_how(_chop)}")(
        lambda fin=_fin, chop=_chop: failure([frame(CONT, b"non-continuation payload", fin=fin),
                                              frame(TEXT, request())], chop=chop))
case("5.15", "text in 2 fragments, then a continuation with nothing to continue, then a text")(
    lambda: failure([*fragments(request(), 2), frame(CONT, b"fragment3", fin=False), frame(TEXT, b"fragment4")],
                    replies=[reply(TEXT, request())], chop="all", non_strict=[]))
case("5.16", "twice: continuation (FIN = false) with nothing to continue, text start, continuation")(
    lambda: failure([frame(CONT, b"fragment1", fin=False), frame(TEXT, b"fragment2", fin=False),
                     frame(CONT, b"fragment3")] * 2, chop="all"))
case("5.17", "twice: continuation (FIN = true) with nothing to continue, text start, continuation")(
    lambda: failure([frame(CONT, b"fragment1"), frame(TEXT, b"fragment2", fin=False), frame(CONT, b"fragment3")] * 2,
                    chop="all"))
case("5.18", "a text start, then another text start")(
    lambda: failure([frame(TEXT, b"fragment1", fin=False), frame(TEXT, b"fragment2")], chop="all"))


def five_fragments_two_pings(chop: str | int) -> Script:
    parts = fragments(request(), 5)
    return Script([*parts[:2], frame(PING, b"pongme 1!"), *parts[2:4], frame(PING, b"pongme 2!"), parts[4]],
                  [("pong", b"pongme 1!"), ("pong", b"pongme 2!"), reply(TEXT, request())], chop=chop)


case("5.19", "text in 5 fragments, 2 pings between them")(lambda: five_fragments_two_pings("frame"))
case("5.20", "the same, in 1-byte writes")(lambda: five_fragments_two_pings(1))


# -- 6: UTF-8 ------------------------------------------------------------------

def utf8(seq: bytes) -> bytes:
    """A request whose prompt holds ``seq`` raw: its UTF-8 is what the case is about."""
    return b'{"prompt": "x' + seq + b'", "max_tokens": 1, "keep_open": true}'


def valid(seq: bytes) -> bool:
    try:
        seq.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def text_case(payload: bytes, is_valid: bool, fragment: int | None = None) -> Script:
    parts = [frame(TEXT, payload)] if fragment is None else fragmented(payload, fragment)
    if is_valid:
        return Script(parts, [reply(TEXT, payload)])
    return failure(parts, 1007)


case("6.1.1", "empty text")(lambda: echo(TEXT, b""))
case("6.1.2", "text in 3 empty fragments")(
    lambda: Script([frame(TEXT, b"", fin=False), frame(CONT, b"", fin=False), frame(CONT, b"")], [reply(TEXT, b"")]))
case("6.1.3", "text in 3 fragments: empty, a request, empty")(
    lambda: Script([frame(TEXT, b"", fin=False), frame(CONT, request(), fin=False), frame(CONT, b"")],
                   [reply(TEXT, request())]))
_HELLO = "Hello-µ@ßöäüàá-UTF-8!!".encode()
_KOSME = bytes.fromhex("cebae1bdb9cf83cebcceb5")  # κόσμε
_BAD = _KOSME + bytes.fromhex("eda080") + b"edited"  # with a lone surrogate in the middle
case("6.2.1", "valid UTF-8 in one frame")(lambda: text_case(utf8(_HELLO), True))
_CUT = utf8(_HELLO).index("ö".encode())  # a code point boundary
case("6.2.2", "valid UTF-8 in 2 fragments cut on a code point boundary")(
    lambda: Script([frame(TEXT, utf8(_HELLO)[:_CUT], fin=False), frame(CONT, utf8(_HELLO)[_CUT:])],
                   [reply(TEXT, utf8(_HELLO))]))
case("6.2.3", "valid UTF-8 in 1-byte fragments")(lambda: text_case(utf8(_HELLO), True, fragment=1))
case("6.2.4", "κόσμε in 1-byte fragments")(lambda: text_case(utf8(_KOSME), True, fragment=1))
case("6.3.1", "invalid UTF-8 in one frame")(lambda: text_case(utf8(_BAD), False))
case("6.3.2", "invalid UTF-8 in 1-byte fragments")(lambda: text_case(utf8(_BAD), False, fragment=1))

_FAST = (b'{"prompt": "' + _KOSME, bytes.fromhex("f4908080"), b'edited", "max_tokens": 1}')


def fail_fast(cuts: tuple[bytes, bytes, bytes], one_frame: bool) -> Script:
    """Three parts, invalid UTF-8 in the second: the peer must fail before the third is sent (Autobahn's 6.4.x)."""
    if one_frame:  # one frame, its bytes written in three parts
        whole = frame(TEXT, b"".join(cuts))
        a, b = len(whole) - len(cuts[1]) - len(cuts[2]), len(whole) - len(cuts[2])
        parts = [whole[:a], whole[a:b], whole[b:]]
    else:
        parts = [frame(TEXT, cuts[0], fin=False), frame(CONT, cuts[1], fin=False), frame(CONT, cuts[2])]
    return failure(parts, 1007, fail_by=1)


_FAST2 = (_FAST[0] + _FAST[1][:1], _FAST[1][1:2], _FAST[1][2:] + _FAST[2])
case("6.4.1", "3 fragments, the 2nd invalid: failed before the 3rd")(lambda: fail_fast(_FAST, False))
case("6.4.2", "3 fragments, invalid from the 2nd's first byte: failed before the 3rd")(lambda: fail_fast(_FAST2, False))
case("6.4.3", "one frame written in 3 parts, the 2nd invalid: failed before the 3rd")(lambda: fail_fast(_FAST, True))
case("6.4.4", "one frame in 3 parts, invalid at the 2nd's first byte: failed before the 3rd")(
    lambda: fail_fast(_FAST2, True))


def _nonchars() -> list[bytes]:
    out = [b"\xef\xbf\xbe", b"\xef\xbf\xbf"]
    for z1 in b"\xf0\xf1\xf2\xf3\xf4":
        for z2 in b"\x8f\x9f\xaf\xbf":
            if z1 == 0xF4 and z2 != 0x8F:
                continue  # past U+10FFFF
            for z3 in b"\xbe\xbf":
                seq = bytes([z1, z2, 0xBF, z3])
                if seq[:2] != b"\xf0\x8f":  # overlong
                    out.append(seq)
    return out


_MISSING = [b"\xc0", b"\xe0\x80", b"\xf0\x80\x80", b"\xf8\x80\x80\x80", b"\xfc\x80\x80\x80\x80",
            b"\xdf", b"\xef\xbf", b"\xf7\xbf\xbf", b"\xfb\xbf\xbf\xbf", b"\xfd\xbf\xbf\xbf\xbf"]
_SURROGATES = [bytes.fromhex(h) for h in ["eda080", "edadbf", "edae80", "edafbf", "edb080", "edbe80", "edbfbf"]]
# Markus Kuhn's UTF-8 decoder stress test, as Autobahn's 6.5 to 6.23 take it (each a message of its own).
UTF8_SEQUENCES: list[tuple[str, list[bytes]]] = [
    ("valid sequences", [b"hello\x24world", b"hello\xc2\xa2world", b"hello\xe2\x82\xacworld",
                         b"hello\xf0\xa4\xad\xa2world", _KOSME]),
    ("every prefix of κόσμε", [_KOSME[:i] for i in range(1, len(_KOSME) + 1)]),
    ("first sequence of each length", [b"\x00", b"\xc2\x80", b"\xe0\xa0\x80", b"\xf0\x90\x80\x80"]),
    ("first 5- and 6-byte sequences", [b"\xf8\x88\x80\x80\x80", b"\xfc\x84\x80\x80\x80\x80"]),
    ("last sequence of each length", [b"\x7f", b"\xdf\xbf", b"\xef\xbf\xbf", b"\xf4\x8f\xbf\xbf"]),
    ("last 4-, 5- and 6-byte sequences", [b"\xf7\xbf\xbf\xbf", b"\xfb\xbf\xbf\xbf\xbf", b"\xfd\xbf\xbf\xbf\xbf\xbf"]),
    ("other boundaries", [b"\xed\x9f\xbf", b"\xee\x80\x80", b"\xef\xbf\xbd", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80"]),
    ("unexpected continuation bytes", [b"\x80", b"\xbf", b"\x80\xbf", b"\x80\xbf\x80", b"\x80\xbf\x80\xbf",
                                       b"\x80\xbf\x80\xbf\x80", b"\x80\xbf\x80\xbf\x80\xbf", bytes(range(0x80, 0xBF))]),
    ("lonely start bytes", [b"".join(bytes([c, 0x20]) for c in range(a, b))
                            for a, b in [(0xC0, 0xDF), (0xE0, 0xEF), (0xF0, 0xF7), (0xF8, 0xFB), (0xFC, 0xFD)]]),
    ("last continuation byte missing", _MISSING),
    ("incomplete sequences one after another", [b"".join(_MISSING)]),
    ("impossible bytes", [b"\xfe", b"\xff", b"\xfe\xfe\xff\xff"]),
    ("overlong ASCII", [b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xf8\x80\x80\x80\xaf",
                        b"\xfc\x80\x80\x80\x80\xaf"]),
    ("maximum overlong sequences", [b"\xc1\xbf", b"\xe0\x9f\xbf", b"\xf0\x8f\xbf\xbf", b"\xf8\x87\xbf\xbf\xbf",
                                    b"\xfc\x83\xbf\xbf\xbf\xbf"]),
    ("overlong NUL", [b"\xc0\x80", b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xf8\x80\x80\x80\x80",
                      b"\xfc\x80\x80\x80\x80\x80"]),
    ("single UTF-16 surrogates", _SURROGATES),
    ("paired UTF-16 surrogates", [a + b for a in _SURROGATES[:4:] for b in (_SURROGATES[4], _SURROGATES[6])]),
    ("noncharacters (valid UTF-8)", _nonchars()),
    ("specials (valid UTF-8)", [bytes([0xEF, 0xBF, c]) for c in range(0xB9, 0xC0)]),
]
for _i, (_title, _seqs) in enumerate(UTF8_SEQUENCES, 5):
    for _j, _seq in enumerate(_seqs, 1):
        case(f"6.{_i}.{_j}", f"{_title}: {_seq.hex(' ')[:40]}")(
            lambda seq=_seq: text_case(utf8(seq), valid(seq)))


# -- 7: closing ----------------------------------------------------------------

def closing(parts: list[bytes], code: int = 1000, replies: list[tuple] | None = None, fails: bool = False,
            chop: str | int = "frame") -> Script:
    return Script(parts, replies or [], code, fails=fails, client_closes=False, chop=chop)


case("7.1.1", "a message, then CLOSE")(lambda: closing([frame(TEXT, request()), close()], replies=[reply(TEXT, request())]))
case("7.1.2", "CLOSE twice, in one write")(lambda: closing([close(), close()], 1000, chop="all"))
case("7.1.3", "CLOSE, then a ping, in one write: no pong")(lambda: closing([close(), frame(PING)], 1000, chop="all"))
case("7.1.4", "CLOSE, then a text, in one write: not echoed")(lambda: closing([close(), frame(TEXT, request())], 1000, chop="all"))
case("7.1.5", "a fragment, CLOSE, the last fragment, in one write")(
    lambda: closing([frame(TEXT, request()[:10], fin=False), close(), frame(CONT, request()[10:])], 1000, chop="all"))
case("7.1.6", "256 KiB text, a text, CLOSE, a ping, in one write")(
    lambda: Script([frame(TEXT, request(256 << 10)), frame(TEXT, request()), close(), frame(PING)],
                   [reply(TEXT, request(256 << 10)), reply(TEXT, request())], 1000, client_closes=False, chop="all"))
case("7.3.1", "CLOSE without payload")(lambda: closing([close(None)], 1000))
case("7.3.2", "CLOSE with a 1-byte payload")(lambda: closing([frame(CLOSE, b"\x03")], 1002, fails=True))
case("7.3.3", "CLOSE 1000")(lambda: closing([close(1000)], 1000))
case("7.3.4", "CLOSE 1000 with a reason")(lambda: closing([close(1000, b"Hello World!")], 1000))
case("7.3.5", "CLOSE 1000 with a reason of 123 bytes, the most")(lambda: closing([close(1000, b"*" * 123)], 1000))
case("7.3.6", "CLOSE with a reason of 124 bytes: over a control frame's limit")(
    lambda: closing([close(1000, b"*" * 124)], 1002, fails=True))
case("7.5.1", "CLOSE with a reason that is not UTF-8")(lambda: closing([close(1000, _BAD)], 1007, fails=True))
for _n, _code in enumerate([1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999], 1):
    case(f"7.7.{_n}", f"CLOSE {_code}, a valid code: echoed")(lambda code=_code: closing([close(code)], code))
for _n, _code in enumerate([0, 999, 1004, 1005, 1006, 1016, 1100, 2000, 2999], 1):
    case(f"7.9.{_n}", f"CLOSE {_code}, a code never sent: 1002")(
        lambda code=_code: closing([close(code)], 1002, fails=True))
case("7.13.1", "CLOSE 5000, outside every range")(lambda: closing([close(5000)], 1002, fails=True))
case("7.13.2", "CLOSE 65535")(lambda: closing([close(65535)], 1002, fails=True))


# -- 9: limits -----------------------------------------------------------------

def large(opcode: int, size: int, *, fragment: int | None = None, chop: str | int = "frame") -> Script:
    payload = request(size) if opcode == TEXT else b"\xfe" * size
    parts = [frame(opcode, payload)] if fragment is None else fragmented(payload, fragment, opcode)
    if size > MAX_MESSAGE:
        return failure(parts, 1009, chop=chop)
    return Script(parts, [reply(opcode, payload)], chop=chop)


_KIB, _MIB = 1 << 10, 1 << 20
for _op, _g, _h, _k in [(TEXT, 1, 3, 5), (BINARY, 2, 4, 6)]:
    _kind = "text" if _op == TEXT else "binary"
    for _n, _size in enumerate([64 * _KIB, 256 * _KIB, _MIB, 4 * _MIB, 8 * _MIB, 16 * _MIB], 1):
        case(f"9.{_g}.{_n}", f"{_kind} message of {_size >> 10} KiB")(lambda op=_op, size=_size: large(op, size))
    for _n, _frag in enumerate([64, 256, _KIB, 4 * _KIB, 16 * _KIB, 64 * _KIB, 256 * _KIB, _MIB, 4 * _MIB], 1):
        case(f"9.{_h}.{_n}", f"4 MiB {_kind} message in fragments of {_frag} bytes")(
            lambda op=_op, frag=_frag: large(op, 4 * _MIB, fragment=frag))
    for _n, _chop in enumerate([64, 128, 256, 512, 1024, 2048], 1):
        case(f"9.{_k}.{_n}", f"1 MiB {_kind} message in {_chop}-byte writes")(
            lambda op=_op, chop=_chop: large(op, _MIB, chop=chop))


def many(opcode: int, size: int, count: int = 1000) -> Script:
    payload = request(size) if opcode == TEXT else b"\xfe" * size
    return Script([frame(opcode, payload)] * count, [reply(opcode, payload)] * count, live_count=100)


for _op, _g in [(TEXT, 7), (BINARY, 8)]:
    for _n, _size in enumerate([0, 16, 64, 256, 1024, 4096], 1):
        case(f"9.{_g}.{_n}", f"1000 {'text' if _op == TEXT else 'binary'} messages of {_size} bytes")(
            lambda op=_op, size=_size: many(op, size))


# -- 10 --------------------------------------------------------------------------

case("10.1.1", "64 KiB text in fragments of 1300 bytes")(
    lambda: Script(fragmented(request(65536), 1300), [reply(TEXT, request(65536))]))


# --------------------------------------------------------------------------
# The echo peer: the protocol layer, answering as the server does
# --------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the peer did: its replies, the code of its CLOSE, whether it failed, and where."""

    replies: list[tuple] = field(default_factory=list)
    close: int | None = None
    failed: bool = False
    failed_at: int | None = None  # the part during which it failed
    events: list[list[ws.WebSocketEvent]] = field(default_factory=list)  # what each part completed


def writes(script: Script, parts: list[bytes]) -> list[tuple[int, bytes]]:
    """``(part index, bytes)`` for every write the client makes."""
    if script.chop == "all":
        return [(len(parts) - 1, b"".join(parts))]
    if script.chop == "frame":
        return list(enumerate(parts))
    size = int(script.chop)
    return [(i, part[j:j + size]) for i, part in enumerate(parts) for j in range(0, len(part), size)]


def all_parts(script: Script) -> list[bytes]:
    return script.parts + ([close()] if script.client_closes else [])


def run_echo(script: Script, *, max_message: int = MAX_MESSAGE) -> Outcome:
    """Play an echo peer with ``ws.Connection`` (as the server: pong, echo the close code, fail with the error's)."""
    conn = ws.Connection(client=False, max_message=max_message)
    parts = all_parts(script)
    out = Outcome(events=[[] for _ in parts])
    for index, data in writes(script, parts):
        try:
            events = conn.receive(data)
        except websocket_frames.ProtocolError as err:
            out.close, out.failed, out.failed_at = err.code, True, index
            return out
        for event in events:
            out.events[index].append(event)
            if isinstance(event, ws.Ping):
                out.replies.append(("pong", event.payload))
            elif isinstance(event, ws.TextMessage):
                out.replies.append(reply(TEXT, event.text.encode("utf-8")))
            elif isinstance(event, ws.BinaryMessage):
                out.replies.append(reply(BINARY, event.data))
            elif isinstance(event, ws.CloseReceived):
                out.close = event.code if websocket_frames.is_valid_close_code(event.code) else 1000
                return out
    return out


def check(script: Script, out: Outcome) -> list[str]:
    """What the peer did that the case does not allow (empty: it passed)."""
    problems = []
    if out.replies != script.replies and out.replies != script.non_strict:
        problems.append(f"replies {out.replies[:4]} != {script.replies[:4]}")
    if out.close != script.close:
        problems.append(f"closed with {out.close}, not {script.close}")
    if out.failed != script.fails:
        problems.append("failed the connection" if out.failed else "did not fail the connection")
    if script.fail_by is not None and (out.failed_at is None or out.failed_at > script.fail_by):
        problems.append(f"failed at part {out.failed_at}, not by part {script.fail_by}")
    return problems


def strict(script: Script, out: Outcome) -> bool:
    """Whether a pass was Autobahn's "OK" rather than its "non-strict"."""
    return out.replies == script.replies
