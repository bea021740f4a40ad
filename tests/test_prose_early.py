"""Chapters 1 to 5's plumbing (streamlab.book.prose_early), on numbers their runs may or may not give, and their shape.

The tables must read as words (no True, None, NaN, lists or field names), the
sentences must follow their numbers (a gap under the threshold is not "the one a
reader feels"), and each chapter must keep its idea in sight and its plumbing
folded: at most 80 visible lines of code, the opening pair, the questions, the
closing heading.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from streamlab.book import prose_early as prose
from streamlab.book.proofread import prose_problems
from streamlab.model.detokenizer import MAX_HOLD_TOKENS, Detokenizer, NaiveDetokenizer, detokenize

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
EARLY = ["01_split_characters", "02_three_ways", "03_bytes_on_the_wire", "04_the_reader", "05_when_the_user_leaves"]
PY_VALUES = re.compile(r"^(True|False|None|nan|NaN)$|^\[.*\]$")


class ByteTokenizer:
    """A tokenizer whose ids are bytes: every character outside ASCII is split across tokens, as in byte-level BPE."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", "replace")

    def convert_ids_to_tokens(self, t: int) -> str:
        return f"<0x{t:02X}>"


def words_only(frame: pd.DataFrame) -> list[str]:
    """Every cell and header that a reader would read as a Python value or a field's name."""
    cells = [str(v) for v in frame.astype(object).to_numpy().ravel()]
    found = [c for c in cells if PY_VALUES.match(c)]
    found += [str(h) for h in frame.columns if re.fullmatch(r"[a-z]+(_[a-z]+)+", str(h))]
    return found + [c for c in cells if re.fullmatch(r"-?\d+\.\d{4,}", c)]


# -- the shared helpers ---------------------------------------------------------------------------------------


def test_shown_makes_spaces_line_ends_and_nothing_visible():
    assert prose.shown(" v") == "␣v" and prose.shown("a\nb") == "a↵b" and prose.shown("") == "(nothing)"


def test_in_words_leaves_no_python_value_in_a_table():
    frame = pd.DataFrame({"ok": [True, False], "what": [None, float("nan")], "many": [[200, 204], []],
                          "x": [7.666667, 1.0]})
    shown = prose.in_words(frame)
    assert list(shown["ok"]) == ["yes", "no"] and list(shown["what"]) == ["—", "—"]
    assert shown["many"][0] == "200 and 204" and shown["x"][0] == 7.67
    assert not words_only(shown)


# -- chapter 1 ------------------------------------------------------------------------------------------------


def test_token_and_piece_tables_say_broken_in_words():
    tok = ByteTokenizer()
    ids = tok.encode("a🦜")
    table = prose.token_table(tok, ids)
    assert list(table["broken"]) == ["no", "yes", "yes", "yes", "yes"] and not words_only(table)
    naive = detokenize(NaiveDetokenizer(tok), ids)
    whole = detokenize(Detokenizer(tok), ids)
    pieces = prose.pieces_table({"naive": naive, "incremental": whole}, "a🦜")
    assert list(pieces["equals the original"]) == ["no", "yes"] and list(pieces["broken pieces"]) == [4, 0]
    listing = prose.pieces_listing({"naive": naive, "incremental": whole})
    assert "|a|🦜|" in listing and "[" not in listing and "2 pieces" in listing


def test_split_characters_and_the_longest_hold():
    tok = ByteTokenizer()
    ids = tok.encode("a é 🦜")
    assert prose.split_characters(Detokenizer(tok), ids) == ["é", "🦜"]
    assert prose.longest_hold(Detokenizer(tok), ids) == 4  # the parrot's four bytes, one token each
    assert prose.longest_hold(Detokenizer(tok), tok.encode("plain")) == 1


def test_the_hold_sentence_says_what_the_bound_can_cut_in_this_vocabulary():
    none = prose.hold_sentence(3, MAX_HOLD_TOKENS, (0, 49_152))
    assert "held at most 3 tokens" in none and "short of its bound of 4" in none and "None of the vocabulary's 49,152" in none
    some = prose.hold_sentence(4, MAX_HOLD_TOKENS, (12, 151_665))
    assert "its bound of 4" in some and "12 of the vocabulary's 151,665 tokens" in some and "broken" in some
    assert "not byte-level" in prose.hold_sentence(2, MAX_HOLD_TOKENS, None)
    for sentence in (none, some):
        assert not prose_problems(sentence), sentence


