"""RFC 9112's framing rules: the request-smuggling shapes, against the protocol layer and the server.

The table is ``streamlab.lab.conformance.http_framing.CASES``, each case naming the
section or the suite's test (llhttp ``test/request/*.md``, h11, the HTTP
Garden) it follows. Each request goes with a second one right behind it,
in the same write (pipelined, as llhttp's ``pipelining.md``):

- the protocol layer must refuse it with the required status, or read its
  body whole and leave exactly the second request, however the bytes are
  split;
- the server must answer it so, and then either close the connection
  without answering the second request (every refusal: it cannot know
  where that request starts), or answer the second request as the second
  request.
"""

from __future__ import annotations

import socket

import pytest
from streamlab.lab.conformance import http_framing as ch
from streamlab.protocol.http_body import BodyReader
from streamlab.protocol.http_head import ResponseHeadParser

pytestmark = pytest.mark.timeout(60)

IDS = [case.id for case in ch.CASES]
BY_ID = {case.id: case for case in ch.CASES}
AFTER = b"GET /health HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("way", ch.WAYS)
@pytest.mark.parametrize("case_id", IDS)
def test_protocol_layer(case_id, way):
    assert ch.run(BY_ID[case_id], way) == []


def exchange(port: int, data: bytes, timeout: float = 15.0) -> tuple[list[tuple[int, bytes]], bool]:
    """Send ``data`` in one write; every response until the server closes, ``(status, body)``, and whether it closed."""
    raw = b""
    closed = False
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                raw += chunk
            closed = True
        except ConnectionResetError:
            closed = True
        except socket.timeout:
            pass
    responses = []
    while raw:
        head = ResponseHeadParser()
        response = head.feed(raw)
        assert response is not None, raw[:200]
        body = BodyReader(response, "GET")
        pieces = body.feed(head.rest)
        responses.append((response.status, b"".join(pieces)))
        raw = body.rest
    return responses, closed


def keeps_alive(request: bytes) -> bool:
    return b" HTTP/1.0\r" not in request.split(b"\n", 1)[0] + b"\r" or b"keep-alive" in request


@pytest.mark.parametrize("case_id", IDS)
def test_server(app, case_id):
    case = BY_ID[case_id]
    host = b"127.0.0.1:%d" % app.port
    responses, closed = exchange(app.port, (case.request + AFTER).replace(b"HOST", host))
    statuses = [status for status, _ in responses]
    assert closed, f"{case_id}: the server kept the connection open"
    if not case.accepted:
        assert statuses == [case.status], f"{case_id}: answered {statuses}"  # nothing for the second request
        return
    assert statuses[0] == 200, f"{case_id}: answered {statuses}"
    if keeps_alive(case.request):
        assert statuses == [200, 200], f"{case_id}: answered {statuses}"
        assert b'"ok"' in responses[1][1]  # the second answer is /health's: the request behind was read as sent
    else:
        assert statuses == [200]  # HTTP/1.0 without keep-alive: closed after its answer


def test_pipelined_requests_are_answered_in_order(app):
    # llhttp test/request/pipelining.md: three requests in one write, three answers, in order.
    host = b"127.0.0.1:%d" % app.port
    data = (b"GET /health HTTP/1.1\r\nHost: HOST\r\n\r\nGET /log HTTP/1.1\r\nHost: HOST\r\n\r\n" + AFTER)
    responses, closed = exchange(app.port, data.replace(b"HOST", host))
    assert [status for status, _ in responses] == [200, 200, 200] and closed
    assert responses[1][1].startswith(b"[") and b'"ok"' in responses[2][1]  # /log's list, then /health's object


def test_a_malformed_second_request_still_gets_its_400(app):
    # After a kept-alive answer, a broken head is refused with 400, not by a silent close.
    host = b"127.0.0.1:%d" % app.port
    data = b"GET /health HTTP/1.1\r\nHost: HOST\r\n\r\nGET  /health HTTP/1.1\r\nHost: HOST\r\n\r\n"
    responses, closed = exchange(app.port, data.replace(b"HOST", host))
    assert [status for status, _ in responses] == [200, 400] and closed


def test_every_refusal_closes():
    assert all(case.closes for case in ch.CASES if not case.accepted)
