"""web-platform-tests' event-stream cases (web-platform-tests/wpt, eventsource/format-*), read by our parser and client.

The table is ``streamlab.lab.conformance.eventsource.CASES``, each case named by the
wpt file it follows. Every case is fed whole, split at every byte position
and byte by byte, to ``EventStreamParser`` and to the client's recorder;
each reading must give the case's events, the last event ID string, the
reconnection time, and the ``Last-Event-ID`` the client would send next.
Then a reference written straight from the WHATWG algorithm (HTML 9.2.6)
and hypothesis check that the parser agrees with it on any stream, cut
anywhere.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streamlab.client import timed
from streamlab.lab.conformance import eventsource as cs
from streamlab.protocol import sse

IDS = [case.id for case in cs.CASES]
BY_ID = {case.id: case for case in cs.CASES}


@pytest.mark.parametrize("way", cs.WAYS)
@pytest.mark.parametrize("case_id", IDS)
def test_case(case_id, way):
    assert cs.run(BY_ID[case_id], way) == []


def test_every_format_file_of_wpt_eventsource_that_is_about_parsing_has_a_case():
    # format-mime-* are about the response, not the stream: tests/test_conformance_eventsource.py has them.
    files = {re.match(r"format-[a-z0-9-]+", case.id).group(0) for case in cs.CASES if case.id.startswith("format-")}
    assert files == {
        "format-bom", "format-bom-2", "format-comments", "format-data-before-final-empty-line", "format-field-data",
        "format-field-event-empty", "format-field-event", "format-field-id", "format-field-id-2", "format-field-id-3",
        "format-field-id-null", "format-field-parsing", "format-field-retry-bogus", "format-field-retry-empty",
        "format-field-retry", "format-field-unknown", "format-leading-space", "format-newlines",
        "format-null-character", "format-utf-8",
    }


def test_the_id_waits_for_the_blank_line():
    # format-data-before-final-empty-line, watched as it arrives: the buffer
    # takes the id at once, the string only when the block is dispatched.
    parser = sse.EventStreamParser()
    parser.feed(b"id: 1\ndata: a\n\n")
    parser.feed(b"id: 2\ndata: b\n")
    assert (parser.last_event_id_buffer, parser.last_event_id) == ("2", "1")
    assert parser.feed(b"\n") == [sse.Event("b", id="2")]
    assert parser.last_event_id == "2"


def test_a_reconnect_starts_from_the_id_it_sent():
    # format-field-id-2: events of the new connection without an id keep the one the client held.
    parser = sse.EventStreamParser(last_event_id="7")
    assert parser.feed(b"data: x\n\n") == [sse.Event("x", id="7")]


@pytest.mark.parametrize("case_id", [i for i in IDS if BY_ID[i].last_event_id])
def test_the_header_a_reconnect_sends(case_id):
    head = timed._get_head("/events", "127.0.0.1", 8000, BY_ID[case_id].last_event_id)
    assert b"\r\nLast-Event-ID: " + BY_ID[case_id].last_event_id.encode("utf-8") + b"\r\n" in head


def test_no_header_when_the_string_is_empty():
    assert b"Last-Event-ID" not in timed._get_head("/events", "127.0.0.1", 8000, "")
    assert b"Last-Event-ID" not in timed._get_head("/events", "127.0.0.1", 8000, None)


def test_an_id_that_could_break_the_head_is_refused():
    for bad in ("a\r\nX-Injected: 1", "a\0"):
        with pytest.raises(ValueError):
            timed._get_head("/events", "127.0.0.1", 8000, bad)


# --------------------------------------------------------------------------
# The WHATWG algorithm, written out plainly, against the parser
# --------------------------------------------------------------------------


def reference(stream: bytes, seed: str = "") -> tuple[list[tuple[str, str, str]], str, int | None]:
    """HTML 9.2.6 "interpret an event stream", step by step: events, last event ID string, reconnection time."""
    text = stream.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = re.split(r"\r\n|\r|\n", text)
    lines.pop()  # the text after the last line ending is not a line: at the end of the stream, it is discarded
    data, event_type, id_buffer, id_string, retry = "", "", seed, seed, None
    events = []
    for line in lines:
        if line == "":
            id_string = id_buffer
            if data == "":
                event_type = ""
                continue
            events.append((event_type or "message", data[:-1] if data.endswith("\n") else data, id_string))
            data, event_type = "", ""
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            event_type = value
        elif name == "data":
            data += value + "\n"
        elif name == "id" and "\0" not in value:
            id_buffer = value
        elif name == "retry" and value and all("0" <= c <= "9" for c in value):
            retry = int(value)
    return events, id_string, retry


PIECES = ["data:", "data: ", "id:", "id: ", "id", "event:", "retry:", "retry: ", ":", " ", "x", "7", "0", "\0",
          "\n", "\r", "\r\n", "\n\n", "\ufeff", "é", "🫠", "data"]


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(PIECES), max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
    seed=st.sampled_from(["", "3"]),
)
def test_the_parser_is_the_algorithm(pieces, cuts, seed):
    stream = "".join(pieces).encode("utf-8")
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    parser = sse.EventStreamParser(last_event_id=seed)
    got = []
    for start, end in zip(points, points[1:]):
        got += parser.feed(stream[start:end])
    got += parser.close()
    events, id_string, retry = reference(stream, seed)
    assert [(e.event, e.data, e.id) for e in got] == events
    assert parser.last_event_id == id_string
    assert parser.retry == retry


def test_the_reference_reads_the_table_as_the_table_says():
    for case in cs.CASES:
        events, id_string, retry = reference(case.stream, case.seed)
        assert (tuple(events), id_string, retry) == (case.events, case.last_event_id, case.retry), case.id


def test_the_chapters_table_counts_every_case_and_all_pass():
    # Chapter 8's "how we know the protocol code is right" shows this table: it must hold every case of the three.
    from streamlab.lab.conformance import autobahn, counts, http_framing

    rows = counts.run_all()
    assert sum(r["cases"] for r in rows) == len(cs.CASES) + len(autobahn.CASES) + len(http_framing.CASES)
    assert all(r["passed"] == r["cases"] for r in rows), [r for r in rows if r["passed"] != r["cases"]]
    assert sum(r["non-strict"] for r in rows) == 8