def test_straddling_tokens_counts_tokens_that_end_one_character_and_begin_the_next():
    class ByteLevel:  # the decoder's class name is what joins_bytes reads
        pass

    class Backend:  # the Rust tokenizer inside transformers' fast one, whose vocabulary is read
        decoder = ByteLevel()

        def get_vocab(self):
            to_symbol = {b: s for s, b in prose._byte_of_symbol().items()}
            tokens = [b"a", "é".encode()[:1], "é".encode()[1:] + "🦜".encode()[:2], "é".encode()[1:] + b"x"]
            return {"".join(to_symbol[b] for b in t): i for i, t in enumerate(tokens)} | {"<|endoftext|>": 9}

    class Vocabulary:
        backend_tokenizer = Backend()
        clean_up_tokenization_spaces = False

    # Only the third ends é and begins the parrot; the fourth ends é and then holds a whole character.
    assert prose.straddling_tokens(Vocabulary()) == (1, 5)
    assert prose.straddling_tokens(ByteTokenizer()) is None


def test_the_cost_table_times_each_detokenizer_at_each_length():
    tok = ByteTokenizer()
    cost = prose.cost_table(tok, tok.encode("héllo wörld "), [16, 64], {"naive": NaiveDetokenizer, "window": Detokenizer})
    assert list(cost.index) == [16, 64] and list(cost.columns) == ["naive µs/token", "window µs/token"]
    assert (cost >= 0).all().all()


def test_pushes_and_window_starts_read_as_words():
    tok = ByteTokenizer()
    ids = tok.encode("🦜")[:3]
    d = Detokenizer(tok)
    pushed = [d.push(t) for t in ids]
    table = prose.pushes_table(tok, ids, pushed, d.flush()).data
    assert list(table["returned"])[:3] == ["(nothing: held back)"] * 3 and table["call"].iloc[-1] == "flush()"
    starts = prose.window_starts(tok, tok.encode(" 🦜"))
    assert list(starts["starts broken"]) == ["no", "no", "yes", "yes", "yes"] and not words_only(starts)


# -- chapter 2 ------------------------------------------------------------------------------------------------


def test_the_head_table_says_what_no_cache_allows():
    from streamlab.lab.experiments.wire_shown import HEAD_WHY

    why = HEAD_WHY["cache-control"]  # the one sentence, where the wire's rows get it (wire_shown)
    assert why.startswith("no-store: no cache may keep a copy") and "no-cache alone would let one store it" in why

    class Wire:
        def field_rows(self):
            return [{"field": "Cache-Control", "value": "no-cache, no-store, no-transform", "why it is there": why},
                    {"field": "X-Accel-Buffering", "value": "no", "why it is there": "nginx"}]

    rows = prose.head_table(Wire()).data
    assert list(rows["why it is there"]) == [why, "nginx"]


def test_the_frame_table_writes_flags_in_words():
    from streamlab.protocol.anatomy import frame_layout
    from streamlab.protocol.websocket_frames import encode_frame

    table = prose.frame_table(frame_layout(encode_frame(1, b'{"text": "hi"}', mask=b"\x01\x02\x03\x04"))).data
    values = dict(zip(table["field"], table["value"]))
    assert values["FIN"] == "yes" and values["MASK"] == "yes" and "true" not in set(table["value"])


def test_the_ways_table_orders_the_three_ways():
    rows = pd.DataFrame([{"way": w, "first text (s)": t, "end (s)": 1.0, "bytes on the wire": 100, "bytes of text": 10,
                          "ratio": 10.0} for w, t in (("ws", 0.1), ("complete", 1.0), ("stream", 0.1))])
    table = prose.ways_table(rows, same_text=True)
    assert list(table.index) == ["/complete", "/stream (SSE)", "/ws (WebSocket)"]
    assert set(table["same text all three ways"]) == {"yes"}
    stalled = pd.concat([rows, rows.assign(**{"first text (s)": [0.1, 1.0, 0.1]}),
                         rows.assign(**{"first text (s)": [0.9, 1.0, 0.1]})])  # one prompt's WebSocket stalled
    assert prose.ways_table(stalled, same_text=True).loc["/ws (WebSocket)", "first text (s)"] == 0.1


# -- chapter 3 ------------------------------------------------------------------------------------------------


def test_the_wire_listing_shows_bytes_without_python_reprs():
    listing = prose.wire_listing({"SSE": b'data: {"text": "abc"}\n\n', "WebSocket frame": b'\x81\x0f{"text": "abc"}'})
    assert 'data: {"text": "abc"}\\n' in listing and "81 0f (header)" in listing
    assert "b'" not in listing and "\\x81" not in listing


