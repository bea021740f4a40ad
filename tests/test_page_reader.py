"""Chapter 15's experiment: the page server's streams over plain sockets, the rows from what a page saw, and the reader in Chromium.

The pure parts need no browser: the cuts inside characters, the pieces, the
page server's bytes (read back with our own chunked decoder and SSE parser),
and every row the chapter shows, made from results shaped as the page
returns them. The browser tests run the written-out reader in headless
Chromium against the page server alone; the whole chapter, with our server,
is tests/test_notebooks.py's ``test_15_the_reader_in_the_browser``.
"""

from __future__ import annotations

import json
import socket
from typing import Iterator

import pytest

from streamlab.lab.experiments import page_reader as pr
from streamlab.lab.experiments import page_scripts
from streamlab.lab.experiments.page_server import (
    FAILURE,
    MARKDOWN_ANSWER,
    SENTENCE,
    PageServer,
    cut_inside_characters,
    markdown_pieces,
    page_server,
    word_pieces,
)
from streamlab.lab.outside import headless
from streamlab.protocol.http_body import ChunkedDecoder
from streamlab.protocol.sse import parse_events
from streamlab.server.transport.responses import STATIC
from streamlab.server.wire.formats import TextPiece

REASON = headless.unavailable_reason()
browser = pytest.mark.browser
needs_chromium = pytest.mark.skipif(REASON is not None, reason=f"no headless browser: {REASON}")


# --------------------------------------------------------------------------
# Pieces and cuts
# --------------------------------------------------------------------------


def test_an_event_is_cut_after_the_first_byte_of_its_first_wide_character():
    event = TextPiece(" vẹt").encode()
    first, rest = cut_inside_characters(event)
    assert first + rest == event
    assert first.endswith(b"\xe1") and rest.startswith(b"\xba\xb9")  # ẹ is E1 BA B9: one byte here, two there
    assert "\ufffd" in first.decode("utf-8", "replace") and "\ufffd" in rest.decode("utf-8", "replace")
    assert cut_inside_characters(b'data: {"text": " token"}\n\n') == [b'data: {"text": " token"}\n\n']


def test_the_sentence_and_the_answer_are_cut_into_pieces_that_join_back():
    words = word_pieces(SENTENCE)
    assert "".join(words) == SENTENCE and words[1] == " vẹt" and len(words) == len(SENTENCE.split())
    pieces = markdown_pieces(MARKDOWN_ANSWER)
    assert "".join(pieces) == MARKDOWN_ANSWER
    assert pieces[pieces.index("``"):][:2] == ["``", "`"], "a fence of three backticks comes as two pieces"
    cut = [p for p in words if len(cut_inside_characters(TextPiece(p).encode())) == 2]
    assert len(cut) == 10  # every word with a character of several bytes: all but "Con", " sinh" and " token"


# --------------------------------------------------------------------------
# The page server, read over a plain socket
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageServer]:
    modules = tmp_path_factory.mktemp("node_modules")
    (modules / "pkg").mkdir()
    (modules / "pkg" / "index.mjs").write_text("export const answer = 42;\n")
    (modules.parent / "secret.txt").write_text("not for the page")
    with page_server(modules) as server:
        yield server


def raw_get(server: PageServer, target: str, *, method: str = "GET", headers: str = "") -> tuple[bytes, list[bytes]]:
    """The response head, and the body as the reads that brought it (the socket's own cuts)."""
    with socket.create_connection(server.server_address, timeout=10) as sock:
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode())
        data, reads = b"", []
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        reads = [rest] if rest else []
        while chunk := sock.recv(65536):
            reads.append(chunk)
    return head, reads


def body_of(reads: list[bytes]) -> tuple[bytes, bool]:
    """The chunked body decoded, and whether it ended with its last chunk."""
    decoder = ChunkedDecoder()
    body = b"".join(part for read in reads for part in decoder.feed(read))
    return body, decoder.done


def test_the_split_stream_is_the_sentence_in_events_each_cut_inside_a_character(page):
    head, reads = raw_get(page, "/split?pause=0.01")
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head and b"Access-Control-Allow-Origin: *" in head
    body, whole = body_of(reads)
    events = parse_events(body)
    assert whole and events[-1].event == "end"
    assert "".join(json.loads(e.data)["text"] for e in events[:-1]) == SENTENCE
    # Read apart, the pieces end inside characters: decoding each read alone breaks them.
    assert sum("\ufffd" in read.decode("utf-8", "replace") for read in reads) >= 2


