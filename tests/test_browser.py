"""The page, in a real browser, against the real server.

Headless Chromium's own ``EventSource`` reads the stream, so these tests
prove what no Python client can: that a browser sees the answer grow while it
is generated, that a reload mid-stream picks the same answer up again, that
its Stop button stops the server's generation (not just the page's display),
that a reload afterwards shows the partial answer marked as such, and that the
page's Markdown rendering of half-written text neither breaks nor runs HTML
from the model. Those run the real server over the real model (``model``).

And what a page of another local origin can make the server do: nothing. The
server over a fake model, in this process, is enough for that.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Iterator

import pytest

from fakes import FakeLM
from inprocess import serving

from streamlab.lab.outside import browser
from streamlab.lab.experiments import cross_site
from streamlab.lab.outside import headless
from streamlab.lab.setups import runner
from streamlab.client.timed import fetch_sync, get_json_sync
from streamlab.server.transport import guards

REASON = headless.unavailable_reason()

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(REASON is not None, reason=f"no headless browser: {REASON}"),
]
model = pytest.mark.model  # the tests that load the real model

# A prompt that makes the default model write at length, and a seed so it does
# the same every run: the test presses Stop long before the model would end.
PROMPT = "Write a long story about a lighthouse keeper and a storm, in many paragraphs."
SEED = 7
RELOAD_AFTER = 6  # pieces
STOP_AFTER = 14  # pieces
# A little extra time per token, so that even a fast accelerator streams slowly
# enough for the samples below to see the answer grow.
TOKEN_DELAY = "0.05"


@pytest.fixture(scope="module")
def page_server(
    model_cache: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[runner.RunningServer]:
    db = tmp_path_factory.mktemp("browser") / "db.sqlite"
    with runner.serve("--db", str(db), "--token-delay", TOKEN_DELAY) as server:
        yield server


@pytest.fixture(scope="module")
def driver() -> Iterator["browser.Chrome"]:
    with headless.chromium(width=1280, height=800) as drv:
        yield drv


@pytest.fixture
def page(driver, page_server: runner.RunningServer):
    """The page, freshly loaded on a new conversation."""
    driver.get(page_server.url + "/")
    headless.wait_for(lambda: driver.execute_script("return !!window.streamlab"), 10, "the page's script")
    driver.execute_script("localStorage.clear()")
    driver.get(page_server.url + "/")
    headless.wait_for(lambda: driver.execute_script("return !!window.streamlab"), 10, "the page's script")
    driver.get_log("browser")  # start each test with an empty console
    return driver


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


def answer_length(driver) -> int:
    return js(driver, "return document.getElementById('answer').innerText.length")


def send(driver, prompt: str, max_tokens: int, seed: int | None = SEED) -> None:
    """Press Send; with a seed, the page's POST carries it (a test hook, not a page feature)."""
    if seed is not None:
        js(
            driver,
            """
            const seed = arguments[0], original = window.fetch;
            window.fetch = (url, init) => {
              if (String(url).endsWith('generations') && init && init.body) {
                const body = JSON.parse(init.body); body.seed = seed;
                init = Object.assign({}, init, {body: JSON.stringify(body)});
              }
              return original(url, init);
            };
            """,
            seed,
        )
    browser.send_prompt(driver, prompt, max_tokens)


# --------------------------------------------------------------------------
# Streaming, stopping, reloading
# --------------------------------------------------------------------------


@model
def test_page_is_served(page, page_server):
    assert page.title == "streamlab"
    assert js(page, "return document.body.dataset.state") == "idle"
    assert js(page, "return typeof window.marked.Marked") == "function", "the vendored marked did not load"
    assert not console_errors(page)


