"""Chapter 10's experiments: the formats people use, the SDKs that read them, and a cut stream.

Three questions, each answered against a live server with the real model:

1. ``same_answer``: one answer (same prompt, same seed) as streamlab's SSE,
   OpenAI's ``chat.completion.chunk`` stream, the typed events of OpenAI's
   Responses API and Anthropic's Messages events, traced on a raw socket
   (bytes, events, time to first text, how it ended) and then read by each
   format's own client (``httpx-sse``, ``openai`` on both its APIs,
   ``anthropic``), timing the first text each hands to the program.
2. ``CuttingHop`` and ``truncation_table``: the proxy with ``--cut-after``,
   which ends the response *cleanly* (the zero-length chunk) after N
   pieces, as a platform or proxy with a time limit does. What does each
   reader do with a well-formed body that lacks its ending?
3. A client of the relay (``serve --upstream``) leaves after N pieces; how
   many tokens did the upstream generate? That one is ``relay_leaving.py``'s.

The functions return plain rows (dicts) for a table, with the traces kept
where a plot needs them.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Callable

from streamlab.client import timed as client
from streamlab.client.tracing import RESPONSE_ENDS, Trace, piece_text, response_ending
from streamlab.hops.exchange import CUT_AFTER
from streamlab.hops.forwarders import EventSplitter
from streamlab.hops.proxy import Proxy, ProxyConfig
from streamlab.protocol import sse

PROMPT = "Tell me about lighthouses."
# Sampled, not greedy, so that the seed matters; every format gets the same three numbers.
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "seed": 1}

STREAMLAB, OPENAI, RESPONSES, ANTHROPIC = "streamlab SSE", "OpenAI chunks", "OpenAI Responses events", "Anthropic events"
ROUTES = {STREAMLAB: "/stream", OPENAI: "/v1/chat/completions", RESPONSES: "/v1/responses", ANTHROPIC: "/v1/messages"}
SHORT = {STREAMLAB: "SSE", OPENAI: "OpenAI chunks", RESPONSES: "Responses", ANTHROPIC: "Anthropic"}  # for a headline
# What a reader must see last for the answer to be whole, per format.
TERMINATORS = {STREAMLAB: "event: end, then data: [DONE]", OPENAI: "finish_reason, then data: [DONE]",
               RESPONSES: "response.completed (response.incomplete at the length limit), no [DONE]",
               ANTHROPIC: "message_delta (stop_reason), then message_stop"}


def request_body(fmt: str, max_tokens: int, *, prompt: str = PROMPT, model: str = "default",
                 **extra: Any) -> dict[str, Any]:
    """The same question in each API's own request shape (streamed)."""
    messages = [{"role": "user", "content": prompt}]
    if fmt == STREAMLAB:
        return {"prompt": prompt, "max_tokens": max_tokens, **SAMPLING, **extra}
    if fmt == OPENAI:
        return {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens, **SAMPLING, **extra}
    if fmt == RESPONSES:  # the same user message as a string: input's shortest form
        return {"model": model, "input": prompt, "stream": True, "max_output_tokens": max_tokens, **SAMPLING, **extra}
    if fmt == ANTHROPIC:
        return {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens, **SAMPLING, **extra}
    raise ValueError(f"unknown format {fmt!r}")


def model_name(port: int) -> str:
    """The model the server says it serves (``GET /v1/models``): what an SDK puts in ``model``."""
    return client.get_json_sync(port, "/v1/models")["data"][0]["id"]


def ending(trace: Trace) -> str | None:
    """How the stream said it ended (the stop or finish reason), or None when it never said."""
    for event in reversed(trace.events):
        if event.kind != "end":
            continue
        data = event.data if isinstance(event.data, dict) else {}
        if data.get("type") in RESPONSE_ENDS:  # the Responses API's terminal event: its status, or why incomplete
            return response_ending(data.get("response"))
        if data.get("stop_reason"):  # ours
            return data["stop_reason"]
        if isinstance(data.get("delta"), dict) and data["delta"].get("stop_reason"):  # Anthropic's message_delta
            return data["delta"]["stop_reason"]
        choices = data.get("choices") or [{}]
        if choices[0].get("finish_reason"):  # OpenAI's last chunk
            return choices[0]["finish_reason"]
    return None


# --------------------------------------------------------------------------
# 1. The same answer in every format
# --------------------------------------------------------------------------