def test_the_failing_stream_ends_its_body_with_an_error_and_no_end(page):
    _, reads = raw_get(page, "/fails?after=3")
    body, whole = body_of(reads)
    events = parse_events(body)
    assert whole, "the body ends as every body does: the error is in the events"
    assert [e.event for e in events] == ["message"] * 3 + ["error"]
    error = json.loads(events[-1].data)
    assert error["stop_reason"] == "error" and FAILURE in error["error"]["message"] and error["tokens"] == 3


def test_the_cut_stream_breaks_off_and_resumes_after_the_id_sent_back(page):
    _, reads = raw_get(page, "/cut?after=2&reader=test", headers="Last-Event-ID: 4\r\n")
    body, whole = body_of(reads)
    events = parse_events(body)
    assert not whole, "no last chunk: a body broken off"
    assert [e.id for e in events] == ["5", "6"] and b"retry: 200" in body
    assert [s.last_event_id for s in page.seen("/cut", reader="test")] == ["4"]


def test_a_preflight_is_answered_and_npm_files_stay_inside_their_folder(page):
    head, _ = raw_get(page, "/split", method="OPTIONS")
    assert head.startswith(b"HTTP/1.1 204") and b"last-event-id" in head
    head, reads = raw_get(page, "/npm/pkg/index.mjs")
    assert head.startswith(b"HTTP/1.1 200") and b"text/javascript" in head and b"".join(reads).startswith(b"export")
    for target in ("/npm/../secret.txt", "/npm/pkg/../../secret.txt", "/npm/nothing.mjs", "/elsewhere"):
        assert raw_get(page, target)[0].startswith(b"HTTP/1.1 404"), target


# --------------------------------------------------------------------------
# Rows from what the page saw (shaped as page_scripts returns them)
# --------------------------------------------------------------------------


def test_split_rows_count_the_broken_characters_and_compare_the_text():
    results = {"split_plain": {"reads": 20, "cut_reads": 9, "replacement": 26, "text": "Con v\ufffd\ufffdt"},
               "split_stream": {"reads": 21, "cut_reads": 9, "replacement": 0, "text": SENTENCE}}
    plain, streamed = pr.split_rows(results)
    assert (plain["U+FFFD in the text"], plain["text is the sentence"]) == (26, False)
    assert (streamed["U+FFFD in the text"], streamed["text is the sentence"]) == (0, True)
    assert streamed["reads ending inside a character"] == 9


def test_stop_rows_count_from_when_the_server_heard():
    results = {"stop_fetch": {"request_id": "1", "pieces": 5, "said": "AbortError"},
               "stop_eventsource": {"generation_id": "g", "pieces": 5}}
    records = {"stop_fetch": {"tokens": 7, "tokens_at_stop": 6, "stop_signal": "eof", "stored_reason": "client_left"},
               "stop_eventsource": {"tokens": 30, "tokens_at_stop": None, "stop_signal": None,
                                    "stored_reason": "max_tokens"}}
    fetch, closed = pr.stop_rows(results, records)
    assert fetch["way"] == pr.STOP_WAYS["stop_fetch"][0] and fetch["route"] == "/stream"
    assert (fetch["tokens after the click"], fetch["tokens after the server heard"]) == (2, 1)
    assert closed["tokens after the server heard"] is None and closed["tokens after the click"] == 25
    assert fetch["the page saw"] == "AbortError"


def test_failure_rows_say_which_reader_showed_an_error():
    results = {"fails_text": {"pieces": 6, "shown": "a complete answer"},
               "fails_events": {"pieces": 6, "shown": "an error: generation failed"},
               "fails_page": {"pieces": 6, "status": "Failed", "kind": "error", "stop_reason": "error",
                              "badge": "incomplete — failed"}}
    assert [row["an error"] for row in pr.failure_rows(results)] == [False, True, True]
    results["fails_page"]["kind"] = "warn"
    assert not pr.failure_rows(results)[2]["an error"]


