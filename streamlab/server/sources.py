"""Where the tokens come from: the model in this process, or an OpenAI-compatible server upstream.

``Jobs`` asks a source three things: how many tokens a conversation is (to
refuse what cannot fit before any compute), how large the context is, and
for a running generation. Everything else (admission, the stored answer,
the disconnect watch, every wire format) is the same whichever source
answers, which is what makes streamlab a relay: ``--upstream URL`` swaps
the model for a server elsewhere (vLLM, llama.cpp, Ollama, another
streamlab), and our client leaving closes the upstream request at once.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import TYPE_CHECKING, Any, Callable, Sequence

from streamlab.model.generation import Generation, chat_template_ids, encode_prompt

if TYPE_CHECKING:
    from streamlab.server.config import ServerConfig
    from streamlab.server.requests import GenerationRequest

Messages = Sequence[dict[str, str]]


def plain_text(messages: Messages) -> str:
    """A conversation for a model with no chat template: the one prompt as it is, or labelled turns."""
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"


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
    """

    kind = "upstream"

    def __init__(self, url: str, model: str | None = None, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[: -len("/v1")]
        self.model = model
        self.api_key = api_key

    @property
    def name(self) -> str:
        return self.model or "upstream"

    context_length = None

    async def start(self) -> None:
        if self.model is None:
            self.model = await asyncio.to_thread(self._first_model)

    def _first_model(self) -> str:
        request = urllib.request.Request(f"{self.url}/v1/models", headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - the URL the user gave
                listing = json.load(response)
            return str(listing["data"][0]["id"])
        except Exception as exc:  # noqa: BLE001 - any failure: say which upstream, and go on without a name
            raise RuntimeError(f"could not list the models of {self.url}: {exc}; name one with --upstream-model") from exc

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def prompt_ids(self, messages: Messages, *, chat: bool) -> list[int]:
        return []  # counted upstream

    def generation(self, req: GenerationRequest, prompt_ids: list[int], messages: Messages,
                   config: ServerConfig, on_token: Callable[[int], None]) -> Any:
        from streamlab.server.upstream import UpstreamGeneration

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
        return UpstreamGeneration(self.url, body, on_token=on_token, api_key=self.api_key)


def source_for(lm_or_source: Any) -> Any:
    """The server takes a loaded model (or a fake one) or a token source."""
    return lm_or_source if hasattr(lm_or_source, "generation") and hasattr(lm_or_source, "kind") else ModelSource(lm_or_source)
