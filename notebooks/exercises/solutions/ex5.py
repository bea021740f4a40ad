"""Exercise 5, a model answer: time to first byte and to first event, with a raw socket."""

import json
import socket
import time

from streamlab.protocol.sse import EventStreamParser


def _request(port, body):
    payload = json.dumps(body).encode("utf-8")
    head = (
        "POST /stream HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + payload


def first_byte_time(port, body):
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        started = time.perf_counter()
        sock.sendall(_request(port, body))
        if not sock.recv(65536):
            raise ConnectionError("the connection closed before any byte came")
        return time.perf_counter() - started


def first_event_time(port, body):
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        started = time.perf_counter()
        sock.sendall(_request(port, body))
        head, parser = b"", None
        while True:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the response ended before its first event")
            if parser is None:  # still reading the response head
                head += data
                if b"\r\n\r\n" not in head:
                    continue
                head, data = head.split(b"\r\n\r\n", 1)
                parser = EventStreamParser()
            if parser.feed(data):
                return time.perf_counter() - started


explanation = (
    "The proxy passes the response head (status line and headers) on at once, so the first byte "
    "arrives early; but it holds the body in its buffer until a whole 8 KiB block fills or the "
    "answer ends. A short answer never fills a block, so the first event reaches the reader with "
    "the last one, at the end. With --honor the server's X-Accel-Buffering: no header switches "
    "buffering off, and each event passes as soon as it is written."
)
