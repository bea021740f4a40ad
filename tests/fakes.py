"""A fake, scripted language model: what a ``LoadedModel`` offers, without weights.

Server and generation tests need a model that answers, streams, splits
characters and takes time like a real one, but they do not need it to think.
:class:`FakeLM` builds in microseconds and always answers with its ``script``::

    lm = FakeLM("Hello, world! 🦜")
    generate_text(lm, "anything").text == "Hello, world! 🦜"

The pieces, and why they look the way they do:

- :class:`ByteTokenizer`: every UTF-8 byte is one token id (0-255), so an emoji
  is four tokens and the incremental detokenizer has real split characters to
  put back together. Two special ids follow: ``EOS_ID`` (256) ends a turn and
  ``ASSISTANT_ID`` (257) opens the answer in the chat template. It has a
  ``chat_template`` (so ``encode_prompt`` and the server's conversations take
  the same path as with SmolLM2), and ``apply_chat_template`` builds the ids
  directly: ``role: content<|end|>`` per message, then ``<|assistant|>``.
- :class:`ScriptedModel`: callable like a transformers causal LM
  (``forward(input_ids, use_cache, past_key_values, logits_to_keep)``), with a
  KV cache of its own (:class:`ScriptCache`). Its logits put the script's next
  byte at +1e4 and everything else at -1e4, so greedy decoding and any
  temperature / top-p / repetition-penalty setting pick the same token. After
  the script comes EOS; a generation with ``ignore_eos`` feeds that EOS back,
  and the script starts again.
- :class:`FakeLM`: the attributes of ``streamlab.model.loading.LoadedModel`` that
  ``Generation`` and the server use, with the real :class:`FairLock`.

Where the answer starts. All state lives in the cache, one per generation, so
any number of generations may share one model. The position in the script is
the number of tokens since the last ``ASSISTANT_ID`` or ``EOS_ID`` in the
context. The chat template (``chat=True``, the default in ``Generation`` and the
server) ends every prompt with ``ASSISTANT_ID``, so the answer is exact however
the prompt is split into chunks. A raw prompt (``chat=False``) has no such mark;
then each prompt chunk restarts the script and a one-token call that feeds back
the model's own last prediction counts as a decode step. So a one-byte prompt
chunk that happens to equal the byte just predicted is taken for a decode step:
a last chunk of one byte equal to the script's first, or ``prefill_chunk=1``
over a prompt holding the script's opening bytes. Avoid those with ``chat=False``.

Timing. A prompt chunk sleeps ``prefill_seconds_per_token`` per token and a
decode step ``decode_seconds``; ``time.sleep`` releases the GIL as torch does,
so threads interleave as they would around a real model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Sequence

import torch

from streamlab.model.loading import FairLock

EOS_ID = 256
ASSISTANT_ID = 257
VOCAB_SIZE = 258
EOS_TOKEN = "<|end|>"
ASSISTANT_TOKEN = "<|assistant|>"
_SPECIAL = {EOS_ID: EOS_TOKEN, ASSISTANT_ID: ASSISTANT_TOKEN}
# The chat template, for reading (apply_chat_template builds the ids directly).
CHAT_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}<|end|>{% endfor %}<|assistant|>"
DEFAULT_SCRIPT = "Hello, world! This is a scripted answer from a fake model. 🦜"


class ByteTokenizer:
    """One token per UTF-8 byte, plus EOS (256) and the assistant mark (257).

    Offers what streamlab calls on a transformers tokenizer: ``__call__`` and
    ``encode``; ``decode`` / ``batch_decode`` with ``skip_special_tokens``;
    ``convert_ids_to_tokens``; ``apply_chat_template``; ``len()``. It has no
    ``backend_tokenizer``, so the detokenizer uses ``decode``.
    """

    eos_token_id = EOS_ID
    eos_token = EOS_TOKEN
    pad_token_id = EOS_ID
    bos_token_id = None
    all_special_ids = [EOS_ID, ASSISTANT_ID]
    clean_up_tokenization_spaces = False
    vocab_size = VOCAB_SIZE
    chat_template = CHAT_TEMPLATE

    def __init__(self, model_max_length: int = 2048) -> None:
        self.model_max_length = model_max_length

    def __len__(self) -> int:
        return VOCAB_SIZE

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        return list(text.encode("utf-8"))

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True, **kwargs: Any) -> dict[str, Any]:
        if isinstance(text, str):
            return {"input_ids": self.encode(text)}
        return {"input_ids": [self.encode(t) for t in text]}

    def decode(self, ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        out, run = [], bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not skip_special_tokens:
                out.append(_SPECIAL.get(i, ""))
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def batch_decode(self, sequences: Sequence[Any], **kwargs: Any) -> list[str]:
        return [self.decode(s, **kwargs) for s in sequences]

    def convert_ids_to_tokens(self, ids: int | Sequence[int], **kwargs: Any) -> str | list[str]:
        def one(i: int) -> str:
            return _SPECIAL.get(int(i)) or f"<0x{int(i):02X}>"

        return one(ids) if isinstance(ids, int) else [one(i) for i in ids]

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, str]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        **kwargs: Any,
    ) -> list[int] | str:
        """``role: content<|end|>`` per message, then ``<|assistant|>`` to open the answer."""
        ids: list[int] = []
        for message in messages:
            ids += self.encode(f"{message['role']}: {message['content']}") + [EOS_ID]
        if add_generation_prompt:
            ids.append(ASSISTANT_ID)
        return ids if tokenize else self.decode(ids)


class FakeOutput(dict):
    """Like a transformers ``ModelOutput``: item and attribute access, and ``in``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class ScriptCache:
    """The fake KV cache: where one generation stands in the script."""

    length: int = 0  # tokens read so far (the cache's sequence length)
    since_mark: int | None = None  # tokens since the last ASSISTANT_ID or EOS_ID; None before any
    answered: int = 0  # chat=False: decode steps since the last prompt chunk
    predicted: int | None = None  # the token the last call put first

    def get_seq_length(self) -> int:
        return self.length