@model
def test_answer_streams_in_then_stop_stops_the_server(page, page_server):
    send(page, PROMPT, max_tokens=400)
    headless.wait_for(lambda: browser.page_state(page) == "streaming", 10, "the page to start streaming")

    # The answer grows while it streams: sample what the reader sees.
    samples = [answer_length(page)]
    increases = 0
    deadline = time.monotonic() + 60
    while (browser.pieces_received(page) < RELOAD_AFTER or increases < 3) and time.monotonic() < deadline:
        assert browser.page_state(page) == "streaming", "the answer ended before Stop could be pressed"
        time.sleep(0.05)
        samples.append(answer_length(page))
        increases += samples[-1] > samples[-2]
    assert increases >= 2, f"the answer did not grow piece by piece: {samples}"
    status = page.find_element("id", "status").text
    assert "piece" in status, status

    # A reload mid-stream: the server kept the events, the page reads them again and goes on.
    before = js(page, "return {id: streamlab.generationId, text: streamlab.text}")
    page.refresh()
    headless.wait_for(
        lambda: js(page, "return !!window.streamlab && streamlab.text.length > arguments[0]", len(before["text"])),
        30,
        "the answer to resume after a reload",
    )
    assert browser.page_state(page) == "streaming"
    resumed = js(page, "return {id: streamlab.generationId, text: streamlab.text}")
    assert resumed["id"] == before["id"]
    assert resumed["text"].startswith(before["text"])
    assert page.find_element("css selector", "#live-prompt .content").text == PROMPT
    assert not page.find_elements("css selector", "#history .msg"), "the answer in progress is not history yet"
    headless.wait_for(lambda: browser.pieces_received(page) >= STOP_AFTER, 60, f"{STOP_AFTER} pieces")

    stop = page.find_element("id", "stop")
    assert stop.is_enabled()
    stop.click()
    headless.wait_for(lambda: browser.page_state(page) == "done", 30, "the end event after Stop")

    streamlab = js(page, "return {id: streamlab.generationId, conversation: streamlab.conversationId,"
                         " text: streamlab.text, end: streamlab.end, pieces: streamlab.pieces.length}")
    assert streamlab["end"]["stop_reason"] == "stopped", streamlab["end"]
    assert streamlab["end"]["incomplete"] is True
    assert "stopped by you" in page.find_element("id", "status").text.lower()
    assert not page.find_element("id", "stop").is_enabled()
    live = page.find_element("id", "live-answer")
    assert "incomplete" in live.get_attribute("class").split()
    assert live.get_attribute("data-stop-reason") == "stopped"

    # The server stopped generating when asked: at most a token or two later.
    records = [r for r in page_server.logs() if str(r.get("generation_id")) == str(streamlab["id"])]
    assert records, f"no /log record for generation {streamlab['id']}"
    record = records[-1]
    assert record["stop_signal"] == "cancel", record
    assert record["tokens_at_stop"] is not None, record
    assert record["tokens"] - record["tokens_at_stop"] <= 2, record
    assert record["tokens"] < 400

    # What the browser received is what the server kept.
    conversation = get_json_sync(page_server.port, f"/conversations/{streamlab['conversation']}")
    answer = conversation["messages"][-1]
    assert answer["role"] == "assistant"
    assert answer["content"] == streamlab["text"]
    assert answer["stop_reason"] == "stopped" and answer["incomplete"] is True

    # Reload: the conversation comes back from the server, the partial answer marked.
    assert streamlab["conversation"] in page.current_url
    page.refresh()
    marked = headless.wait_for(
        lambda: page.find_elements("css selector", '#history .incomplete[data-stop-reason="stopped"]'),
        10,
        "the stopped answer in the history after a reload",
    )
    assert len(marked) == 1
    assert "stopped" in marked[0].find_element("css selector", ".badge").text
    shown = marked[0].find_element("css selector", ".content").text
    assert shown and shown.split()[0] in streamlab["text"]
    messages = page.find_elements("css selector", "#history .msg")
    roles = [el.get_attribute("class").split()[1] for el in messages]
    assert roles == ["user", "assistant"]
    assert js(page, "return streamlab.conversationId") == streamlab["conversation"]
    assert not console_errors(page)


