"""Chapters 1 to 5's plumbing: their tables in words, their computed sentences, the rows they collect.

A chapter shows its experiment's calls and the library source it explains;
what turns a measurement into a table a reader can read (``yes`` rather than
``True``, a dash rather than ``NaN``, a header in words rather than a field's
name, a piece of text with its spaces visible) and the sentences whose words
depend on the numbers live here, where ``tests/test_prose_early.py`` tries
them on numbers the chapter's run may or may not give.

    shown(" v")                 '␣v': a piece of text as a table shows it
    in_words(frame)             booleans as yes/no, missing values as a dash, floats rounded
    gap_verdict(gaps, 0.2)      what the slowest gap says against the threshold, in words

Each chapter's functions are grouped under its number.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from streamlab.book.wording import count, either, listing, plural
from streamlab.model.detokenizer import REPLACEMENT

__all__ = [
    "LeaveRows", "SIGNAL_WORDS", "STOP_WORDS", "WAYS", "chunk_table", "cost_table",
    "frame_table", "gap_verdict", "head_table", "hold_sentence", "in_words", "leak_table", "longest_hold",
    "model_table", "noticed", "padded_label", "per_event_table", "pieces_listing", "pieces_table", "pushes_table",
    "shown", "split_characters", "straddling_tokens", "threshold_takeaway", "time_per_token", "token_table",
    "vanish_table", "waits_table", "ways_table", "why_more", "window_starts", "wire_listing",
]

DASH = "—"


def shown(text: str) -> str:
    """A piece of text as a table or a listing shows it: each space as ␣, a line end as ↵, an empty piece as such."""
    if not text:
        return "(nothing)"
    return text.replace(" ", "␣").replace("\r", "").replace("\n", "↵")


def _word(value: Any) -> Any:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if isinstance(value, (list, tuple, set, dict)):
        return listing([str(v) for v in value]) if not isinstance(value, dict) else listing(
            [f"{k} {v}" for k, v in value.items()])
    return value


def in_words(frame: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """The table as a reader should see it: yes/no for booleans, a dash for nothing, lists as words, floats rounded."""
    frame = frame.round(digits)
    return frame.astype(object).map(_word) if len(frame.columns) else frame


def _left(frame: pd.DataFrame, formats: Mapping[str, str] | None = None) -> Any:
    """A table of words: no index, text to the left."""
    style = frame.style.hide(axis="index").set_properties(**{"text-align": "left"})
    return style.format(formats) if formats else style


# -- Chapter 1: split characters ----------------------------------------------------------------------------


def token_table(tokenizer: Any, ids: Sequence[int]) -> pd.DataFrame:
    """Each token: its id, its vocabulary entry, what decoding it alone gives, and whether that is broken."""
    rows = []
    for i, t in enumerate(ids):
        alone = tokenizer.decode([t])
        rows.append({"#": i, "id": t, "vocabulary entry": tokenizer.convert_ids_to_tokens(t),
                     "decoded alone": shown(alone), "broken": either(REPLACEMENT in alone, "yes", "no")})
    return pd.DataFrame(rows).set_index("#")


def pieces_listing(pieces_by_name: Mapping[str, Sequence[str]]) -> str:
    """The pieces each detokenizer sent, one line each, between bars, spaces shown as ␣."""
    width = max(len(name) for name in pieces_by_name) + 1
    return "\n".join(f"{name + ':':<{width}} {plural(len(pieces), 'piece'):>10}  |{'|'.join(shown(p) for p in pieces)}|"
                     for name, pieces in pieces_by_name.items())


def pieces_table(pieces_by_name: Mapping[str, Sequence[str]], original: str) -> pd.DataFrame:
    """Per detokenizer: how many pieces, how many broken, the joined text, and whether it is the original."""
    return pd.DataFrame([
        {"detokenizer": name, "pieces": len(pieces), "broken pieces": sum(REPLACEMENT in p for p in pieces),
         "joined text": "".join(pieces), "equals the original": either("".join(pieces) == original, "yes", "no")}
        for name, pieces in pieces_by_name.items()]).set_index("detokenizer")


def split_characters(detok: Any, ids: Sequence[int]) -> list[str]:
    """The characters cut across tokens: each piece ``detok`` sent only after holding one or more tokens back."""
    waited, found = 0, []
    for t in ids:
        waited += 1
        piece = detok.push(t)
        if piece:
            if waited > 1:
                found.append(piece.strip())
            waited = 0
    return found


def _byte_of_symbol() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table), read backwards."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = dict(zip(kept, kept)), 0
    for b in range(256):
        if b not in symbols:
            symbols[b], extra = 256 + extra, extra + 1
    return {chr(symbol): b for b, symbol in symbols.items()}


def straddling_tokens(tokenizer: Any) -> tuple[int, int] | None:
    """How many of the vocabulary's tokens end one character and begin the next, and the vocabulary's size.

    Such a token lets a held run of tokens begin inside one character and end
    inside another, so four held tokens need not complete it. None when the tokenizer's tokens are not byte-level BPE's.
    """
    from streamlab.model.detokenizer import joins_bytes

    if not joins_bytes(tokenizer):
        return None
    to_byte, found = _byte_of_symbol(), 0
    ends_a_character = {symbol for symbol, b in to_byte.items() if 0x80 <= b < 0xC0}  # a continuation byte
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    vocabulary = backend.get_vocab()  # the Rust tokenizer's: transformers' own copy takes a second
    for symbols in vocabulary:
        if symbols[:1] not in ends_a_character or not all(ch in to_byte for ch in symbols):
            continue  # begins at a character's start, or a special token written as text
        data = bytes(to_byte[ch] for ch in symbols)
        end = len(data) - len(data.lstrip(bytes(range(0x80, 0xC0))))  # continuation bytes: a character's end
        found += 0 < end < len(data) and _ends_open(data[end:])
    return found, len(vocabulary)


def _ends_open(data: bytes) -> bool:
    """Whether ``data`` ends inside a character: its last character's first bytes without the rest."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.reason == "unexpected end of data"
    return False