def test_per_event_bytes_are_rounded_and_the_padding_label_names_the_framing():
    table = prose.per_event_table({"SSE": b"x" * 23, "WebSocket frame": b"x" * 17}, "abc")
    assert list(table["bytes per byte of text"]) == [7.7, 5.7]
    assert prose.padded_label(32, b"x" * 40, "y" * 32) == "JSON padded to 32-byte blocks, + 8 bytes of SSE framing"


def test_the_leak_table_shows_shares_as_percentages():
    rows = [{"scheme": "plain", "bytes per event": 24.166667, "bytes added per event": 0.0, "x its format unpadded": 1.0,
             "distinct sizes": 9, "sizes that name a length": 8, "share of sizes that name a length": 0.888889,
             "share of events whose size names it": 0.916667, "sizes": [1], "named": [(1, 2)]}]
    table = prose.leak_table(rows)
    assert table.loc["plain", "share of sizes that name a length (%)"] == 88.9
    assert table.loc["plain", "bytes per event"] == 24.2 and not words_only(table)


# -- chapter 4 ------------------------------------------------------------------------------------------------


def test_the_waits_table_counts_whole_tokens():
    waits = prose.waits_table([{"words": 50, "tokens": 58.26, "streaming": 0.12, "no streaming": 1.37,
                                "reading time": 12.6}])
    assert waits.loc[50, "tokens (about)"] == 58 and "tokens" not in waits.columns


@pytest.mark.parametrize("gaps, felt", [([0.02, 0.03, 0.108], False), ([0.02, 0.25, 0.6], True)])
def test_a_gap_under_the_threshold_is_not_the_one_a_reader_feels(gaps, felt):
    said = prose.threshold_takeaway(gaps, 0.2)
    assert ("feels, whatever the median" in said) is felt
    if felt:
        assert "the 2 gaps over it (the slowest 600 ms) are what a reader" in said
    else:
        assert "the slowest, 108 ms, stayed under it: no gap here is one a reader" in said and "100%" in said
    assert not prose_problems(said), said


# -- chapter 5 ------------------------------------------------------------------------------------------------


class Server:
    def __init__(self, port: int, logs: dict) -> None:
        self.port, self.logs = port, logs

    def log(self, request_id: str) -> dict:
        return self.logs[request_id]


def test_leave_rows_finish_the_naive_server_and_read_as_words():
    running = {"tokens": 12, "tokens_at_stop": None, "stop_reason": None, "stop_signal": None, "client_left": False}
    ended = {"tokens": 50, "tokens_at_stop": None, "stop_reason": "max_tokens", "stop_signal": "write_failed",
             "client_left": True}
    watching = Server(1, {})
    naive = Server(2, {"n1": running})
    final = {(1, "w1"): {"tokens": 11, "tokens_at_stop": 10, "stop_reason": "stopped", "stop_signal": "eof",
                         "client_left": True}, (2, "n1"): ended}
    rows = prose.LeaveRows(watching, naive, lambda port, request_id: final[(port, request_id)])
    rows.add("SSE, reader leaves", watching, "w1", 10)
    rows.add("SSE, reader leaves", naive, "n1", 10)
    before = rows.table()
    assert list(before["noticed by"]) == ["end-of-file on read", "—"] and list(before["how it ended"]) == ["stopped", "—"]
    rows.finish()
    table = rows.table()
    assert list(table["generated"]) == [11, 50] and list(table["noticed by"]) == ["end-of-file on read", "a failed write"]
    assert list(table["how it ended"]) == ["stopped", "ran to its token limit"] and list(table["client left"]) == ["yes"] * 2
    assert table["made when it heard"].tolist() == [10, "—"] and not words_only(table)
    assert rows.watched("SSE") == 11 and rows.watched("SSE", "made when it heard") == 10 and rows.naive_made("SSE") == 50
    assert rows.rows[1]["noticed by"] == "write_failed", "the recorded rows keep the server's words"


def test_why_more_tells_the_lead_from_the_pass_in_flight():
    both = prose.why_more({"the SSE reader": 12, "saying stop": 10}, {"the SSE reader": 13, "saying stop": 10}, 10)
    assert "2 tokens more for the SSE reader" in both and "After it heard, 1 token more for the SSE reader" in both
    neither = prose.why_more({"the SSE reader": 10}, {"the SSE reader": 10}, 10)
    assert neither.startswith("Each goodbye reached the server") and "no token more" in neither
    for said in (both, neither):
        assert not prose_problems(said), said