def raw_row(fmt: str, trace: Trace) -> dict[str, Any]:
    """One format's cost and timing, as the raw socket saw it."""
    return {
        "format": fmt,
        "route": ROUTES[fmt],
        "bytes on the wire": trace.total_bytes,
        "events": len(trace.events),
        "text events": len(trace.text_events),
        "text bytes": trace.text_bytes,
        "bytes in text events": sum(e.nbytes or 0 for e in trace.text_events),
        "bytes per text byte": round(trace.ratio, 1),
        "first text (s)": None if trace.first_text is None else round(trace.first_text, 3),
        "end (s)": None if trace.end is None else round(trace.end, 3),
        "ended with": ending(trace),
        "terminator seen": trace.complete,
    }


def first_piece(trace: Trace) -> str:
    """The first event that carries text, exactly as it crossed the wire (without its chunk framing)."""
    for block, events in EventSplitter().feed(trace.body):
        if any(carries_text(event) for event in events):
            return block.decode("utf-8", "replace")
    return ""


def raw_traces(port: int, max_tokens: int, *, model: str = "default") -> dict[str, Trace]:
    """The same answer in each format, traced on a raw socket, one after the other."""
    return {fmt: client.post_sync(port, ROUTES[fmt], request_body(fmt, max_tokens, model=model))
            for fmt in ROUTES}


@dataclass
class SdkRead:
    """What one SDK handed to the program: the text, when its first piece came, how it ended (or what it raised)."""

    reader: str
    format: str
    text: str = ""
    first_text: float | None = None
    end: float | None = None
    stop_reason: str | None = None
    raised: str | None = None  # the exception's type and message, when it raised
    failed: str | None = None  # a failure the stream's own event reported, which the SDK handed over unraised
    pieces: int = 0
    times: list[float] = field(default_factory=list)

    def got(self, text: str | None, started: float) -> None:
        if text:
            t = time.perf_counter() - started
            self.times.append(t)
            self.text += text
            self.pieces += 1
            if self.first_text is None:
                self.first_text = t


def _reading(reader: str, fmt: str, body: Callable[[SdkRead, float], None], *, owned: Any = None) -> SdkRead:
    """Run one SDK reading, timing from the call and keeping whatever it raised as a result.

    ``owned`` is a client made for this reading alone: it is closed afterwards.
    """
    result = SdkRead(reader, fmt)
    started = time.perf_counter()
    try:
        body(result, started)
    except Exception as exc:  # noqa: BLE001 - what the SDK raises is the measurement
        result.raised = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        result.end = time.perf_counter() - started
        if owned is not None:
            with suppress(Exception):
                owned.close()
    return result


def read_httpx_sse(url: str, max_tokens: int, *, prompt: str = PROMPT, sdk: Any = None) -> SdkRead:
    """streamlab's ``/stream`` read with ``httpx`` and ``httpx-sse``: a piece per ``data: {"text"}``."""
    import httpx
    from httpx_sse import connect_sse

    http = sdk or httpx.Client(timeout=120)
    owned = None if sdk else http
    payload = request_body(STREAMLAB, max_tokens, prompt=prompt)

    def body(result: SdkRead, started: float) -> None:
        with connect_sse(http, "POST", f"{url}/stream", json=payload) as events:
            for event in events.iter_sse():
                if event.event == "end":
                    result.stop_reason = json.loads(event.data).get("stop_reason")
                elif event.event == "error":
                    raise RuntimeError(event.data)
                elif event.data != sse.DONE:
                    result.got(json.loads(event.data).get("text"), started)

    return _reading("httpx-sse: iter_sse()", STREAMLAB, body, owned=owned)


