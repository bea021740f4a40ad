"""Where the tokens come from: the model in this process, or an OpenAI-compatible server upstream.

``Jobs`` asks a source three things: how many tokens a conversation is (to
refuse what cannot fit before any compute), how large the context is, and
for a running generation. Everything else (admission, the stored answer,
the disconnect watch, every wire format) is the same whichever source
answers, which is what makes streamlab a relay: ``--upstream URL`` swaps
the model for a server elsewhere (vLLM, llama.cpp, Ollama, another
streamlab), and our client leaving closes the upstream request at once.

An upstream is another machine, and it fails as one: nothing listens, it
does not answer in time, it refuses our key. The command line asks it for
its models before serving, so a wrong ``--upstream`` is one line at once;
``/health`` asks again each time (``UpstreamSource.health``), and a request
it fails is answered as a gateway answers (``gateway_failure``: 502, 504).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from contextlib import redirect_stdout
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from streamlab.model.generation import Generation, PieceStream, chat_template_ids, encode_prompt
from streamlab.net.errors import UserError

if TYPE_CHECKING:
    from streamlab.server.config import ServerConfig
    from streamlab.server.answers.requests import GenerationRequest

Messages = Sequence[dict[str, str]]
START_TIMEOUT = 10.0  # s: how long the command line waits for the upstream's /v1/models before giving up
HEALTH_TIMEOUT = 2.0  # s: how long /health waits for it (a health check must answer quickly itself)
MAX_LISTING = 1 << 20  # bytes of a /v1/models answer read
# A direct opener: an HTTP proxy set in the environment must not stand between us and the upstream we were
# given (UpstreamGeneration's own connections never go through one either).
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def plain_text(messages: Messages) -> str:
    """A conversation for a model with no chat template: the one prompt as it is, or labelled turns."""
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"


class TokenSource(Protocol):
    """What ``Jobs`` needs of wherever an answer's tokens come from: the model, an upstream, a script.

    ``kind`` is ``local``, ``upstream`` or ``scripted`` (``/health`` says it);
    ``prompt_ids`` counts a conversation in the source's tokens (empty: an
    upstream counts its own); ``generation`` makes one answer's piece stream,
    not started.
    """

    kind: str

    @property
    def name(self) -> str: ...

    @property
    def context_length(self) -> int | None: ...

    async def start(self) -> None: ...

    async def health(self) -> dict[str, Any] | None:
        """A relay's upstream, asked now (``/health`` shows it); None for a source in this process."""

    def prompt_ids(self, messages: Messages, *, chat: bool) -> list[int]: ...

    def generation(self, req: GenerationRequest, prompt_ids: list[int], messages: Messages, config: ServerConfig,
                   on_token: Callable[[int], None]) -> PieceStream: ...


class ModelSource:
    """The model loaded in this process: prompts counted in its tokens, generations in threads or in one batch.

    ``config.engine`` chooses: ``threads``, a thread per generation; ``batched``,
    every generation handed to one :class:`streamlab.model.batching.BatchedEngine`
    (made on the first that needs it, one per server), which decodes them all
    in one forward pass a step. A model that cannot be batched (the tests'
    scripted fake) runs threads whatever the config says.
    """

    kind = "local"

    def __init__(self, lm: Any) -> None:
        self.lm = lm
        self._batched: Any = None  # the BatchedEngine, once one is needed

    def scheduler(self, config: ServerConfig) -> Any:
        """What runs a generation's forward passes: the batched engine, or None for a thread of its own."""
        from streamlab.model.batching import BatchedEngine, can_batch

        if getattr(config, "engine", "threads") != "batched" or not can_batch(self.lm):
            return None
        if self._batched is None:
            self._batched = BatchedEngine(self.lm)
        return self._batched

    @property
    def name(self) -> str:
        return self.lm.name

    @property
    def context_length(self) -> int | None:
        return getattr(self.lm, "context_length", None)

    async def start(self) -> None:
        """Nothing to do: the model is loaded before the server starts."""

    async def health(self) -> None:
        return None  # the model is in this process: if the server answers, so does it

    def prompt_ids(self, messages: Messages, *, chat: bool) -> list[int]:
        """What the model will read: the conversation in its chat template, or the plain text."""
        tokenizer = self.lm.tokenizer
        if chat and getattr(tokenizer, "chat_template", None):
            return chat_template_ids(tokenizer, messages)
        return encode_prompt(tokenizer, plain_text(messages), chat=False)

    def generation(self, req: GenerationRequest, prompt_ids: list[int], messages: Messages,
                   config: ServerConfig, on_token: Callable[[int], None]) -> Generation:
        return Generation(
            self.lm,
            prompt_ids=prompt_ids,
            max_tokens=req.max_tokens,
            seed=req.seed,
            ignore_eos=req.ignore_eos,
            temperature=req.temperature,
            top_p=req.top_p,
            pauses=config.pauses,
            fail_after=config.fail_after,
            token_delay=config.token_delay,
            prefill_chunk=config.prefill_chunk,
            stop_sequences=req.stop,
            on_token=on_token,
            scheduler=self.scheduler(config),
        )