def test_the_vanish_table_says_never_rather_than_none():
    rows = [{"server": "kernel defaults", "pieces read before the network vanished": 10, "tokens made": 80,
             "tokens made for nobody": 70, "noticed by": None, "noticed after (s)": None, "stored as": "max_tokens"},
            {"server": "--tcp-user-timeout 1", "pieces read before the network vanished": 10, "tokens made": 40,
             "tokens made for nobody": 30, "noticed by": "connection_lost", "noticed after (s)": 1.4,
             "stored as": "client_left"}]
    table = prose.vanish_table(rows)
    assert list(table["noticed by"]) == ["never noticed", "the kernel giving up on a silent peer"]
    assert list(table["noticed after (s)"]) == ["—", 1.4] and list(table["stored as"]) == ["ran to its token limit",
                                                                                        "client left"]
    assert not words_only(table)
    assert prose.noticed(float("nan")) == "never noticed" and prose.noticed("grace_expired") == "grace expired"


# -- the chapters themselves ------------------------------------------------------------------------------------


def cells(stem: str) -> list[dict]:
    return json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


@pytest.mark.parametrize("stem", EARLY)
def test_the_chapter_shows_at_most_80_lines_of_code(stem):
    visible = [c for c in cells(stem) if c["cell_type"] == "code" and not tags(c) & {"hide-input", "parameters"}]
    lines = sum(len(source(c).splitlines()) for c in visible)
    assert lines <= 80, f"{stem}: {lines} visible lines of code"
    for cell in cells(stem):
        if "hide-input" in tags(cell):
            assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True, cell["id"]
        assert "display(Markdown" not in source(cell) or "hide-input" in tags(cell), f"{stem}: prose in sight"
        assert "record(" not in source(cell) or "hide-input" in tags(cell), f"{stem}: record() in sight"


@pytest.mark.parametrize("stem", EARLY)
def test_the_chapter_opens_asks_and_closes_in_the_books_one_voice(stem):
    all_cells = cells(stem)
    first = source(all_cells[0]).split("\n\n")
    assert re.match(r"# \d+\. ", first[0]) and first[1].startswith("**What this chapter asks:** ")
    assert first[2].startswith("**What you will be able to do:** ")
    headings = [i for i, c in enumerate(all_cells) if c["cell_type"] == "markdown" and source(c).startswith("## ")]
    takeaways = next(i for i in headings if source(all_cells[i]).strip() == "## Takeaways")
    questions = source(all_cells[takeaways - 1])
    assert questions.startswith("## Check your understanding\n")
    numbered = re.findall(r"^(\d)\. ", questions, re.M)
    assert 3 <= len(numbered) <= 5 and numbered == [str(i + 1) for i in range(len(numbered))]
    assert questions.count("<details><summary>Answer</summary>\n\n") == len(numbered) == questions.count("\n\n   </details>")
    after = all_cells[takeaways + 1:]  # the takeaways computed from this run (and the recording), nothing else
    assert after and all(c["cell_type"] == "code" for c in after)
    assert not any("What this chapter leaves" in source(c) or "**The question" in source(c) for c in all_cells)


def test_terms_are_defined_once_and_links_to_them_land():
    defined: dict[str, str] = {}
    for stem in EARLY:
        for cell in cells(stem):
            for slug in re.findall(r'<dfn id="([^"]+)">', source(cell)):
                assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug), slug
                assert slug not in defined, f"{slug} defined in {defined.get(slug)} and {stem}"
                assert cell["cell_type"] == "markdown", f"{slug}: define a term in prose, not in an output"
                defined[slug] = stem
    for stem in EARLY:
        for cell in cells(stem):
            for target, slug in re.findall(r"\]\((0[1-5]_[a-z_]+)\.ipynb#([a-z0-9-]+)\)", source(cell)):
                assert defined.get(slug) == target, f"{stem} links to {target}#{slug}, defined in {defined.get(slug)}"
    assert defined["reading-threshold"] == "04_the_reader" and defined["rst-stream"] == "05_when_the_user_leaves"


# -- the two charts drawn for them ------------------------------------------------------------------------------


def test_the_cost_chart_says_both_its_axes_are_logarithmic():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from streamlab.book import early_plots

    ax = early_plots.detokenizer_cost([{"answer length (tokens)": n, "naive µs/token": 1.0, "window µs/token": 1.2,
                                        "full re-decode µs/token": n / 10} for n in (256, 1024, 4096)])
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "log" in ax.get_xlabel() and "log" in ax.get_ylabel()
    plt.close("all")


def test_the_filler_chart_names_the_plain_chunk():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from streamlab.book import early_plots

    ax = early_plots.filler_leak([1, 2, 3], [274, 275, 276], [290, 301, 295])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["plain chunk", "with its obfuscation field"]
    assert ax.get_title().startswith("Random filler") and "OpenAI chunk" in ax.get_ylabel()
    plt.close("all")