def hold_sentence(held: int, bound: int, straddling: tuple[int, int] | None) -> str:
    """How far the detokenizer held back in this run, and whether its bound could cut a character here."""
    said = (f"Over the sentence and these texts the detokenizer held at most {plural(held, 'token')} before a piece "
            + either(held < bound, f"went out, short of its bound of {bound}. ", f"went out: its bound of {bound}. "))
    if straddling is None:
        return said + "This tokenizer's tokens are not byte-level BPE's, so which of them cross characters is not counted."
    found, vocabulary = straddling
    if not found:
        return said + (f"None of the vocabulary's {vocabulary:,} tokens ends one character and begins the next, "
                       "so here a held run always lies inside one character, which "
                       + either(bound >= 4, f"{bound} tokens always complete.", f"{bound} tokens may not complete."))
    return said + (f"{found:,} of the vocabulary's {vocabulary:,} tokens end one character and begin the next: a "
                   "run held across one of them can reach the bound inside the second character, which then goes out "
                   "broken.")


def longest_hold(detok: Any, ids: Sequence[int]) -> int:
    """The most tokens ``detok`` held back before sending a piece (1: each token's text went out with it)."""
    held = longest = 0
    for t in ids:
        held += 1
        if detok.push(t):
            longest, held = max(longest, held), 0
    return max(longest, held)


def time_per_token(detok: Any, ids: Sequence[int], last: int = 128) -> float:
    """Microseconds per ``push`` over the last ``last`` of ``ids``: the end of an answer, where re-decoding costs most."""
    import time

    for t in ids[:-last]:
        detok.push(t)
    start = time.perf_counter()
    for t in ids[-last:]:
        detok.push(t)
    return (time.perf_counter() - start) / min(last, len(ids)) * 1e6