@model
def test_token_limit_is_shown_as_cut_off(page, page_server):
    send(page, PROMPT, max_tokens=5)
    headless.wait_for(lambda: browser.page_state(page) == "done", 30, "the end of a 5-token answer")
    end = js(page, "return streamlab.end")
    assert end["stop_reason"] == "max_tokens", end
    assert end["tokens"] == 5
    assert "cut off: token limit" in page.find_element("id", "status").text.lower()
    live = page.find_element("id", "live-answer")
    assert live.get_attribute("data-stop-reason") == "max_tokens"
    # The SSE connection is closed (no reconnect loop after the end).
    time.sleep(0.3)
    assert js(page, "return streamlab.pieces.length") <= 5
    assert not console_errors(page)


@model
def test_refused_request_is_shown_as_failed(page, page_server):
    # The page never sends a bad body itself; make its fetch do so, to see a refusal shown.
    js(
        page,
        """
        const original = window.fetch;
        window.fetch = (url, init) => {
          if (String(url).endsWith('generations') && init && init.body) {
            const body = JSON.parse(init.body); body.max_tokens = 'lots';
            init = Object.assign({}, init, {body: JSON.stringify(body)});
          }
          return original(url, init);
        };
        """,
    )
    browser.send_prompt(page, "hello")
    headless.wait_for(lambda: browser.page_state(page) == "done", 10, "the refusal")
    status = page.find_element("id", "status").text
    assert status.lower().startswith("failed:"), status
    assert "HTTP" not in status or "400" in status
    assert page.find_element("id", "send").is_enabled()


# --------------------------------------------------------------------------
# Markdown from partial text
# --------------------------------------------------------------------------


def render(driver, text: str, partial: bool = True) -> str:
    fn = "renderPartial" if partial else "renderFinal"
    return js(driver, f"return window.streamlab.{fn}(arguments[0])", text)


@model
def test_open_code_fence_renders_as_code(page):
    html = render(page, "Here:\n\n```python\nfor x in range(3):\n    print(x < 2)")
    assert "<pre><code" in html
    assert "print(x &lt; 2)" in html
    assert "```" not in html
    # A fence marker half typed is not shown as text either.
    assert "`" not in render(page, "Here:\n\n``")
    # A stopped answer may end inside a fence: the final rendering closes it too.
    assert "<pre><code" in render(page, "```\nunfinished", partial=False)


@model
def test_half_table_and_half_link(page):
    table = "| name | tokens |\n|---|---|\n| a | 1 |\n| b | 2 |"
    html = render(page, table + "\n| c | ")
    assert "<table>" in html and "<td>b</td>" in html
    assert "| c" not in html and "<td>c" not in html
    # A header without its delimiter row yet: held back, not shown as a paragraph of pipes.
    assert "|" not in render(page, "Counts:\n\n| name | tokens |")
    assert "|" not in render(page, "Counts:\n\n| name | tokens |\n|---|--")
    # A link still being written shows its text, not its markup.
    for partial in ("See [the spec](https://html.spec.wha", "See [the spec]", "See [the spe"):
        html = render(page, partial)
        assert "](" not in html and "[" not in html, (partial, html)
        assert "See" in html
    html = render(page, "See [the spec](https://html.spec.whatwg.org/).", partial=False)
    assert '<a href="https://html.spec.whatwg.org/"' in html
    # "Items:" followed by the start of a list is not a setext heading.
    assert "<h2" not in render(page, "Items:\n-")


@model
def test_every_prefix_renders_without_error(page):
    text = (
        "# Streaming\n\nSome **bold** and `code`, then a [link](https://example.com/x).\n\n"
        "1. first\n2. second\n\n- [ ] task\n\n> quoted\n\n"
        "| a | b |\n|:--|--:|\n| 1 | 2 |\n\n```js\nconst s = '<b>';\nif (a < b) {}\n```\n\n"
        "Done: <span>raw</span> é 😀.\n"
    )
    failures = js(
        page,
        """
        const text = arguments[0], bad = [];
        for (let i = 0; i <= text.length; i++) {
          const prefix = text.slice(0, i);
          try {
            const html = window.streamlab.renderPartial(prefix);
            if (typeof html !== 'string') bad.push([i, 'not a string']);
            else if (html.includes('```')) bad.push([i, 'fence shown as text']);
            else if (/<(span|b|script|img)[\\s>]/i.test(html)) bad.push([i, 'raw HTML passed: ' + html]);
          } catch (err) {
            bad.push([i, String(err)]);
          }
        }
        return bad;
        """,
        text,
    )
    assert failures == []
    assert not console_errors(page)


