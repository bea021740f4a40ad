"""Autobahn|Testsuite's WebSocket cases 1-7, 9 and 10 (crossbario/autobahn-testsuite), ours to run.

The cases are the table in ``streamlab.lab.conformance.autobahn`` (each named by
its Autobahn number). Each runs twice:

- against the protocol layer, ``ws.Connection`` playing the echo server
  Autobahn expects (``run_echo``): every expectation of the case, strictly
  or as Autobahn's "non-strict";
- against the in-process server's ``/ws``, whose messages are generation
  requests, not echoes. What it must answer follows from the same run: the
  events the protocol layer reported, frame by frame, read with the server's
  own rules (a pong for each ping, one answer for each request, an error and
  1008 for a text that is not one, 1003 for a binary message, the close code
  echoed, and the code of a protocol error). Each frame is one write (or the
  case's chops), and the answer to a message is awaited before the next
  frame goes, so an answer never races a failure behind it; the frames of a
  case sent "in one write" go in one write up to each message.
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streamlab.lab.conformance import autobahn as cw
from streamlab.protocol import websocket as ws
from streamlab.protocol import websocket_frames
from streamlab.protocol import websocket_handshake
from streamlab.protocol.http_head import parse_response_head
from streamlab.server.config import MAX_WS_MESSAGE

pytestmark = pytest.mark.timeout(120)

IDS = [case.id for case in cw.CASES]
BY_ID = {case.id: case for case in cw.CASES}


def test_the_table_has_every_case_of_the_groups():
    counts = {group: sum(case.group == group for case in cw.CASES) for group in cw.GROUPS}
    # Autobahn's own numbering: 1.1.1-1.2.8, 2.1-2.11, 3.1-3.7, 4.1.1-4.2.5, 5.1-5.20, 6.1.1-6.23.7,
    # 7.1.1-7.13.2 (7.7: 13 valid codes, 7.9: 9 invalid ones), 9.1.1-9.8.6, 10.1.1.
    assert counts == {1: 16, 2: 11, 3: 7, 4: 10, 5: 20, 6: 145, 7: 37, 9: 54, 10: 1}
    assert len(set(IDS)) == len(IDS)


def test_the_limit_is_the_servers():
    assert cw.MAX_MESSAGE == MAX_WS_MESSAGE == ws.Connection(client=False).max_message


# --------------------------------------------------------------------------
# The protocol layer, as an echo server
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", IDS)
def test_protocol_layer(case_id):
    script = BY_ID[case_id].build()
    out = cw.run_echo(script)
    assert cw.check(script, out) == [], BY_ID[case_id].title


def test_non_strict_passes_are_only_those_autobahn_allows():
    # A message, then a broken frame in the same read: the message's events
    # are dropped with the failure (Connection.receive), so no echo comes.
    loose = [case.id for case in cw.CASES if not cw.strict(script := case.build(), cw.run_echo(script))]
    assert loose == ["3.2", "4.1.3", "4.1.4", "4.1.5", "4.2.3", "4.2.4", "4.2.5", "5.15"]


# --------------------------------------------------------------------------
# The server's /ws
# --------------------------------------------------------------------------


def is_request(payload: bytes) -> bool:
    try:
        message = json.loads(payload.decode("utf-8"))
    except ValueError:
        return False
    return isinstance(message, dict) and "prompt" in message


@dataclasses.dataclass
class Plan:
    """What /ws must answer: pongs and answers along the way, then its CLOSE."""

    pongs: list[bytes]
    answers: int  # requests answered (each ends with "done")
    close: int
    waits: list[int]  # after part i, this many answers are awaited before part i + 1 is sent
    refused: bool = False  # the last text was not a request: an error answer before the close


def plan(script: cw.Script) -> Plan:
    """The server's rules applied to the events the protocol layer reports, part by part."""
    framewise = cw.run_echo(dataclasses.replace(script, chop="frame" if script.chop == "all" else script.chop))
    parts = cw.all_parts(script)
    out = Plan([], 0, 1000, [0] * len(parts))
    for index, events in enumerate(framewise.events):
        for event in events:
            if isinstance(event, ws.Ping):
                out.pongs.append(event.payload)
            elif isinstance(event, ws.TextMessage):
                if not is_request(event.text.encode("utf-8")):
                    out.close, out.refused = 1008, True
                    out.waits[index] += 1  # its error answer comes before anything else is sent
                    return out
                out.answers += 1
                out.waits[index] += 1
            elif isinstance(event, ws.BinaryMessage):
                out.close = 1003
                return out
            elif isinstance(event, ws.CloseReceived):
                out.close = event.code if websocket_frames.is_valid_close_code(event.code) else 1000
                return out
        if framewise.failed and framewise.failed_at == index:
            out.close = framewise.close
            return out
    return out


