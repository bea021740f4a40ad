"""What one piece of text costs on the wire in each format the server streams, and what its size gives away.

Every encoder here is the server's own: the ``Format`` each route streams
with (streamlab's events, OpenAI's ``chat.completion.chunk`` and Responses
events, Anthropic's Messages events) and the WebSocket session's message, so
the bytes chapter 3 counts are the bytes the server sends, and the table
cannot drift from it. The ids, the time and the model's name are those a
stream of the server carries, sent again with every piece.

The second half is about what the sizes show through TLS: an event's size
against the length of the text inside, plain, padded to blocks, and with
OpenAI's ``obfuscation`` filler (``openai_api.obfuscation``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Callable, Sequence

from streamlab.model.loading import DEFAULT_MODEL
from streamlab.protocol import sse
from streamlab.protocol.websocket_frames import Opcode, encode_frame
from streamlab.server.answers.requests import GenerationRequest
from streamlab.server.transport.events import dumps
from streamlab.server.wire.anthropic_api import MessagesFormat
from streamlab.server.wire.formats import StreamlabFormat, WebSocketMessages
from streamlab.server.wire.openai_api import ChatCompletionFormat
from streamlab.server.wire.responses_api import ResponseFormat

Encoder = Callable[[str], bytes]
SSE, WS, ANTHROPIC = "streamlab SSE event", "WebSocket frame", "Anthropic content_block_delta"
CHUNK, RESPONSE_DELTA = "OpenAI chat.completion.chunk", "OpenAI response.output_text.delta"


def piece_json(text: str) -> str:
    """streamlab's own payload: ``{"text": "..."}``, as the server sends it."""
    return dumps(WebSocketMessages.piece(text))


def streamlab_sse(text: str) -> bytes:
    """``data: {"text": ...}`` and a blank line: ``/stream``'s event for a piece."""
    return StreamlabFormat().piece(text).encode()


def streamlab_ws_frame(text: str) -> bytes:
    """The same payload in one unmasked WebSocket text frame (server to client), as ``/ws`` sends it."""
    return encode_frame(Opcode.TEXT, piece_json(text).encode("utf-8"))


def responses_encoder(model: str = DEFAULT_MODEL, *, obfuscation: bool = False) -> Encoder:
    """One response's deltas, numbered as the server numbers them: the first after the four events of its opening.

    A Responses event carries its ``sequence_number``, so a piece's cost grows by a digit at the 7th piece
    and at the 97th: the encoder keeps one response's count, as a stream does.
    """
    fmt = ResponseFormat(model, GenerationRequest(prompt="", include_obfuscation=obfuscation))
    fmt.opening(None)  # type: ignore[arg-type]  # its events number the pieces after them; it reads no job
    return lambda text: fmt.piece(text).encode()


def encoders(model: str = DEFAULT_MODEL, *, obfuscation: bool = False) -> dict[str, Encoder]:
    """A piece's bytes in each framing, as one answer's stream carries them (a new set for each answer).

    ``obfuscation``: the OpenAI formats with ``stream_options.include_obfuscation``.
    """
    chunks = ChatCompletionFormat(model, include_obfuscation=obfuscation)
    messages = MessagesFormat(model)
    return {
        SSE: streamlab_sse,
        ANTHROPIC: lambda text: messages.piece(text).encode(),
        CHUNK: lambda text: chunks.piece(text).encode(),
        RESPONSE_DELTA: responses_encoder(model, obfuscation=obfuscation),
        WS: streamlab_ws_frame,
    }


def answer_bytes(texts: Sequence[str], framing: str, model: str = DEFAULT_MODEL) -> int:
    """The bytes an answer's pieces take as ``framing``'s events: what the pieces cost, head and chunking aside."""
    encode = encoders(model)[framing]
    return sum(len(encode(text)) for text in texts)


# --------------------------------------------------------------------------
# What the sizes give away
# --------------------------------------------------------------------------


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


def schemes(pad_block: int, model: str = DEFAULT_MODEL) -> dict[str, tuple[str, Callable[[], Encoder]]]:
    """Each way of sending a piece that the leak table compares: its plain format, and a maker of its encoder.

    A maker, because a stream's encoder has state (a Responses count) and a
    new answer starts a new stream; the filler's is new with every event.
    """
    return {
        SSE: (SSE, lambda: streamlab_sse),
        f"streamlab SSE, padded to {pad_block}-byte blocks": (SSE, lambda: lambda text: padded_sse(text, pad_block)),
        CHUNK: (CHUNK, lambda: encoders(model)[CHUNK]),
        "OpenAI chunk with its obfuscation field": (CHUNK, lambda: encoders(model, obfuscation=True)[CHUNK]),
    }


def size_leak(texts: Sequence[str], encoder: Callable[[], Encoder], *, answers: int = 1) -> dict[str, Any]:
    """The pieces sent ``answers`` times, each time as a new stream: which event sizes name one text length.

    An observer who watches many answers learns which sizes each length can
    take; a size that only one length takes names it. For a fixed framing a
    second answer changes nothing; with random filler it shows the sizes
    each length can reach. ``pins`` is the share of distinct sizes that only
    one length took, ``pinned`` the share of events whose size did, and
    ``named`` those sizes, each with the length it names.
    """
    lengths = [len(text.encode("utf-8")) for text in texts]
    sizes = []
    for _ in range(answers):
        encode = encoder()
        sizes += [len(encode(text)) for text in texts]
    seen: dict[int, set[int]] = defaultdict(set)
    for size, length in zip(sizes, lengths * answers):
        seen[size].add(length)
    naming = {size for size, found in seen.items() if len(found) == 1}
    return {
        "sizes": sizes[:len(texts)],  # the first answer's, event by event (for a plot)
        "bytes per event": sum(sizes) / len(sizes),
        "distinct sizes": len(seen),
        "sizes that name a length": len(naming),
        "named": [[size, next(iter(seen[size]))] for size in sorted(naming)],
        "pins": len(naming) / len(seen),
        "pinned": sum(size in naming for size in sizes) / len(sizes),
    }


def leak_table(texts: Sequence[str], *, pad_block: int, answers: int, model: str = DEFAULT_MODEL
               ) -> list[dict[str, Any]]:
    """One row per scheme: bytes per event, against its format unpadded, and how often a size names a length.

    ``sizes`` (the first answer's, event by event) and ``named`` (the sizes
    that name a length) are for a plot and a sentence, not for the table.
    """
    rows, plain = [], {}
    for name, (base, encoder) in schemes(pad_block, model).items():
        leak = size_leak(texts, encoder, answers=answers)
        cost = leak["bytes per event"]
        plain.setdefault(base, cost)
        rows.append({"scheme": name, "bytes per event": round(cost, 1),
                     "bytes added per event": round(cost - plain[base], 1),
                     "x its format unpadded": round(cost / plain[base], 3),
                     "distinct sizes": leak["distinct sizes"], "sizes that name a length": leak["sizes that name a length"],
                     "share of sizes that name a length": round(leak["pins"], 3),
                     "share of events whose size names it": round(leak["pinned"], 3),
                     "sizes": leak["sizes"], "named": leak["named"]})
    return rows
