"""What one piece of text costs on the wire in the formats real APIs stream.

Each encoder builds the bytes a server would send for one piece of text, with
the fields such an event really carries, so chapter 3 can *measure* the
overhead instead of quoting it. The JSON is written compactly where the real
APIs write it compactly, and the ids and timestamps have realistic lengths:
those fields are sent with every single piece.
"""

from __future__ import annotations

import json
import time

from streamlab.protocol import sse
from streamlab.protocol.websocket_frames import Opcode, encode_frame


def piece_json(text: str) -> str:
    """streamlab's own payload: ``{"text": "..."}``, as the server sends it."""
    return json.dumps({"text": text}, ensure_ascii=False)


def streamlab_sse(text: str) -> bytes:
    """A minimal SSE event: ``data: {"text": ...}`` and a blank line."""
    return sse.encode_event(piece_json(text))


def streamlab_ws_frame(text: str) -> bytes:
    """The same payload in one unmasked WebSocket text frame (server to client)."""
    return encode_frame(Opcode.TEXT, piece_json(text).encode("utf-8"))


def openai_chunk(
    text: str,
    *,
    id: str = "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    created: int | None = None,
    model: str = "gpt-4o-mini-2024-07-18",
    system_fingerprint: str = "fp_44709d6fcb",
) -> bytes:
    """An OpenAI ``chat.completion.chunk`` SSE event carrying one piece of content.

    Every chunk repeats the completion's id, creation time, model name and
    system fingerprint, and wraps the text in ``choices[0].delta.content``.
    """
    chunk = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "system_fingerprint": system_fingerprint,
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}],
    }
    return sse.encode_event(json.dumps(chunk, ensure_ascii=False, separators=(",", ":")))


def anthropic_delta(text: str, *, index: int = 0) -> bytes:
    """An Anthropic ``content_block_delta`` SSE event: named event, typed delta."""
    delta = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}
    payload = json.dumps(delta, ensure_ascii=False, separators=(",", ":"))
    return sse.encode_event(payload, event="content_block_delta")


ENCODERS = {
    "streamlab SSE event": streamlab_sse,
    "Anthropic content_block_delta": anthropic_delta,
    "OpenAI chat.completion.chunk": openai_chunk,
    "WebSocket frame": streamlab_ws_frame,
}


def padded_piece_json(text: str, block: int = 32) -> str:
    """``{"text": ..., "p": "xxx"}`` padded so the payload is a multiple of ``block`` bytes.

    Encrypted traffic hides the bytes but not their count: an event's size gives
    away its token's length (Weiss et al., USENIX Security 2024). Padding every
    payload up to a block boundary blurs that, at the cost of the padding bytes.
    """
    base = json.dumps({"text": text, "p": ""}, ensure_ascii=False)
    size = len(base.encode("utf-8"))
    pad = (-size) % block
    return json.dumps({"text": text, "p": "x" * pad}, ensure_ascii=False)


def padded_sse(text: str, block: int = 32) -> bytes:
    return sse.encode_event(padded_piece_json(text, block))