def _openai(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def read_openai(url: str, max_tokens: int, *, model: str, prompt: str = PROMPT, sdk: Any = None) -> SdkRead:
    """``client.chat.completions.create(stream=True)``, iterated: the way most programs read a stream."""
    owned = None if sdk else _openai(url)
    sdk = sdk or owned
    kwargs = request_body(OPENAI, max_tokens, prompt=prompt, model=model)

    def body(result: SdkRead, started: float) -> None:
        for chunk in sdk.chat.completions.create(**kwargs):
            if chunk.choices:
                result.got(chunk.choices[0].delta.content, started)
                result.stop_reason = chunk.choices[0].finish_reason or result.stop_reason

    return _reading("openai: for chunk in a streamed create()", OPENAI, body, owned=owned)


def read_openai_helper(url: str, max_tokens: int, *, model: str, prompt: str = PROMPT, sdk: Any = None) -> SdkRead:
    """The SDK's higher-level helper: ``chat.completions.stream()``, then ``get_final_completion()``."""
    owned = None if sdk else _openai(url)
    sdk = sdk or owned
    kwargs = {k: v for k, v in request_body(OPENAI, max_tokens, prompt=prompt, model=model).items() if k != "stream"}

    def body(result: SdkRead, started: float) -> None:
        with sdk.chat.completions.stream(**kwargs) as stream:
            for event in stream:
                if event.type == "content.delta":
                    result.got(event.delta, started)
            final = stream.get_final_completion()
        result.stop_reason = final.choices[0].finish_reason
        result.text = final.choices[0].message.content or result.text

    return _reading("openai: stream() helper, get_final_completion()", OPENAI, body, owned=owned)


def read_openai_responses(url: str, max_tokens: int, *, model: str, prompt: str = PROMPT, sdk: Any = None) -> SdkRead:
    """``client.responses.create(stream=True)``, iterated: each ``response.output_text.delta``'s text, then the end.

    The stop reason is the terminal event's: ``completed``, or why the
    response is ``incomplete`` (``max_output_tokens``). A ``response.failed``
    is an event like the others to this SDK (it raises only on a top-level
    ``error``): its message is kept as ``failed``, as a program that checks
    the event's type would keep it.
    """
    owned = None if sdk else _openai(url)
    sdk = sdk or owned
    body = request_body(RESPONSES, max_tokens, prompt=prompt, model=model)
    kwargs = {**{k: v for k, v in body.items() if k != "seed"}, "extra_body": {"seed": body["seed"]}}  # not the API's

    def read(result: SdkRead, started: float) -> None:
        for event in sdk.responses.create(**kwargs):
            if event.type == "response.output_text.delta":
                result.got(event.delta, started)
            elif event.type in ("response.completed", "response.incomplete"):
                details = event.response.incomplete_details
                result.stop_reason = details.reason if details and details.reason else event.response.status
            elif event.type == "response.failed":
                error = event.response.error
                result.failed = f"response.failed: {error.message if error else 'no error given'}"[:200]

    return _reading("openai: for event in responses.create()", RESPONSES, read, owned=owned)


def _anthropic(url: str) -> Any:
    import anthropic

    return anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=120)


def _anthropic_kwargs(max_tokens: int, model: str, prompt: str) -> dict[str, Any]:
    body = request_body(ANTHROPIC, max_tokens, prompt=prompt, model=model)
    # This SDK's messages.stream() no longer takes temperature or top_p (the newest models fix them), and
    # Anthropic's API has no seed (a streamlab extension): all three travel as extra_body, as they are.
    return {"model": model, "max_tokens": max_tokens, "messages": body["messages"], "extra_body": dict(SAMPLING)}


def read_anthropic(url: str, max_tokens: int, *, model: str, prompt: str = PROMPT, sdk: Any = None) -> SdkRead:
    """``client.messages.stream()`` and its ``text_stream``: the way the SDK's README reads a stream."""
    owned = None if sdk else _anthropic(url)
    sdk = sdk or owned

    def body(result: SdkRead, started: float) -> None:
        with sdk.messages.stream(**_anthropic_kwargs(max_tokens, model, prompt)) as stream:
            for text in stream.text_stream:
                result.got(text, started)
            snapshot = stream.current_message_snapshot
            result.stop_reason = snapshot.stop_reason

    return _reading("anthropic: for text in text_stream", ANTHROPIC, body, owned=owned)


def read_anthropic_final(url: str, max_tokens: int, *, model: str, prompt: str = PROMPT, sdk: Any = None) -> SdkRead:
    """``client.messages.stream()`` then ``get_final_message()``: the whole message, with its stop_reason."""
    owned = None if sdk else _anthropic(url)
    sdk = sdk or owned

    def body(result: SdkRead, started: float) -> None:
        with sdk.messages.stream(**_anthropic_kwargs(max_tokens, model, prompt)) as stream:
            message = stream.get_final_message()
        result.got("".join(block.text for block in message.content if block.type == "text"), started)
        result.stop_reason = message.stop_reason

    return _reading("anthropic: get_final_message()", ANTHROPIC, body, owned=owned)


SDK_READERS: dict[str, Callable[..., SdkRead]] = {
    STREAMLAB: read_httpx_sse,
    OPENAI: read_openai,
    RESPONSES: read_openai_responses,
    ANTHROPIC: read_anthropic,
}