class Peer:
    """A raw WebSocket client: writes what it is given, reads frames, answers nothing by itself."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.sock.sendall(websocket_handshake.client_handshake(f"127.0.0.1:{port}", "/ws", websocket_handshake.new_key()))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            assert chunk, "no handshake answer"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        assert parse_response_head(head + b"\r\n\r\n").status == 101
        self.decoder = websocket_frames.FrameDecoder(expect_masked=False, max_frame=1 << 24)
        self.frames: list[websocket_frames.Frame] = []
        self.gone = False
        self._take(rest)

    def _take(self, data: bytes) -> None:
        self.frames += self.decoder.feed(data)

    @property
    def closed(self) -> bool:
        return self.gone or any(f.opcode == websocket_frames.Opcode.CLOSE for f in self.frames)

    def read(self, timeout: float | None = 20) -> None:
        readable, _, _ = select.select([self.sock], [], [], timeout)
        if not readable:
            raise TimeoutError("the server said nothing")
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionError:
            data = b""
        if not data:
            self.gone = True
        self._take(data)

    def send(self, data: bytes) -> None:
        """Write in 64 KiB steps, reading meanwhile; stop once the server has closed (it stopped reading)."""
        for start in range(0, len(data), 1 << 16):
            while select.select([self.sock], [], [], 0)[0] and not self.gone:
                self.read()
            if self.closed:
                return
            try:
                self.sock.sendall(data[start:start + (1 << 16)])
            except ConnectionError:
                self.gone = True
                return

    def answers(self) -> int:
        done = 0
        for f in self.frames:
            if f.opcode == websocket_frames.Opcode.TEXT:
                message = json.loads(f.payload)
                done += bool(message.get("done") or "error" in message)
        return done

    def wait_for(self, answers: int) -> None:
        while self.answers() < answers and not self.closed:
            self.read()

    def close_code(self) -> int | None:
        close = next((f for f in self.frames if f.opcode == websocket_frames.Opcode.CLOSE), None)
        return None if close is None else websocket_frames.parse_close_payload(close.payload)[0]


def writes(script: cw.Script, parts: list[bytes], waits: list[int]) -> list[tuple[int, bytes]]:
    """The case's writes, ``(last part index, bytes)``; a write never runs past a part whose answer is awaited."""
    if script.chop != "all":
        return cw.writes(script, parts)
    out, group = [], b""
    for index, part in enumerate(parts):
        group += part
        if waits[index] or index == len(parts) - 1:
            out.append((index, group))
            group = b""
    return out


def run_live(port: int, script: cw.Script) -> Peer:
    expected = plan(script)
    parts = cw.all_parts(script)
    if script.live_count is not None:
        parts = parts[: script.live_count] + ([cw.close()] if script.client_closes else [])
        expected.waits = expected.waits[: script.live_count] + [0]
    peer = Peer(port)
    try:
        awaited = 0
        steps = writes(script, parts, expected.waits + [0] * len(parts))
        for step, (index, data) in enumerate(steps):
            if peer.closed:
                break
            if script.fail_by is not None and index > script.fail_by:
                peer.wait_for(10**9)  # fail fast: the close must come before this part is sent
                assert peer.closed, "the server waited for the rest of an invalid message"
                break
            peer.send(data)
            if step + 1 == len(steps) or steps[step + 1][0] != index:  # the part's last write
                awaited += expected.waits[index] if index < len(expected.waits) else 0
                peer.wait_for(awaited)
        while not peer.closed:
            peer.read()
    finally:
        peer.sock.close()
    return peer


@pytest.mark.parametrize("case_id", IDS)
def test_server(app, case_id):
    script = BY_ID[case_id].build()
    expected = plan(script)
    peer = run_live(app.port, script)
    title = BY_ID[case_id].title
    assert peer.close_code() == expected.close, title
    pongs = [f.payload for f in peer.frames if f.opcode == websocket_frames.Opcode.PONG]
    count = len(pongs) if script.live_count is None else len(expected.pongs)
    assert pongs == expected.pongs[: count], title
    answers = expected.answers if script.live_count is None else min(expected.answers, script.live_count)
    assert peer.answers() == answers + expected.refused, title
    if expected.refused:
        last = json.loads([f for f in peer.frames if f.opcode == websocket_frames.Opcode.TEXT][-1].payload)
        assert last["error"]["status"] == 400, title


def test_a_server_that_waited_for_the_whole_frame_fails_6_4_3():
    # The check itself: the old Connection judged a text frame's UTF-8 only
    # once the whole frame was here, so it failed after the 3rd part.
    script = BY_ID["6.4.3"].build()
    assert script.fail_by == 1 and len(script.parts) == 3
    late = cw.Outcome(close=1007, failed=True, failed_at=2)
    assert cw.check(script, late) == ["failed at part 2, not by part 1"]


# --------------------------------------------------------------------------
# Reading a frame as it arrives changes when, never what
# --------------------------------------------------------------------------

_PAYLOADS = st.one_of(st.text(max_size=40).map(lambda t: t.encode("utf-8")), st.binary(max_size=40))


def _outcome(conn: ws.Connection, pieces: list[bytes]) -> tuple[list, int | None]:
    events = []
    for piece in pieces:
        try:
            events += conn.receive(piece)
        except websocket_frames.ProtocolError as err:
            return events, err.code
    return events, None


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(st.tuples(st.sampled_from([cw.TEXT, cw.BINARY, cw.CONT, cw.PING]), _PAYLOADS, st.booleans()),
                    max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_cut_gives_the_same_events_and_the_same_error(frames, cuts):
    wire = b"".join(cw.frame(op, payload, fin=fin or op == cw.PING) for op, payload, fin in frames)
    whole_events, whole_code = _outcome(ws.Connection(client=False, max_message=64), [wire])
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    pieces = [wire[a:b] for a, b in zip(points, points[1:])]
    cut_events, cut_code = _outcome(ws.Connection(client=False, max_message=64), pieces)
    assert cut_code == whole_code
    if whole_code is None:
        assert cut_events == whole_events
    else:  # the failing read drops what it completed: a cut may deliver more before the same error
        assert cut_events[: len(whole_events)] == whole_events