def test_responses_and_again_rows_count_requests_and_statuses():
    def entry(url, status):
        return {"message": json.dumps({"message": {"method": "Network.responseReceived",
                                                   "params": {"response": {"url": url, "status": status}}}})}

    log = [entry("http://s/generations/a/events", 200), {"message": "not json"},
           entry("http://s/generations/a/events", 204), entry("http://s/generations/x/events", 404),
           entry("http://s/stream?reader=fetch", 200)]
    responses = pr.responses_of(log)
    assert responses[1] == ("http://s/generations/a/events", 204) and len(responses) == 4
    results = {
        "again_eventsource_end": {"url": "http://s/generations/a/events", "pieces": 4, "closed_by": "the browser"},
        "again_eventsource_404": {"url": "http://s/generations/x/events", "pieces": 0, "closed_by": "the browser"},
        "again_eventsource_cut": {"url": "http://p/cut", "pieces": 6, "closed_by": "the page"},
        "again_fetch_end": {"url": "http://s/stream?reader=fetch", "pieces": 4, "said": "read to the end"},
        "again_fetch_cut": {"url": "http://p/cut", "pieces": 3, "said": "TypeError"},
    }
    end, missing, cut, fetch_end, fetch_cut = pr.again_rows(results, responses, {"eventsource": 3, "fetch": 1},
                                                            [None, "2", "5"])
    assert (end["requests"], end["statuses"]) == (2, [200, 204])
    assert (missing["requests"], missing["statuses"]) == (1, [404])
    assert (cut["requests"], cut["Last-Event-ID sent back"]) == (3, ["2", "5"])
    assert fetch_end["requests"] == 1 and fetch_cut["requests"] == 1 and fetch_cut["stopped by"] == "TypeError"


def test_broken_counts_per_kind_and_the_cost_at_points():
    found = {"pieces": 4, "final": [],
             "prepared": [[], [], [], []],
             "raw": [["a half link"], ["a half link", "stray asterisks"], [], ["a table shown as pipes"]],
             "cost": {"pieces": 1000, "chars": 3000, "ms": {"prepared": [1.0] * 1000, "raw": [0.5] * 1000}}}
    counts = pr.broken_counts(found)
    assert counts["raw"]["broken"] == 3 and counts["raw"]["a half link"] == 2 and counts["prepared"]["broken"] == 0
    assert counts["broken pieces"] == {"prepared": [], "raw": [1, 2, 4]}
    assert counts["cost"]["prepared"] == {125: 1.0, 250: 1.0, 500: 1.0, 1000: 1.0}
    assert pr.cost_at([float(i) for i in range(100)], points=(50, 200), window=10) == {50: 44.5}


def test_js_function_shows_the_real_prepare_markdown_with_its_comment():
    source = (STATIC / "markdown.js").read_text(encoding="utf-8")
    shown = pr.js_function(source, "prepareMarkdown")
    assert shown.startswith("/**") and "export function prepareMarkdown(text, partial) {" in shown
    assert shown.endswith("\n}") and "holdBackTable(lines)" in shown and "function escapeHtml" not in shown
    with pytest.raises(ValueError):
        pr.js_function(source, "noSuchFunction")


# --------------------------------------------------------------------------
# The written-out reader, in Chromium
# --------------------------------------------------------------------------

READ_IN_PAGE = page_scripts.READER + """
const done = arguments[arguments.length - 1];
async function read(path, stream) {
  const out = { text: "", names: [] };
  await readEvents(await fetch(path), (name, data) => {
    out.names.push(name);
    const d = JSON.parse(data);
    if (name === "message") out.text += d.text;
    else if (name === "error") out.error = d.error.message;
  }, { stream });
  return out;
}
Promise.all([read("/split", false), read("/split", true), read("/fails?after=2", true)])
  .then(done, (err) => done({ failed: String(err) }));
"""


@browser
@needs_chromium
def test_the_written_out_reader_in_chromium_keeps_cut_characters_only_with_stream_true(page):
    with headless.chromium() as driver:
        driver.get(page.url + "/elsewhere")  # any page of the page server's origin: its fetches are same-origin
        driver.set_script_timeout(30)
        plain, streamed, failed = driver.execute_async_script(READ_IN_PAGE)
    assert streamed["text"] == SENTENCE and "\ufffd" not in streamed["text"]
    assert plain["text"] != SENTENCE and plain["text"].count("\ufffd") > 0  # the reads ended inside characters
    assert plain["names"] == streamed["names"] == ["message"] * len(word_pieces(SENTENCE)) + ["end"]
    assert failed["names"] == ["message", "message", "error"] and FAILURE in failed["error"]