def cost_table(tokenizer: Any, base: Sequence[int], lengths: Sequence[int], kinds: Mapping[str, Any]) -> pd.DataFrame:
    """Per answer length (``base`` repeated to it), each detokenizer's microseconds per token at the answer's end."""
    rows = []
    for n in lengths:
        ids = (list(base) * (n // max(len(base), 1) + 1))[:n]
        rows.append({"answer length (tokens)": n,
                     **{f"{name} µs/token": time_per_token(kind(tokenizer), ids) for name, kind in kinds.items()}})
    return pd.DataFrame(rows).set_index("answer length (tokens)").round(1)


def pushes_table(tokenizer: Any, ids: Sequence[int], pushed: Sequence[str], tail: str) -> pd.DataFrame:
    """Each push and what it returned, then ``flush()`` and what it handed over."""
    rows = [{"call": f"push({t})", "vocabulary entry": tokenizer.convert_ids_to_tokens(t),
             "returned": shown(p) if p else "(nothing: held back)"} for t, p in zip(ids, pushed)]
    rows.append({"call": "flush()", "vocabulary entry": "", "returned": shown(tail)})
    return _left(pd.DataFrame(rows))


def window_starts(tokenizer: Any, tokens: Sequence[int]) -> pd.DataFrame:
    """Where a window may start: the text decoded from each token on, and whether it starts broken."""
    rows = []
    for k in range(len(tokens)):
        text = tokenizer.decode(list(tokens[k:]))
        rows.append({"window starts at token": k, "decoded window": shown(text),
                     "starts broken": either(text.startswith(REPLACEMENT), "yes", "no")})
    return pd.DataFrame(rows).set_index("window starts at token")


def model_table(naive: Sequence[str], streamed: Sequence[str], tail: str) -> pd.DataFrame:
    """The real model's answer through both detokenizers, the flush at the end on a row of its own."""
    broken = lambda pieces: sum(REPLACEMENT in p for p in pieces)  # noqa: E731
    return pd.DataFrame([
        {"detokenizer": "naive", "pieces": len(naive), "broken pieces": broken(naive)},
        {"detokenizer": "incremental, while streaming", "pieces": sum(bool(p) for p in streamed),
         "broken pieces": broken(streamed)},
        {"detokenizer": "incremental, the flush at the end", "pieces": int(bool(tail)), "broken pieces": broken([tail])},
    ]).set_index("detokenizer")


# -- Chapter 2: three ways ------------------------------------------------------------------------------------

def head_table(wire: Any) -> Any:
    """The response head, a row per field with why it is there (``wire`` is an ``SSEWire``)."""
    return _left(pd.DataFrame(wire.field_rows()))


def chunk_table(wire: Any) -> Any:
    """Each chunk of the body: when it arrived, its size line as sent, its size, the kinds of line inside."""
    return _left(pd.DataFrame(wire.chunk_rows()), {"arrived (s)": "{:.3f}"})


def frame_table(layout: Any) -> Any:
    """A WebSocket frame field by field, its flags in words (``layout`` is a ``FrameLayout``)."""
    from streamlab.lab.experiments.wire_shown import frame_rows

    flag = {"true": "yes", "false": "no"}
    return _left(pd.DataFrame([dict(row, value=flag.get(row["value"], row["value"])) for row in frame_rows(layout)]))


WAYS = {"complete": "/complete", "stream": "/stream (SSE)", "ws": "/ws (WebSocket)"}


def ways_table(rows: pd.DataFrame, same_text: bool) -> pd.DataFrame:
    """The prompts' median per way of delivering, in the order /complete, /stream, /ws.

    The median, not the mean: one stall of a shared machine (a reader not scheduled
    for half a second) moves a mean of a few prompts, not their median.
    """
    table = (rows.groupby("way")[["first text (s)", "end (s)", "bytes on the wire", "bytes of text", "ratio"]]
             .median().reindex(list(WAYS)).rename(index=WAYS))
    table["same text all three ways"] = either(same_text, "yes", "no")
    return table


# -- Chapter 3: bytes on the wire -----------------------------------------------------------------------------


def wire_listing(wire: Mapping[str, bytes]) -> str:
    """Each framing's bytes as a reader can read them: line ends written out, a binary header in hex."""
    from streamlab.protocol.anatomy import visible

    blocks = []
    for name, sent in wire.items():
        text = sent.decode("utf-8", "replace")
        if sent[:1] and sent[0] & 0x80 and not text.isprintable():  # a WebSocket frame: a binary header, then text
            head = 2 if sent[1] & 0x7F < 126 else 4
            lines = [f"{sent[:head].hex(' ')} (header)  {sent[head:].decode('utf-8', 'replace')}"]
        else:
            lines = visible(sent)
        blocks.append(f"{name} ({len(sent)} bytes):\n" + "\n".join(f"  {line}" for line in lines))
    return "\n\n".join(blocks)


def per_event_table(wire: Mapping[str, bytes], piece: str) -> pd.DataFrame:
    """Bytes per event for ``piece`` in each framing, and how many bytes that is per byte of text."""
    text = len(piece.encode())
    return pd.DataFrame([{"format": name, "bytes": len(sent), "bytes per byte of text": round(len(sent) / text, 1)}
                         for name, sent in wire.items()]).set_index("format")


def padded_label(pad_block: int, event: bytes, payload: str) -> str:
    """The padded series' name: it is the JSON that is padded to blocks, and the event adds its framing to it."""
    framing = len(event) - len(payload.encode())
    return f"JSON padded to {pad_block}-byte blocks, + {plural(framing, 'byte')} of SSE framing"


def leak_table(leak_rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Each scheme's cost and what its sizes name, shares as percentages."""
    table = pd.DataFrame(leak_rows).drop(columns=["sizes", "named"]).set_index("scheme")
    shares = [c for c in table.columns if c.startswith("share")]
    table[shares] = (table[shares] * 100).round(1)
    table = table.rename(columns={c: f"{c} (%)" for c in shares})
    return table.round({"bytes per event": 1, "bytes added per event": 1, "x its format unpadded": 2})


# -- Chapter 4: the reader ------------------------------------------------------------------------------------


def waits_table(waits: Sequence[Mapping[str, float]]) -> pd.DataFrame:
    """The waits before the first word, per answer length; tokens are whole (the words times tokens per word)."""
    table = pd.DataFrame(waits).set_index("words").rename(columns={
        "tokens": "tokens (about)", "streaming": "wait, streaming (s)", "no streaming": "wait, no streaming (s)",
        "reading time": "time to read it (s)"})
    table["tokens (about)"] = table["tokens (about)"].round().astype(int)
    return table


def gap_verdict(gaps: Sequence[float], threshold: float) -> str:
    """What the slowest gaps say against the threshold: the ones over it are felt; under it, none is."""
    longer = [g for g in gaps if g > threshold]
    slowest = max(gaps) if gaps else 0.0
    if not longer:
        return (f"the slowest, {slowest * 1000:.0f} ms, stayed under it: no gap here is one a reader keeping up "
                "with the text would feel")
    return (f"the {plural(len(longer), 'gap')} over it (the slowest {slowest * 1000:.0f} ms) "
            f"{count(len(longer), 'is', 'are')} what a reader keeping up with the text feels, whatever the median")


def threshold_takeaway(gaps: Sequence[float], threshold: float) -> str:
    """The takeaway on the one threshold: the share within it, and what the slowest gaps say."""
    within = sum(g <= threshold for g in gaps) / len(gaps) if gaps else 1.0
    return (f"One threshold serves the whole book, {threshold * 1000:.0f} ms. Here {within:.0%} of the gaps stayed "
            f"within it, and {gap_verdict(gaps, threshold)}.")


# -- Chapter 5: when the user leaves --------------------------------------------------------------------------

#: How the server learned that its reader had gone (or asked it to stop), in words.
SIGNAL_WORDS = {"eof": "end-of-file on read", "close_frame": "a close frame", "stop_message": "a stop message",
                "write_failed": "a failed write", "write_timeout": "a write that timed out",
                "connection_lost": "the kernel giving up on a silent peer"}
#: How the generation ended, in words.
STOP_WORDS = {"stopped": "stopped", "max_tokens": "ran to its token limit", "eos": "the model ended it",
              "error": "failed", "stop_sequence": "a stop sequence", "client_left": "client left",
              "completed": "completed", "interrupted": "interrupted"}


def noticed(signal: str | None, *, never: str = "never noticed") -> str:
    """A stop signal in words; None (nothing came) as ``never``."""
    if signal is None or (isinstance(signal, float) and math.isnan(signal)):
        return never
    return SIGNAL_WORDS.get(signal, str(signal).replace("_", " "))


class LeaveRows:
    """The chapter's table of readers who left: a row per case and server, the ``--naive`` rows finished at the end.

    The watching server's record is final within a token of the reader's going,
    so its row is read at once; the naive server runs on for nobody, and its rows
    are read again by ``finish`` once those generations have ended.
    """

    def __init__(self, watching: Any, naive: Any, wait_log: Callable[[int, str], Mapping[str, Any]]) -> None:
        self.watching, self.naive, self.wait_log = watching, naive, wait_log
        self.rows: list[dict[str, Any]] = []
        self._running_on: list[tuple[int, str]] = []

    def add(self, case: str, server: Any, request_id: str, delivered: int) -> dict[str, Any]:
        log = self.wait_log(server.port, request_id) if server is self.watching else server.log(request_id)
        row = {"case": case, "server": "watching" if server is self.watching else "--naive", "delivered": delivered,
               "generated": log["tokens"], "made when it heard": log["tokens_at_stop"],
               "stop_reason": log["stop_reason"], "noticed by": log["stop_signal"], "client left": log["client_left"]}
        self.rows.append(row)
        if server is self.naive:
            self._running_on.append((len(self.rows) - 1, request_id))
        return row

    def finish(self) -> None:
        """The naive server's generations, now run to their end: their final counts."""
        for i, request_id in self._running_on:
            log = self.wait_log(self.naive.port, request_id)
            self.rows[i].update({"generated": log["tokens"], "stop_reason": log["stop_reason"],
                                 "noticed by": log["stop_signal"], "client left": log["client_left"]})
        self._running_on = []

    def table(self) -> pd.DataFrame:
        """The rows as a reader reads them: headers and values in words, nothing shown as a Python value."""
        return pd.DataFrame([{
            "case": r["case"], "server": r["server"], "delivered": r["delivered"], "generated": r["generated"],
            "made when it heard": DASH if r["made when it heard"] is None else r["made when it heard"],
            "how it ended": STOP_WORDS.get(r["stop_reason"], str(r["stop_reason"]).replace("_", " "))
            if r["stop_reason"] else DASH,
            "noticed by": noticed(r["noticed by"], never=DASH), "client left": either(r["client left"], "yes", "no"),
        } for r in self.rows])

    def watched(self, prefix: str, column: str = "generated") -> int | None:
        """The watching server's figure for the case that starts with ``prefix`` (None: "made when it heard" of an
        answer that ran to its end before its goodbye reached the server)."""
        value = next(r[column] for r in self.rows if r["server"] == "watching" and r["case"].startswith(prefix))
        return None if value is None else int(value)

    def naive_made(self, prefix: str) -> int:
        return int(next(r["generated"] for r in self.rows if r["server"] == "--naive" and r["case"].startswith(prefix)))


def why_more(heard: Mapping[str, int | None], watched: Mapping[str, int], leave_after: int) -> str:
    """Why the watching server made more tokens than were read: its lead before the goodbye, the pass in flight after."""
    ended = [case for case, made in heard.items() if made is None]
    heard = {case: made for case, made in heard.items() if made is not None}
    ahead = {case: made - leave_after for case, made in heard.items() if made > leave_after}
    after = {case: watched[case] - made for case, made in heard.items() if watched[case] > made}
    said = "" if not ended else (
        f"For {listing(ended)} the answer ran to its end before the goodbye reached the server: nothing was left "
        "to stop. ")
    said += either(
        bool(ahead),
        f"Before {either(len(ahead) == 1, 'that goodbye', 'those goodbyes')} reached the server, the model had made "
        + listing([f"{plural(extra, 'token')} more for {case}" for case, extra in ahead.items()])
        + either(len(ahead) == 1, " than its reader had read", " than their readers had read")
        + ": its lead, text already written toward a reader who was still reading. ",
        f"Each goodbye reached the server before the model had made more than the {leave_after} tokens read. ")
    return said + either(
        bool(after),
        "After it heard, " + listing([f"{plural(extra, 'token')} more for {case}" for case, extra in after.items()])
        + ": what the model was already computing; the stop flag is checked before each forward pass, and a "
        "pass once started runs to its end, so its token is made and never read.",
        "After it heard, no token more: each goodbye arrived before the next forward pass began (the stop flag is "
        "checked before each one).")


def vanish_table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The two servers whose reader's network vanished, in words: a dash where the server never noticed."""
    return pd.DataFrame([{
        **row, "noticed by": noticed(row["noticed by"]),
        "noticed after (s)": DASH if row["noticed after (s)"] is None else row["noticed after (s)"],
        "stored as": STOP_WORDS.get(row["stored as"], str(row["stored as"]).replace("_", " ")),
    } for row in rows]).set_index("server")
