"""Chapter 3's encoders are the server's own: the sizes it counts are the sizes a live stream sends.

And the leak table: a plain framing's sizes each name one length, a block
hides the lengths inside it, and the ``obfuscation`` filler leaves only the
sizes at the edges of the range naming one.
"""

from __future__ import annotations

import pytest

from streamlab.client import timed as client
from streamlab.lab.experiments import api_formats, wire_cost
from streamlab.server.wire.openai_api import OBFUSCATION_MAX

FRAMINGS = {wire_cost.SSE: api_formats.STREAMLAB, wire_cost.CHUNK: api_formats.OPENAI,
            wire_cost.RESPONSE_DELTA: api_formats.RESPONSES, wire_cost.ANTHROPIC: api_formats.ANTHROPIC}


@pytest.mark.parametrize("framing", FRAMINGS)
def test_each_encoder_writes_a_piece_as_the_server_streams_it(app, framing):
    fmt = FRAMINGS[framing]
    trace = client.post_sync(app.port, api_formats.ROUTES[fmt], api_formats.request_body(fmt, 5, model="fake"))
    sent = api_formats.first_piece(trace).encode()
    made = wire_cost.encoders("fake")[framing](trace.text_events[0].text)
    assert len(made) == len(sent)  # the same bytes, ids and times aside (which keep their length)
    if framing in (wire_cost.SSE, wire_cost.ANTHROPIC):  # no id, no time: the very bytes
        assert made == sent


def test_the_websocket_frame_is_the_payload_behind_a_two_byte_header():
    assert wire_cost.streamlab_ws_frame("abc") == b"\x81\x0f" + wire_cost.piece_json("abc").encode()


def test_a_responses_delta_grows_by_a_digit_at_the_7th_and_the_97th_piece():
    encode = wire_cost.responses_encoder("fake")
    sizes = [len(encode("a")) for _ in range(100)]
    assert sizes[0] == sizes[5] < sizes[6] == sizes[95] < sizes[96]
    assert wire_cost.answer_bytes(["a"] * 100, wire_cost.RESPONSE_DELTA, "fake") == sum(sizes)


TEXTS = [" the", " lighthouse", " a", " of", " keeper", ",", " stood", " tall"] * 4


def test_a_plain_framing_names_every_length_and_a_block_hides_them():
    plain = wire_cost.size_leak(TEXTS, lambda: wire_cost.streamlab_sse)
    assert plain["pins"] == plain["pinned"] == 1.0 and plain["distinct sizes"] == len({len(t) for t in TEXTS})
    assert sorted(length for _, length in plain["named"]) == sorted({len(t) for t in TEXTS})
    block = wire_cost.size_leak(TEXTS, lambda: lambda text: wire_cost.padded_sse(text, 32))
    assert block["distinct sizes"] == 1 and block["pins"] == 0.0 and block["named"] == []


def test_the_filler_costs_bytes_and_leaves_only_the_edges_naming_a_length():
    rows = {r["scheme"]: r for r in wire_cost.leak_table(TEXTS, pad_block=32, answers=64, model="fake")}
    chunk, filled = rows[wire_cost.CHUNK], rows["OpenAI chunk with its obfuscation field"]
    assert chunk["bytes added per event"] == 0 and chunk["share of sizes that name a length"] == 1.0
    # the field's name and quotes (`, "obfuscation": ""`, 19 bytes) and 8.5 characters on average
    assert 19 + 6 < filled["bytes added per event"] < 19 + 11 and filled["x its format unpadded"] > 1
    assert 0 < filled["share of sizes that name a length"] < 0.5 and filled["share of events whose size names it"] < 0.2
    lengths = sorted({len(t) for t in TEXTS})
    assert {length for _, length in filled["named"]} <= {lengths[0], lengths[-1]}  # the shortest and the longest
    assert filled["distinct sizes"] <= lengths[-1] - lengths[0] + OBFUSCATION_MAX  # offsets 1+1 to 11+16
    assert len(filled["sizes"]) == len(TEXTS)  # one answer's, for the plot
