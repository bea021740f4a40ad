"""UpstreamGeneration against a scripted OpenAI-compatible upstream on a real socket.

The upstream, written here, answers ``POST /v1/chat/completions`` with an event
stream on a schedule (one content chunk every ``interval`` seconds), in the
framing asked for (chunked, Content-Length or close-delimited), and notes how
many content chunks it produced and when it saw its client go (a read that
returns EOF or a reset, or a write that fails). It stops producing then, as
vLLM and llama.cpp do: that is what lets a test see the abort propagate.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamlab.model.lifecycle import Piece
from streamlab.protocol.http_body import LAST_CHUNK, encode_chunk
from streamlab.protocol.http_head import parse_request_head, response_head
from streamlab.server.answers.upstream import UpstreamGeneration, chat_completions_url
from streamlab.protocol.endings import EOS, ERROR, MAX_TOKENS, STOPPED

STOP_SEQUENCE = "stop_sequence"
TEXTS = ["Hel", "lo", ", ", "wor", "ld", "!"]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "temperature": 0.5}


@dataclass
class Script:
    """What the upstream answers."""

    texts: list[str] = field(default_factory=lambda: list(TEXTS))
    interval: float = 0.005
    framing: str = "chunked"  # chunked | length | close
    finish_reason: str | None = "stop"
    choice_extra: dict = field(default_factory=dict)  # e.g. vLLM's {"stop_reason": "###"}
    usage: bool = True  # send the usage chunk (if the request asked for it)
    done: bool = True  # send data: [DONE]
    cut_after: int | None = None  # close after this many content chunks, before any finish_reason
    error_after: int | None = None  # an {"error": ...} event after this many content chunks
    status: int = 200
    error_body: bytes | None = None  # the body of a non-2xx answer
    head_delay: float = 0.0  # silence before the response head ("reading the prompt")
    split: int = 0  # write each event in pieces of this many bytes


class Upstream:
    """A scripted OpenAI-compatible server: ``async with Upstream(Script(...)) as up: up.url``."""

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or Script()
        self.produced = 0  # content chunks written
        self.connections = 0
        self.requests: list[tuple[Any, dict]] = []
        self.gone_at: float | None = None  # perf_counter when the client was seen gone
        self.finished = asyncio.Event()  # the handler returned
        self.gone = asyncio.Event()

    async def __aenter__(self) -> "Upstream":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.finished.wait(), 1.0) if self.connections else None

    def _gone(self) -> None:
        if self.gone_at is None:
            self.gone_at = time.perf_counter()
            self.gone.set()

    async def _watch(self, reader: asyncio.StreamReader) -> None:
        with suppress(ConnectionError):
            while await reader.read(4096):
                pass
        self._gone()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        watcher = None
        try:
            request = parse_request_head(await reader.readuntil(b"\r\n\r\n"))
            body = json.loads(await reader.readexactly(request.content_length() or 0))
            self.requests.append((request, body))
            watcher = asyncio.ensure_future(self._watch(reader))
            await self._answer(writer, body)
        except ConnectionError:
            self._gone()
        finally:
            if watcher is not None:
                await asyncio.sleep(0.02)  # a last look for the client's EOF
                watcher.cancel()
            writer.close()
            self.finished.set()

    def _events(self, body: dict) -> list[tuple[str, bytes]]:
        """(kind, bytes) of each event the script sends, kind "content" for a content chunk."""
        s = self.script

        def chunk(delta: dict, finish: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, **extra}
            obj = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
            if (body.get("stream_options") or {}).get("include_usage"):
                obj["usage"] = None  # as OpenAI does: every chunk says it, the last one fills it in
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        events = [("role", chunk({"role": "assistant", "content": ""}))]
        for i, text in enumerate(s.texts):
            if i == s.cut_after:
                return events
            if i == s.error_after:
                error = {"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}}
                return [*events, ("error", b"data: " + json.dumps(error).encode() + b"\n\n")]
            events.append(("content", chunk({"content": text})))
        if s.finish_reason:
            events.append(("finish", chunk({}, s.finish_reason, **s.choice_extra)))
        if s.usage and (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 9, "completion_tokens": 2 * len(s.texts), "total_tokens": 9 + 2 * len(s.texts)}
            events.append(("usage", b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"))
        if s.done:
            events.append(("done", b"data: [DONE]\n\n"))
        return events

    async def _answer(self, writer: asyncio.StreamWriter, body: dict) -> None:
        s = self.script
        if s.head_delay:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.gone.wait(), s.head_delay)  # a server that watches its socket
            if self.gone_at is not None:
                return
        if s.status != 200:
            writer.write(response_head(
                s.status, [("Content-Type", "application/json")], content_length=len(s.error_body or b"")
            ) + (s.error_body or b""))
            await writer.drain()
            return
        events = self._events(body)
        headers = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")]
        if s.framing == "length":
            total = sum(len(data) for _, data in events) + (100 if s.cut_after is not None else 0)
            writer.write(response_head(200, headers, content_length=total))
        elif s.framing == "chunked":
            writer.write(response_head(200, headers, chunked=True))
        else:
            writer.write(response_head(200, [*headers, ("Connection", "close")]))
        for kind, data in events:
            if self.gone_at is not None:
                return  # the client left: stop generating
            if kind == "content":
                await asyncio.sleep(s.interval)
                if self.gone_at is not None:
                    return
            wire = encode_chunk(data) if s.framing == "chunked" else data
            for i in range(0, len(wire), s.split or len(wire)):
                writer.write(wire[i : i + (s.split or len(wire))])
                await writer.drain()
            if kind == "content":
                self.produced += 1
        complete = s.cut_after is None and s.error_after is None
        if s.framing == "chunked" and complete:
            writer.write(LAST_CHUNK)
            await writer.drain()


def aio(test: Callable) -> Callable:
    """Run an async test with asyncio.run, within a second."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(asyncio.wait_for(test(), 5.0))

    return run


