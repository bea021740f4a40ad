"""Chapter 12's other hops: gzip (the stand-in proxy's and nginx's), nginx's cache, curl as the tell.

The compressor is checked in bytes first (no sockets), then end to end in
front of an in-process server over the fake model, whose tokens come
0.03 s apart. nginx tests are skipped only where nginx is not installed
(CI installs it), curl's where curl is not.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from pathlib import Path
from typing import Any

import pytest

from streamlab.client import timed as client
from streamlab.client import wire
from streamlab.lab.experiments import other_hops
from streamlab.hops.compress import Gzip, accepts_gzip, compressed_sizes, no_transform
from streamlab.lab.outside.curl import curl_available, curl_stream
from streamlab.protocol.http_head import Request, RequestHeadParser, Response
from streamlab.hops.nginx import CACHE_STATUS, find_nginx, run_nginx, write_config
from streamlab.hops.forwarders import PassThrough, WholeResponse, forwarder_for
from streamlab.hops.heads import client_response_head
from streamlab.hops.proxy import ProxyConfig, serve_proxy
from streamlab.client.tracing import ResponseRecorder, Trace, TraceEvent

needs_nginx = pytest.mark.skipif(find_nginx() is None, reason="nginx is not installed (apt-get install nginx-light)")
pytestmark = pytest.mark.timeout(60)

DECODE = 0.03
BODY = {"prompt": "hi", "max_tokens": 12, "seed": 0, "chat": False, "ignore_eos": True}
EVENTS = [f'data: {{"text": " piece {i}"}}\n\n'.encode() for i in range(30)]


@pytest.fixture(scope="module")
def slow(apps):  # noqa: ANN001, ANN201
    return apps(decode_seconds=DECODE)


def _request(*headers: tuple[str, str]) -> Request:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers)
    return RequestHeadParser().feed(f"GET /stream HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode())


def _response(*headers: tuple[str, str]) -> Response:
    return Response(200, "OK", "HTTP/1.1", [(k.lower(), v) for k, v in headers])


def arrival_times(trace: Trace) -> set[float]:
    return {e.t for e in trace.text_events}


# --------------------------------------------------------------------------
# The compressor, in bytes
# --------------------------------------------------------------------------


def test_without_a_flush_deflate_releases_only_the_gzip_header_until_the_end():
    sizes = compressed_sizes(EVENTS, flush=False)
    assert sizes[0] == 10  # the gzip header, and nothing of the first event
    assert sizes[1:-1] == [0] * (len(EVENTS) - 1)
    assert sizes[-1] > 0  # everything comes out when the body ends


def test_a_sync_flush_releases_every_event_on_its_own():
    sizes = compressed_sizes(EVENTS, flush=True)
    assert all(size > 0 for size in sizes[:-1])
    gz, out = Gzip(flush=True), b""
    for event in EVENTS[:3]:
        (chunk,) = gz.feed(event)
        out += chunk
        # what has arrived so far decodes to exactly what went in: the reader can show it now
        assert zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(out) == b"".join(EVENTS[: EVENTS.index(event) + 1])


@pytest.mark.parametrize("flush", [False, True])
def test_either_way_the_body_is_a_valid_gzip_of_the_events(flush):
    gz = Gzip(flush=flush)
    out = b"".join(b"".join(gz.feed(e)) for e in EVENTS) + gz.finish()
    assert gzip.decompress(out) == b"".join(EVENTS)
    assert (gz.took, gz.gave) == (sum(map(len, EVENTS)), len(out))


def test_who_gets_compressed():
    assert accepts_gzip(_request(("Accept-Encoding", "br, gzip;q=0.8")))
    assert not accepts_gzip(_request(("Accept-Encoding", "identity"))) and not accepts_gzip(_request())
    assert no_transform(_response(("Cache-Control", "no-cache, no-transform")))
    assert not no_transform(_response(("Cache-Control", "no-cache")))
    stream = _response(("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache, no-transform"))
    asks = _request(("Accept-Encoding", "gzip"))
    config = ProxyConfig(1, block=1, gzip="buffered")
    assert isinstance(forwarder_for(asks, stream, config), Gzip)
    assert isinstance(forwarder_for(_request(), stream, config), PassThrough)  # the reader did not ask
    honouring = ProxyConfig(1, block=1, gzip="buffered", honor=True)
    assert isinstance(forwarder_for(asks, stream, honouring), PassThrough)  # no-transform honoured
    encoded = _response(("Content-Encoding", "br"))
    assert isinstance(forwarder_for(asks, encoded, config), PassThrough)  # never compress twice
    assert isinstance(forwarder_for(asks, stream, ProxyConfig(1, buffer_response=True)), WholeResponse)


def test_a_compressed_head_says_so_and_drops_the_length():
    head = client_response_head(_response(("Content-Length", "99")), "gzip buffered", Gzip(flush=False).headers)
    assert b"Content-Encoding: gzip\r\n" in head and b"Vary: Accept-Encoding\r\n" in head
    assert b"Content-Length" not in head


def test_the_recorder_decodes_a_gzip_stream_as_it_comes():
    gz = Gzip(flush=True)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n\r\n"
    trace = Trace("stream")
    recorder = ResponseRecorder(trace, "GET")
    recorder.feed(head, 0.0)
    for i, event in enumerate(EVENTS[:3]):
        recorder.feed(b"".join(gz.feed(event)), float(i + 1))
    assert [e.text for e in trace.text_events] == [" piece 0", " piece 1", " piece 2"]
    assert arrival_times(trace) == {1.0, 2.0, 3.0}


def test_the_client_sends_extra_headers():
    request = wire.post_request(8000, "/stream", {}, headers=other_hops.ACCEPT_GZIP)
    assert b"\r\nAccept-Encoding: gzip\r\n" in request and request.count(b"\r\n\r\n") == 1


# --------------------------------------------------------------------------
# The stand-in gzip hop, end to end
# --------------------------------------------------------------------------


def via_gzip(port: int, **options: Any) -> tuple[Trace, Trace]:
    async def main() -> tuple[Trace, Trace]:
        async with serve_proxy(port, block=1, **options) as proxy:
            direct = await client.post(port, "/stream", BODY)
            hop = await client.post(proxy.port, "/stream", BODY, headers=other_hops.ACCEPT_GZIP)
            return direct, hop

    return asyncio.run(main())


def test_a_buffering_gzip_hop_delivers_every_event_at_the_end(slow):
    direct, trace = via_gzip(slow.port, gzip="buffered")
    assert trace.headers["content-encoding"] == "gzip"
    assert trace.text == direct.text and trace.complete
    assert len(arrival_times(trace)) == 1 and trace.first_text == trace.end
    assert trace.first_byte < trace.first_text  # the head (and gzip header) came early: a byte is not an event
    assert len(arrival_times(direct)) > 1


@pytest.mark.parametrize(("options", "encoding"), [({"gzip": "flush"}, "gzip"), ({"gzip": "buffered", "honor": True}, None)],
                         ids=["sync-flush", "honours-no-transform"])
def test_the_fixes_stream_again(slow, options, encoding):
    direct, trace = via_gzip(slow.port, **options)
    assert trace.headers.get("content-encoding") == encoding
    assert trace.text == direct.text and trace.complete
    assert len(arrival_times(trace)) > 1 and trace.first_text < trace.end


# --------------------------------------------------------------------------
# nginx: gzip and the cache
# --------------------------------------------------------------------------


def test_config_puts_location_settings_in_location_and_a_cache_zone_in_the_folder(tmp_path: Path):
    text = write_config(tmp_path, 1, 2, location=other_hops.NGINX_CACHE_EVERYTHING, cache=True).read_text()
    root = text[text.index("location / {") : text.index("location /ws")]
    assert "proxy_cache streamlab;" in root and "proxy_ignore_headers" in root
    assert "proxy_cache" not in text[text.index("location /ws") :]
    assert f"proxy_cache_path {tmp_path.resolve()}/cache " in text
    assert f"add_header {CACHE_STATUS} $upstream_cache_status always;" in text
    assert "proxy_cache_path" not in write_config(tmp_path, 1, 2).read_text()


@needs_nginx
@pytest.mark.parametrize(("location", "streams"), [(other_hops.NGINX_GZIP, True),
                                                   (other_hops.NGINX_GZIP + "proxy_ignore_headers X-Accel-Buffering;", False)],
                         ids=["x-accel-buffering-honoured", "header-ignored"])
def test_nginx_gzip(slow, location, streams):
    with run_nginx(slow.port, location=location) as nginx:
        trace = client.post_sync(nginx.port, "/stream", BODY, headers=other_hops.ACCEPT_GZIP)
    assert trace.headers["content-encoding"] == "gzip"  # no-transform or not, nginx compresses
    assert trace.complete and len(trace.text_events) == BODY["max_tokens"]
    if streams:  # unbuffered, nginx flushes its compressor on every write
        assert len(arrival_times(trace)) > 1
    else:
        assert len(arrival_times(trace)) == 1 and trace.first_text == trace.end


@needs_nginx
@pytest.mark.parametrize("location", [other_hops.NGINX_CACHE_EVERYTHING, other_hops.NGINX_CACHE_HONOURING],
                         ids=["cache-everything", "honouring-the-origin"])
def test_nginx_cache_and_a_reconnecting_reader(slow, location):
    everything = location == other_hops.NGINX_CACHE_EVERYTHING
    generation = client.create_generation_sync(slow.port, BODY)
    with run_nginx(slow.port, location=location, cache=True) as nginx:
        first = client.events_sync(nginx.port, generation["events"])
        again = client.events_sync(nginx.port, generation["events"], last_event_id=5)
    assert first.complete and len(first.text_events) == BODY["max_tokens"]
    ids = [int(e.id) for e in again.events if e.id is not None]
    if everything:  # a replay from the cache: the whole answer again, Last-Event-ID or not
        assert again.headers[CACHE_STATUS.lower()] == "HIT"
        assert ids[0] == 1 and again.text == first.text
        assert len(arrival_times(first)) == 1  # and the first reader waited for the whole answer
    else:  # the server answered the reconnect: what came after event 5
        assert again.headers[CACHE_STATUS.lower()] != "HIT"
        assert ids[0] == 6 and first.text.endswith(again.text) and again.text != first.text


# --------------------------------------------------------------------------
# curl, and the verdicts
# --------------------------------------------------------------------------


@pytest.mark.skipif(not curl_available(), reason="curl is not installed")
def test_curl_streams_with_n_and_buffers_without(slow):
    streamed = curl_stream(f"{slow.url}/stream", BODY)
    buffered = curl_stream(f"{slow.url}/stream", BODY, no_buffer=False)
    assert streamed.returncode == buffered.returncode == 0
    assert len(streamed.text_times) == len(buffered.text_times) == BODY["max_tokens"]
    assert streamed.writes > 1 and len(set(streamed.text_times)) > 1
    assert buffered.writes == 1 and buffered.first_text == buffered.end  # curl's own buffer, until the end
    assert b"data: [DONE]" in buffered.output
    trace = streamed.trace("curl -N")
    assert len(trace.text_events) == BODY["max_tokens"] and trace.end == streamed.end


def _trace(times: list[float], **fields: Any) -> Trace:
    trace = Trace("stream", **fields)
    trace.events = [TraceEvent(t, "text", "x") for t in times]
    trace.first_text = times[0] if times else None
    trace.end = fields.get("end", times[-1] if times else None)
    return trace


def test_seen_names_what_the_reader_saw():
    assert other_hops.seen(_trace([0.1, 0.5, 1.0], complete=True)).startswith("streamed 3 pieces")
    assert other_hops.seen(_trace([1.0, 1.0, 1.0], complete=True)).startswith("all 3 pieces at once")
    assert "no end event" in other_hops.seen(_trace([0.1, 0.2]))
    assert "execution_limit" in other_hops.seen(_trace([0.1], error={"type": "execution_limit"}, stop_reason="error"))
    assert other_hops.seen(_trace([], status=504, error={"message": "execution_limit: ..."})).startswith("504")