def _client_for(fmt: str, url: str) -> Any:
    import httpx

    return {STREAMLAB: lambda: httpx.Client(timeout=120), OPENAI: lambda: _openai(url),
            RESPONSES: lambda: _openai(url), ANTHROPIC: lambda: _anthropic(url)}[fmt]()


def sdk_reads(url: str, max_tokens: int, *, model: str) -> dict[str, SdkRead]:
    """The same answer read by each format's own client library.

    Each library's client is made first and warmed by a one-token answer, so
    that the time measured is a request's, not the library's first imports
    and set-up (which can take longer than the model's first token).
    """
    reads = {}
    for fmt, read in SDK_READERS.items():
        sdk = _client_for(fmt, url)
        kwargs = {"sdk": sdk} if fmt == STREAMLAB else {"sdk": sdk, "model": model}
        try:
            read(url, 1, **kwargs)
            reads[fmt] = read(url, max_tokens, **kwargs)
        finally:
            sdk.close()
    return reads


def same_answer(port: int, url: str, max_tokens: int) -> dict[str, Any]:
    """Experiment 1: raw traces, SDK reads, a table row per format, and whether every text is the same."""
    model = model_name(port)
    traces = raw_traces(port, max_tokens, model=model)
    reads = sdk_reads(url, max_tokens, model=model)
    rows = []
    for fmt, trace in traces.items():
        read = reads[fmt]
        rows.append({**raw_row(fmt, trace), "client library": read.reader.split(":")[0],
                     "library: first text (s)": None if read.first_text is None else round(read.first_text, 3),
                     "library: stop reason": read.stop_reason, "library raised": read.raised,
                     "library: failure event": read.failed})
    texts = [t.text for t in traces.values()] + [r.text for r in reads.values()]
    return {"rows": rows, "traces": traces, "reads": reads, "model": model,
            "same_text": len(set(texts)) == 1 and bool(texts[0]), "text": texts[0]}


# --------------------------------------------------------------------------
# 2. A stream that ends without its terminator
# --------------------------------------------------------------------------


def carries_text(event: sse.Event) -> bool:
    """Whether an SSE event carries text, in any of the formats: what the cutting hop counts."""
    with suppress(ValueError):
        return bool(piece_text(json.loads(event.data)))
    return False


class CuttingHop:
    """The proxy with ``--cut-after``, counting the events that carry text, on a loop of its own.

    What a platform with a time limit, or a proxy that gives up, does to a
    stream (``streamlab.hops.forwarders.CuttingForwarder``): the client gets
    the head, whole events, and then the zero-length chunk, a body that is
    well formed and complete as far as HTTP can tell. Only the missing
    terminator (``end``, ``finish_reason`` and ``[DONE]``,
    ``response.completed``, ``message_stop``) gives it away. The hop then closes its connection to the server, which
    (watching its socket) stops generating. Other responses pass as they are.

    It counts pieces, not events, so that every format is cut after the
    same text (Anthropic's stream starts with events that carry none). Its
    event loop runs in a thread, so that blocking SDK calls in the caller's
    thread can use it. ``cuts`` counts the responses it cut.
    """

    def __init__(self, upstream_port: int, cut_after: int, *, upstream_host: str = "127.0.0.1") -> None:
        if cut_after < 1:
            raise ValueError("cut_after must be at least 1 piece")
        self.cut_after = cut_after
        self.proxy = Proxy(ProxyConfig(upstream_port, upstream_host, block=1, cut_after=cut_after,
                                       counts=carries_text))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def cuts(self) -> int:
        """Responses it cut: exchanges in its log that ended ``cut_after``."""
        return sum(exchange.outcome == CUT_AFTER for exchange in list(self.proxy.log))

    def start(self) -> CuttingHop:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cutting-hop", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(10)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        with suppress(Exception):  # a hop that failed to start has nothing to close
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> CuttingHop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


TRUNCATION_READERS: list[tuple[str, Callable[..., SdkRead]]] = [
    (OPENAI, read_openai),
    (OPENAI, read_openai_helper),
    (RESPONSES, read_openai_responses),
    (ANTHROPIC, read_anthropic),
    (ANTHROPIC, read_anthropic_final),
    (STREAMLAB, read_httpx_sse),
]
# The relay serves every route of its own, /v1/responses too, from its upstream's Chat Completions.
RELAYED_READERS = [(OPENAI, read_openai), (RESPONSES, read_openai_responses), (ANTHROPIC, read_anthropic)]
CUT, RELAYED = "cut by the hop", "cut by the hop, then a streamlab relay"
OURS = "streamlab Trace (raw socket)"


