"""llama.cpp's OpenAI-compatible server over the default model's GGUF (streamlab.lab.outside.llamacpp).

The engine lives in .venv-engine (``make engine`` compiles it); without it, or
without the GGUF, the tests that run it skip and say why. One server is shared
by the module: it loads the 135M model in about a second.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from streamlab.lab.outside.llamacpp import CHAT_FORMAT, LlamaServer, llama_server_command, unavailable_reason

pytestmark = pytest.mark.timeout(60)
REASON = unavailable_reason()
needs_engine = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def test_command_serves_the_gguf_on_localhost_with_its_chat_template():
    args = llama_server_command("/models/x.gguf", 8123, "--seed", "7", python="/e/bin/python")
    assert args[:3] == ["/e/bin/python", "-m", "llama_cpp.server"]
    pairs = dict(zip(args[3::2], args[4::2]))
    assert pairs["--model"] == "/models/x.gguf"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert pairs["--chat_format"] == CHAT_FORMAT
    assert pairs["--n_threads"] == pairs["--n_threads_batch"] == "1"
    assert pairs["--interrupt_requests"] == "False"  # a second reader waits; it does not cut the first
    assert args[-2:] == ["--seed", "7"]


def test_unavailable_reason_names_the_missing_venv(tmp_path: Path):
    assert ".venv-engine" in (unavailable_reason(tmp_path / ".venv-engine") or "")


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaServer]:
    with LlamaServer() as server:
        yield server


def _stream_chat(url: str, body: dict) -> list[dict]:
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        for raw in reply:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
            if line == "data: [DONE]":
                break
    return chunks


@needs_engine
def test_models_lists_the_gguf(engine: LlamaServer):
    assert engine.url == f"http://127.0.0.1:{engine.port}"
    ids = engine.models()
    assert len(ids) == 1 and ids[0].endswith(".gguf")


@needs_engine
def test_streamed_chat_completion_has_text_and_a_finish_reason(engine: LlamaServer):
    chunks = _stream_chat(
        engine.url,
        {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 24, "temperature": 0},
    )
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.strip(), chunks
    assert "<|im_" not in text  # the chat template's markers are not leaked as text
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_chat_stream_timing_times_an_openai_stream_piece_by_piece():
    """The benchmark's llama.cpp row, read from a server that speaks the same API: ours, scripted at 50 tokens/s."""
    from streamlab.book.grading import scripted_server
    from streamlab.lab.outside.llamacpp import chat_stream_timing

    with scripted_server(50.0) as server:
        first, rate, pieces = chat_stream_timing(server.port, "Say hi.", 12)
    assert pieces == 12
    assert 0.5 < rate / 50.0 < 2.0, rate  # the scripted schedule, give or take the machine's timers


@needs_engine
def test_chat_stream_timing_reads_llama_cpp(engine: LlamaServer):
    from streamlab.lab.outside.llamacpp import chat_stream_timing

    first, rate, pieces = chat_stream_timing(engine.port, "What is the capital of France?", 12)
    assert 1 <= pieces <= 12 and first > 0


# --------------------------------------------------------------------------
# llama.cpp's own C++ server (scripts/llama_server.sh): the benchmarks' yardstick
# --------------------------------------------------------------------------

from streamlab.lab.outside.llamacpp import LlamaCppServer, native_server_command, native_unavailable_reason  # noqa: E402

needs_native = pytest.mark.skipif(native_unavailable_reason() is not None,
                                  reason=native_unavailable_reason() or "llama-server is built")


def test_the_native_command_gives_every_slot_its_context():
    args = native_server_command("m.gguf", 8123, binary=Path("/x/llama-server"), threads=2, parallel=16, n_ctx=2048)
    assert args[0] == "/x/llama-server" and args[args.index("--port") + 1] == "8123"
    assert args[args.index("--parallel") + 1] == "16" and args[args.index("--ctx-size") + 1] == str(16 * 2048)
    assert args[args.index("--host") + 1] == "127.0.0.1"


@needs_native
def test_llama_server_streams_as_many_tokens_as_asked_to_readers_at_once():
    """Four readers at once, EOS ignored: each gets its 16 tokens, one a chunk, and usage says so."""
    from streamlab.lab.experiments.load import ask_chat, readers
    from streamlab.net.aio import run_sync

    with LlamaCppServer(parallel=4, threads=2) as engine:
        traces, wall = run_sync(readers(engine.port, 4, 16, ask=ask_chat, timeout=60))
    assert [t.status for t in traces] == [200] * 4 and all(t.complete for t in traces)
    assert [t.tokens for t in traces] == [16] * 4 and wall > 0
    assert all(1 <= len(t.text_events) <= 16 for t in traces)