@model
def test_raw_html_from_the_model_is_not_run(page):
    payloads = [
        "<img src=x onerror=\"window.__xss = 1\">",
        "text <img src=x onerror=\"window.__xss = 2\"> inline",
        "<script>window.__xss = 3</script>",
        "[click](javascript:window.__xss=4)",
        "![pic](javascript:window.__xss=5)",
        "<a href=\"javascript:window.__xss=6\">x</a>",
        "<svg><script>window.__xss = 7</script></svg>",
        "<iframe src=\"javascript:window.__xss=8\"></iframe>",
    ]
    for payload in payloads:
        for partial in (True, False):
            html = render(page, payload, partial)
            elements = js(
                page,
                """
                const t = document.createElement('template'); t.innerHTML = arguments[0];
                return Array.from(t.content.querySelectorAll('*')).map(el => [el.tagName.toLowerCase(),
                  Array.from(el.attributes).map(a => [a.name.toLowerCase(), a.value])]);
                """,
                html,
            )
            tags = {tag for tag, _ in elements}
            assert not tags & {"img", "script", "svg", "iframe"}, (payload, html)
            attributes = [(name, value) for _, attrs in elements for name, value in attrs]
            assert not [a for a in attributes if a[0].startswith("on") or "javascript:" in a[1]], (payload, html)
    assert "&lt;img src=x" in render(page, payloads[0]), "raw HTML is shown as text"
    # The real check: put it all in the page, click every link, and see that nothing ran.
    js(
        page,
        "document.getElementById('answer').innerHTML ="
        " arguments[0].map(t => window.streamlab.renderPartial(t)).join('')",
        payloads,
    )
    js(page, "for (const a of document.querySelectorAll('#answer a')) a.click()")
    time.sleep(0.3)
    assert js(page, "return window.__xss === undefined")


# --------------------------------------------------------------------------
# The helper `make run` uses
# --------------------------------------------------------------------------


@model
def test_screenshot_mid_stream(tmp_path: Path, page_server: runner.RunningServer):
    # On the module's server (``make run`` starts its own: the same code, with one more server start).
    out = browser.screenshot_mid_stream(tmp_path / "shot.png", max_tokens=60, pieces=8, url=page_server.url)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 800)


# --------------------------------------------------------------------------
# A page of another origin
# --------------------------------------------------------------------------

ATTEMPTS = [name for name, _ in cross_site.CROSS_SITE_ATTEMPTS]


def by_attempt(result: dict) -> dict[str, dict]:
    rows = result["attempts"]
    assert [row["attempt"] for row in rows] == ATTEMPTS
    assert len({frozenset(row) for row in rows}) == 1, "every row has the same keys (a table)"
    return {row["attempt"]: row for row in rows}


