"""The bottom layer: the wire written out, bytes in and events out, with no sockets.

    http_head.py           HTTP/1.1 heads with limits, and writing responses (RFC 9110/9112)
    http_body.py           bodies: chunked transfer coding, reading to the body's end
    http_fields.py         field syntax shared by heads and trailers, and ``HTTPError``
    sse.py                 Server-Sent Events: the encoder and the incremental WHATWG parser
    websocket.py           RFC 6455 messages and the ``Connection`` that assembles them
    websocket_frames.py    frames and close codes
    websocket_handshake.py the opening handshake, checked both ways
    anatomy.py             the wire laid out for a reader: chunks with their framing, a frame field by field
    endings.py             why a stream ended: the one stop vocabulary every layer above shares

Everything here is tested with plain byte strings (and fuzzed), and reused by the
server, the client and the proxy alike. It imports nothing else from streamlab.
"""