class UpstreamSource:
    """An OpenAI-compatible server elsewhere: every generation is a streamed chat completion there.

    No tokenizer here, so the upstream counts the prompt (and refuses what does
    not fit: its error ends our stream as an error). ``model`` is the name the
    upstream serves; without one, ``start`` asks its ``/v1/models``.
    ``reachable_at_start`` makes ``start`` ask even with a name, and refuse to
    start (a ``UserError``) when nothing answers: the command line sets it,
    so that a mistyped ``--upstream`` is told before the first request, not by
    it. Without it a relay may start before its upstream is up.
    """

    kind = "upstream"

    def __init__(self, url: str, model: str | None = None, api_key: str | None = None, *,
                 reachable_at_start: bool = False, connect_timeout: float = 10.0, read_timeout: float = 300.0) -> None:
        self.url = (url if "//" in url else "http://" + url).rstrip("/")  # host:port, as UpstreamGeneration takes it
        if self.url.endswith("/v1"):
            self.url = self.url[: -len("/v1")]
        self.model = model
        self.api_key = api_key
        self.reachable_at_start = reachable_at_start
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout

    @property
    def name(self) -> str:
        return self.model or "upstream"

    context_length = None

    async def start(self) -> None:
        if self.model is None or self.reachable_at_start:
            self.model = await asyncio.to_thread(self._model_at_start)

    def _model_at_start(self) -> str | None:
        """The model to ask for: the one named, else the first the upstream lists; a UserError when it cannot be."""
        where = f"--upstream {self.url}"
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"{where}: not an http(s) URL: give one such as http://127.0.0.1:8080")
        try:
            status, listing = self._models(START_TIMEOUT)
        except OSError as err:
            raise UserError(f"{self._unreachable(err, START_TIMEOUT)}: start the upstream there, or give --upstream"
                            " the URL of one that runs") from None
        if status in (401, 403):
            raise UserError(f"upstream {self.url} refused our key ({status} on /v1/models): set"
                            " STREAMLAB_UPSTREAM_KEY to the key it expects")
        if self.model is not None:
            return self.model
        try:
            return str(listing["data"][0]["id"])
        except (TypeError, KeyError, IndexError):
            said = f"answered {status}" if not 200 <= status < 300 else "listed no model"
            raise UserError(f"upstream {self.url} {said} at /v1/models: name its model with --upstream-model,"
                            f" or check {where}") from None

    def _models(self, timeout: float) -> tuple[int, Any]:
        """``GET /v1/models``: its status and its JSON (None when it is not JSON); OSError when nothing answers."""
        request = urllib.request.Request(f"{self.url}/v1/models", headers=self._headers())
        try:
            with _DIRECT.open(request, timeout=timeout) as response:
                data = response.read(MAX_LISTING)
                status = response.status
        except urllib.error.HTTPError as err:  # an answer, with a status that is not 2xx
            return err.code, None
        except http.client.RemoteDisconnected as err:
            raise OSError("it closed the connection without an answer") from err
        except http.client.HTTPException as err:  # an answer, but not in HTTP
            raise OSError(f"it answered, but not in HTTP ({type(err).__name__})") from err
        except ValueError as err:  # a URL urllib cannot even try
            raise OSError(str(err)) from err
        try:
            return status, json.loads(data)
        except ValueError:
            return status, None

    def _unreachable(self, err: OSError, timeout: float) -> str:
        """Why nothing answered at the URL, in words."""
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(reason, ConnectionRefusedError):
            return f"nothing listens at {self.url} (connection refused)"
        if isinstance(reason, socket.gaierror):
            return f"the host of {self.url} is unknown ({reason.strerror or reason})"
        if isinstance(reason, (TimeoutError, socket.timeout)) or "timed out" in str(reason):
            return f"upstream {self.url} did not answer within {timeout:g} s"
        return f"upstream {self.url} cannot be reached: {getattr(reason, 'strerror', None) or reason}"

    async def health(self) -> dict[str, Any]:
        """The upstream's state for ``/health``: ``{"url", "ok", "error"}``, asked now (its ``/v1/models``).

        Any HTTP answer but a 5xx or a refused key counts as up: a server
        that does not list its models may still answer completions.
        """
        try:
            status, _ = await asyncio.to_thread(self._models, HEALTH_TIMEOUT)
        except OSError as err:
            return {"url": self.url, "ok": False, "error": self._unreachable(err, HEALTH_TIMEOUT)}
        ok = status < 500 and status not in (401, 403)
        return {"url": self.url, "ok": ok, "error": None if ok else f"GET /v1/models answered {status}"}

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def prompt_ids(self, messages: Messages, *, chat: bool) -> list[int]:
        return []  # counted upstream

    def generation(self, req: GenerationRequest, prompt_ids: list[int], messages: Messages,
                   config: ServerConfig, on_token: Callable[[int], None]) -> Any:
        from streamlab.server.answers.upstream import UpstreamGeneration

        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "seed": req.seed,
        }
        if req.stop:
            body["stop"] = list(req.stop)
        if req.ignore_eos:
            body["ignore_eos"] = True  # vLLM's and streamlab's extension; others ignore it
        return UpstreamGeneration(self.url, body, on_token=on_token, api_key=self.api_key,
                                  connect_timeout=self.connect_timeout, read_timeout=self.read_timeout)


def gateway_failure(generation: Any) -> tuple[int, str] | None:
    """``(status, message)`` when the generation failed because its upstream did (502, 504...); else None."""
    status = generation.gateway_status
    result = generation.result
    if status is None or result is None:
        return None
    return status, str(result.error)


def source_for(lm_or_source: Any) -> TokenSource:
    """The server takes a loaded model (or a fake one) or a token source."""
    return lm_or_source if hasattr(lm_or_source, "generation") and hasattr(lm_or_source, "kind") else ModelSource(lm_or_source)


def load_and_say(name: str | None, engine: str, precision: str | None = None) -> Any:
    """Load the model (stdout kept for the one line the runner waits for) and say what was loaded."""
    from streamlab.model.loading import load_model

    with redirect_stdout(sys.stderr):
        lm = load_model(name, precision=precision)
    print(f"streamlab: model {lm.name} on {lm.device}, {lm.precision} (loaded in {lm.load_seconds:.1f} s),"
          f" generations: {engine}",
          file=sys.stderr, flush=True)
    return lm