async def read_all(gen: UpstreamGeneration) -> tuple[list[Piece], Any]:
    pieces = [p async for p in gen.start().pieces()]
    return pieces, await gen.wait()


# -- the request, the text, the tokens -----------------------------------------


def test_base_url_with_or_without_v1():
    assert chat_completions_url("http://127.0.0.1:8000") == ("http", "127.0.0.1", 8000, "/v1/chat/completions")
    assert chat_completions_url("http://h:8000/v1/") == ("http", "h", 8000, "/v1/chat/completions")
    assert chat_completions_url("127.0.0.1:8000/v1")[3] == "/v1/chat/completions"
    assert chat_completions_url("https://api.example.com/openai")[1:] == ("api.example.com", 443, "/openai/v1/chat/completions")
    with pytest.raises(ValueError):
        chat_completions_url("ftp://h/")


@aio
async def test_text_tokens_usage_and_the_request_sent():
    seen = []
    async with Upstream() as up:
        gen = UpstreamGeneration(up.url + "/v1", BODY, api_key="sk-test", headers={"X-Trace": "7"}, on_token=seen.append)
        pieces, result = await read_all(gen)
    request, body = up.requests[0]
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.header("host") == f"127.0.0.1:{up.port}"
    assert request.header("content-type") == "application/json"
    assert request.header("accept") == "text/event-stream"
    assert request.header("authorization") == "Bearer sk-test" and request.header("x-trace") == "7"
    assert body == {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    assert [p.text for p in pieces] == TEXTS and [p.tokens for p in pieces] == [1, 2, 3, 4, 5, 6]
    assert result.text == "".join(TEXTS) and result.stop_reason == EOS and result.error is None
    assert seen == [1, 2, 3, 4, 5, 6, 12]  # one per content chunk, then the upstream's own count
    assert result.tokens == gen.tokens == 12 and result.prompt_tokens == gen.prompt_tokens_read == 9
    assert gen.finish_reason == "stop" and gen.upstream_status == 200 and gen.closed_upstream_at is None
    assert result.token_times == [p.time for p in pieces] == sorted(result.token_times)
    assert result.started <= result.token_times[0] <= result.ended


@aio
async def test_finish_reasons():
    cases = [
        (Script(finish_reason="stop"), EOS),
        (Script(finish_reason="length"), MAX_TOKENS),
        (Script(finish_reason="stop", choice_extra={"stop_reason": "###"}), STOP_SEQUENCE),  # vLLM names the string
        (Script(finish_reason="stop", choice_extra={"stop_reason": 128009}), EOS),  # ... or a stop token
    ]
    for script, reason in cases:
        async with Upstream(script) as up:
            result = await UpstreamGeneration(up.url, BODY).start().wait()
        assert (result.stop_reason, result.error) == (reason, None)
    async with Upstream(Script(finish_reason="content_filter")) as up:
        gen = UpstreamGeneration(up.url, BODY)
        result = await gen.wait()
    assert result.stop_reason == ERROR and "content_filter" in result.error and gen.finish_reason == "content_filter"


@aio
async def test_without_usage_the_tokens_are_the_chunks():
    async with Upstream(Script(usage=False)) as up:
        gen = UpstreamGeneration(up.url, BODY)
        result = await gen.wait()
    assert (result.tokens, result.prompt_tokens, gen.usage) == (len(TEXTS), 0, None)


@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
@pytest.mark.parametrize("done", [True, False])
def test_framings_with_and_without_done(framing, done):
    @aio
    async def check():
        async with Upstream(Script(framing=framing, done=done, split=7)) as up:  # events split across reads
            pieces, result = await read_all(UpstreamGeneration(up.url, BODY))
        assert [p.text for p in pieces] == TEXTS
        assert (result.stop_reason, result.error, result.tokens) == (EOS, None, 12)

    check()


# -- the abort propagated --------------------------------------------------------


@aio
async def test_stop_closes_the_upstream_connection_and_it_stops_producing():
    n = 3
    async with Upstream(Script(texts=[f"t{i} " for i in range(40)], interval=0.05)) as up:
        gen = UpstreamGeneration(up.url, BODY)
        got = []
        async for piece in gen.start().pieces():
            got.append(piece)
            if len(got) == n:
                stopped_at = time.perf_counter()
                gen.stop("eof")
                gen.stop("again")  # safe to repeat; the first source is kept
        result = await gen.wait()
        await asyncio.sleep(0.1)  # five more chunks' worth of time: the upstream would have made them
    assert result.stop_reason == STOPPED and result.error is None and gen.stopped_by == "eof" and gen.stopping
    assert len(got) == n and result.tokens == n and result.text == "t0 t1 t2 "
    assert up.produced <= n + 2
    assert gen.closed_upstream_at is not None and up.gone_at is not None
    # At once, not when the next chunk comes (0.05 s later) and a read finds the flag.
    assert stopped_at <= gen.closed_upstream_at <= up.gone_at < stopped_at + 0.04


@aio
async def test_without_stop_the_upstream_produces_everything():
    """The naive relay: its reader looked at three pieces and went, nobody called stop()."""
    async with Upstream(Script(texts=[f"t{i} " for i in range(20)])) as up:
        gen = UpstreamGeneration(up.url, BODY)
        pieces = gen.start().pieces()
        for _ in range(3):
            await anext(pieces)
        result = await gen.wait()
    assert up.produced == 20 and result.stop_reason == EOS and result.tokens == 40
    assert gen.closed_upstream_at is None


@aio
async def test_stop_while_the_upstream_reads_the_prompt():
    async with Upstream(Script(head_delay=2.0)) as up:
        gen = UpstreamGeneration(up.url, BODY).start()
        await asyncio.sleep(0.05)
        stopped_at = time.perf_counter()
        gen.stop("cancel")
        result = await gen.wait()
        await asyncio.sleep(0.03)
    assert result.stop_reason == STOPPED and result.tokens == 0 and up.produced == 0
    assert result.ended - stopped_at < 0.05 and up.gone_at - stopped_at < 0.05  # not when the head comes, 2 s later
    assert up.gone_at is not None and gen.closed_upstream_at is not None


@aio
async def test_stop_before_start_never_connects():
    async with Upstream() as up:
        gen = UpstreamGeneration(up.url, BODY)
        gen.stop("cancel")
        result = await gen.wait()
    assert result.stop_reason == STOPPED and up.connections == 0 and gen.closed_upstream_at is None


@aio
async def test_stop_from_another_thread():
    async with Upstream(Script(texts=["x"] * 40, interval=0.01)) as up:
        gen = UpstreamGeneration(up.url, BODY).start()
        pieces = gen.pieces()
        await anext(pieces)
        await asyncio.to_thread(gen.stop, "write_failed")
        result = await gen.wait()
    assert result.stop_reason == STOPPED and up.produced < 10


@aio
async def test_stop_after_the_end_changes_nothing():
    async with Upstream() as up:
        gen = UpstreamGeneration(up.url, BODY)
        result = await gen.wait()
        gen.stop("eof")
    assert result.stop_reason == EOS and gen.result is result and gen.closed_upstream_at is None


# -- errors ----------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
def test_a_stream_cut_before_its_end_is_an_error(framing):
    @aio
    async def check():
        async with Upstream(Script(framing=framing, cut_after=3)) as up:
            pieces, result = await read_all(UpstreamGeneration(up.url, BODY))
        assert len(pieces) == 3 and result.text == "Hello, "
        assert result.stop_reason == ERROR and "ended without finish_reason" in result.error
        if framing != "close":  # a close-delimited body cannot tell a cut from an end: only the events can
            assert "connection closed after" in result.error

    check()


@aio
async def test_an_upstream_400_is_relayed_with_its_status_and_message():
    error = {"error": {"message": "max_tokens is too large: 99999", "type": "invalid_request_error", "code": 400}}
    async with Upstream(Script(status=400, error_body=json.dumps(error).encode())) as up:
        gen = UpstreamGeneration(up.url, BODY)
        result = await gen.wait()
    assert result.stop_reason == ERROR and gen.upstream_status == 400
    assert "400" in result.error and "max_tokens is too large: 99999" in result.error
    async with Upstream(Script(status=502, error_body=b"<html>Bad Gateway</html>")) as up:
        gen = UpstreamGeneration(up.url, BODY)
        result = await gen.wait()
    assert gen.upstream_status == 502 and "<html>Bad Gateway</html>" in result.error


@aio
async def test_an_error_event_mid_stream():
    async with Upstream(Script(error_after=2)) as up:
        pieces, result = await read_all(UpstreamGeneration(up.url, BODY))
    assert [p.text for p in pieces] == ["Hel", "lo"]
    assert result.stop_reason == ERROR and "CUDA out of memory" in result.error and result.text == "Hello"


@aio
async def test_connection_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before anyone connects: nothing listens there
    gen = UpstreamGeneration(f"http://127.0.0.1:{port}", BODY)
    pieces, result = await read_all(gen)
    assert pieces == [] and result.stop_reason == ERROR and gen.upstream_status is None
    assert "could not connect" in result.error and str(port) in result.error


@aio
async def test_a_silent_upstream_times_out_and_is_closed():
    async with Upstream(Script(head_delay=2.0)) as up:
        gen = UpstreamGeneration(up.url, BODY, read_timeout=0.1)
        result = await gen.wait()
        await asyncio.sleep(0.03)
    assert result.stop_reason == ERROR and "timed out" in result.error and up.gone_at is not None


@aio
async def test_garbage_instead_of_http():
    async def serve(reader, writer):
        await reader.read(100)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        gen = UpstreamGeneration(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", BODY)
        result = await gen.wait()
    assert result.stop_reason == ERROR and "malformed" in result.error


# -- pieces() and wait(), read or not ----------------------------------------------


@aio
async def test_wait_without_reading_the_pieces():
    async with Upstream() as up:
        result = await UpstreamGeneration(up.url, BODY).wait()  # wait() starts it
    assert result.text == "".join(TEXTS) and result.stop_reason == EOS


@aio
async def test_pieces_after_the_end_and_twice():
    async with Upstream() as up:
        gen = UpstreamGeneration(up.url, BODY)
        await gen.wait()
        late = [p.text async for p in gen]  # buffered, then the end
        again = [p.text async for p in gen]  # a second reader ends at once instead of hanging
    assert late == TEXTS and again == []


@aio
async def test_pieces_alone_sets_the_result():
    async with Upstream() as up:
        gen = UpstreamGeneration(up.url, BODY)
        async for _ in gen.pieces():
            pass
        assert gen.result is not None and gen.result.stop_reason == EOS
        assert gen.start() is gen  # idempotent