def _row(path: str, reader: str, fmt: str, text: str, whole: str | None, *, raised: str | None,
         stop_reason: str | None, told: bool, failed: str | None = None) -> dict[str, Any]:
    return {
        "path": path,
        "reader": reader,
        "format": fmt,
        "text received (chars)": len(text),
        "text": text,
        "beginning of the whole answer": None if whole is None else whole.startswith(text),
        "raised": raised is not None,
        "what it raised": raised or "",
        "failure event it handed over": failed or "",
        "stop reason it saw": stop_reason,
        "the reader said it was cut": told,
        "a check of the stop reason says cut": stop_reason is None,
    }


def _sdk_row(path: str, result: SdkRead, whole: str | None) -> dict[str, Any]:
    return _row(path, result.reader, result.format, result.text, whole, raised=result.raised,
                stop_reason=result.stop_reason, told=result.raised is not None or result.failed is not None,
                failed=result.failed)


def truncation_table(port: int, cut_after: int, max_tokens: int, *, model: str, whole: str | None = None,
                     relay: bool = True, hop: CuttingHop | None = None, guard: Any = None) -> list[dict[str, Any]]:
    """Experiment 2: every reader through a hop that cuts the stream cleanly after ``cut_after`` pieces.

    The SDK rows say what the library did: raise, or hand over the text; and
    whether the stop reason was there for a program that checks it. The
    raw-socket rows are streamlab's ``Trace``, which calls an answer whole
    only when its terminator arrived. With ``relay``, one SDK reading per API
    goes once more through a streamlab relay placed after the hop (``serve
    --upstream``): the relay checks the upstream's ending, and turns a cut
    into each format's error (which an SDK raises, or hands over as an
    event: the row says which). With ``whole`` (the uncut answer to the same
    request), each row says whether what it got is that answer's beginning.

    A chapter that starts its servers once passes its ``hop`` (a running
    ``CuttingHop`` in front of ``port``, cutting after ``cut_after``) and its
    ``guard`` (a relay already started with ``--upstream`` the hop's URL);
    without them, both are started here and stopped at the end.
    """
    rows = []
    own_hop = hop is None
    hop = CuttingHop(port, cut_after).start() if own_hop else hop
    try:
        for fmt, read in TRUNCATION_READERS:
            kwargs = {} if fmt == STREAMLAB else {"model": model}
            rows.append(_sdk_row(CUT, read(hop.url, max_tokens, **kwargs), whole))
        for fmt, path in ROUTES.items():
            trace = client.post_sync(hop.port, path, request_body(fmt, max_tokens, model=model))
            rows.append(_row(CUT, OURS, fmt, trace.text, whole, raised=None, stop_reason=ending(trace),
                             told=not trace.complete))
        if relay:
            from streamlab.lab.setups.runner import start_server

            own_guard = guard is None
            guard = start_server("--upstream", hop.url) if own_guard else guard
            try:
                for fmt, read in RELAYED_READERS:
                    rows.append(_sdk_row(RELAYED, read(guard.url, max_tokens, model=model), whole))
            finally:
                if own_guard:
                    guard.stop()
    finally:
        if own_hop:
            hop.stop()
    return rows


def start_model_servers(model_args: list[str], llama: Any = None, llama_missing: str | None = None
                        ) -> tuple[Any, Any, str | None]:
    """The chapter's model server and, when it is available, llama.cpp's, started at the same time.

    Returns ``(server, engine, llama_missing)``: ``engine`` is None, and
    ``llama_missing`` says why, when llama.cpp is not there or did not start.
    llama.cpp is started from this thread: it is told to exit when the thread
    that started it ends (``PR_SET_PDEATHSIG`` counts threads), so a worker
    thread would take it down on the way out.
    """
    from concurrent.futures import ThreadPoolExecutor

    from streamlab.lab.setups.runner import start_server

    with ThreadPoolExecutor(max_workers=1) as pool:
        server_start = pool.submit(start_server, *model_args)
        engine = None
        if llama is not None and llama_missing is None:
            try:
                engine = llama.LlamaServer().start()
            except llama.EngineError as exc:
                llama_missing = f"llama.cpp did not start: {str(exc)[:300]}"
        try:
            server = server_start.result()
        except BaseException:
            if engine is not None:
                engine.stop()
            raise
    return server, engine, llama_missing