class ScriptedModel(torch.nn.Module):
    """A causal LM that knows one answer. See the module docstring for the rules."""

    def __init__(
        self,
        script: str,
        *,
        prefill_seconds_per_token: float = 0.0,
        decode_seconds: float = 0.0,
        context_length: int = 2048,
    ) -> None:
        super().__init__()
        self.script = list(script.encode("utf-8"))
        self.prefill_seconds_per_token = prefill_seconds_per_token
        self.decode_seconds = decode_seconds
        self.config = SimpleNamespace(max_position_embeddings=context_length, vocab_size=VOCAB_SIZE)
        self.generation_config = SimpleNamespace(eos_token_id=EOS_ID)
        # One tiny parameter, so next(model.parameters()).dtype works as on a real model.
        self.dummy = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
        # What went through the model, for tests (calls are serialised by the lock).
        self.prefill_calls = 0
        self.prefill_tokens = 0
        self.decode_steps = 0

    def next_token(self, position: int) -> int:
        """The script's byte at ``position``, EOS right after it."""
        return self.script[position] if position < len(self.script) else EOS_ID

    def forward(
        self,
        input_ids: torch.Tensor,
        use_cache: bool = True,
        past_key_values: ScriptCache | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> FakeOutput:
        ids = [int(i) for i in input_ids.reshape(-1).tolist()]
        if not ids:
            raise ValueError("no input ids")
        cache = past_key_values if past_key_values is not None else ScriptCache()
        decode = cache.length > 0 and len(ids) == 1 and ids[0] == cache.predicted
        if decode:
            self.decode_steps += 1
            cache.answered += 1
            if self.decode_seconds:
                time.sleep(self.decode_seconds)
        else:
            self.prefill_calls += 1
            self.prefill_tokens += len(ids)
            cache.answered = 0
            if self.prefill_seconds_per_token:
                time.sleep(self.prefill_seconds_per_token * len(ids))
        predictions = []
        for i in ids:
            if i in (ASSISTANT_ID, EOS_ID):
                cache.since_mark = 0
            elif cache.since_mark is not None:
                cache.since_mark += 1
            position = cache.since_mark if cache.since_mark is not None else cache.answered
            predictions.append(self.next_token(position))
        cache.length += len(ids)
        cache.predicted = predictions[-1]
        keep = len(ids) if not logits_to_keep else min(int(logits_to_keep), len(ids))
        logits = torch.full((1, keep, VOCAB_SIZE), -1e4)
        for row, token in enumerate(predictions[-keep:]):
            logits[0, row, token] = 1e4
        return FakeOutput(logits=logits, past_key_values=cache)


class FakeLM:
    """Stands in for ``streamlab.model.loading.LoadedModel``: no weights, answers ``script``.

    Built in microseconds. ``prefill_seconds_per_token`` and ``decode_seconds``
    make it as slow as a real model where a test needs time to pass (a stop
    during a long prompt, streams interleaving). It has what ``Generation`` and
    the server use: ``tokenizer``, ``model``, ``eos_token_ids``, ``lock`` (a
    real :class:`FairLock`), ``name``, ``device``, ``context_length``,
    ``load_seconds`` (and ``source``, as ``streamlab info`` prints it).
    """

    def __init__(
        self,
        script: str = DEFAULT_SCRIPT,
        *,
        prefill_seconds_per_token: float = 0.0,
        decode_seconds: float = 0.0,
        context_length: int | None = 2048,
        name: str = "fake",
    ) -> None:
        self.script = script
        self.name = name
        self.context_length = context_length
        self.tokenizer = ByteTokenizer(context_length or 2048)
        self.model = ScriptedModel(
            script,
            prefill_seconds_per_token=prefill_seconds_per_token,
            decode_seconds=decode_seconds,
            context_length=context_length or 2048,
        )
        self.device = torch.device("cpu")
        self.lock = FairLock()
        self.load_seconds = 0.0
        self.source = "fake"

    @property
    def eos_token_ids(self) -> set[int]:
        return {EOS_ID}

    def __repr__(self) -> str:
        return f"FakeLM({self.script!r}, name={self.name!r})"