def test_a_page_of_another_origin_gets_nothing_done():
    with serving(FakeLM("Hello from the model.")) as server:
        started = time.monotonic()
        result = cross_site.cross_site_attempt(server.port)
        elapsed = time.monotonic() - started

        assert result["generated"] == 0 and result["stored"] == 0, result
        assert get_json_sync(server.port, "/log") == []
        assert server.store.conversations() == []
        assert result["attacker"] != result["server"]
        assert result["attacker"].startswith("http://127.0.0.1:")
        rows = by_attempt(result)
        for row in rows.values():
            assert row["server_generated"] == 0 and row["server_stored"] == 0, row
            assert row["page_read"] is False, row

        # A simple request is sent without asking: the server refuses it, the page sees nothing either way.
        assert rows["no-cors fetch"]["outcome"] == "opaque response"
        assert 'status 0, body ""' in rows["no-cors fetch"]["browser_saw"]
        assert rows["no-cors fetch"]["wire"] == "POST /stream → 415 Unsupported Media Type"
        # So is a form; its answer lands in a frame the page may not read.
        assert rows["form post"]["outcome"] == "iframe loaded, unreadable"
        assert "SecurityError" in rows["form post"]["browser_saw"]
        assert rows["form post"]["wire"] == "POST /generations → 415 Unsupported Media Type"
        # JSON needs a preflight, which the server never grants: the POST itself is never sent.
        assert rows["json fetch"]["outcome"] == "TypeError"
        assert rows["json fetch"]["wire"].startswith("OPTIONS /stream (preflight) → 405")
        assert "POST /stream: not sent (CORS Preflight" in rows["json fetch"]["wire"]
        # A GET is answered, but the browser keeps the answer from the page.
        assert rows["read conversations"]["outcome"] == "TypeError"
        assert rows["read conversations"]["wire"].startswith("GET /conversations → 200 OK, kept from the page (CORS")
        assert any("CORS policy" in message for message in rows["read conversations"]["console"])
        # CORS does not cover WebSockets: the server's Origin check refuses the upgrade.
        assert rows["websocket"]["outcome"] == "close 1006"
        assert rows["websocket"]["browser_saw"].startswith("never opened")
        assert rows["websocket"]["wire"] == "GET /ws (WebSocket upgrade) → 403 Forbidden"

        # The control: the server's own origin may POST JSON, and that is generated and stored.
        own = f"http://127.0.0.1:{server.port}"
        reply = fetch_sync(
            server.port, "POST", "/stream", body={"prompt": "hi", "max_tokens": 5}, headers=[("Origin", own)]
        )
        assert reply.status == 200, reply.body
        assert len(get_json_sync(server.port, "/log")) == 1
        assert len(get_json_sync(server.port, "/conversations")) == 1
        # ... and the attacker's origin may not, even with the right Content-Type.
        refused = fetch_sync(
            server.port, "POST", "/stream", body={"prompt": "hi", "max_tokens": 5},
            headers=[("Origin", result["attacker"])],
        )
        assert refused.status == 403
        assert len(get_json_sync(server.port, "/log")) == 1
    assert elapsed < 20


def test_the_same_page_gets_through_without_the_guards(monkeypatch):
    """The measurement's own control: with the Content-Type and Origin checks off, it sees what slips through."""
    monkeypatch.setattr(guards.Guards, "check_json", staticmethod(lambda request: None))
    monkeypatch.setattr(guards.Guards, "check_origin", lambda self, request: None)
    with serving(FakeLM("Hello from the model.")) as server:
        result = cross_site.cross_site_attempt(server.port)
        rows = by_attempt(result)
        # The page sees the same opaque response as when it was refused: only the server can tell.
        assert rows["no-cors fetch"]["outcome"] == "opaque response"
        assert rows["no-cors fetch"]["page_read"] is False
        assert rows["no-cors fetch"]["wire"] == "POST /stream → 200 OK"
        assert rows["no-cors fetch"]["server_generated"] == 1 and rows["no-cors fetch"]["server_stored"] == 1
        # Without an Origin check a WebSocket is wide open, reading included.
        assert rows["websocket"]["outcome"] == "message" and rows["websocket"]["page_read"] is True
        assert rows["websocket"]["wire"] == "GET /ws (WebSocket upgrade) → 101 Switching Protocols"
        assert rows["websocket"]["server_generated"] == 1
        # A form body is not JSON (400), and CORS still stands in the way of the rest.
        assert rows["form post"]["server_generated"] == 0
        assert rows["json fetch"]["server_generated"] == 0 and rows["json fetch"]["outcome"] == "TypeError"
        assert rows["read conversations"]["page_read"] is False
        assert result["generated"] == 2 and result["stored"] == 2, result
        assert len(get_json_sync(server.port, "/log")) == 2
