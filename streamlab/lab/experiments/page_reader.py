"""The reader's side, in the browser (chapter 15): what a page must do with a stream, measured in headless Chromium.

One Chromium, one scripted server (``serve --scripted-rate``, no model) and
the page's own little server (:mod:`streamlab.lab.experiments.page_server`,
for the streams our server never sends) are started together by
:func:`lab`; :func:`measure` then runs the page's scripts
(:mod:`streamlab.lab.experiments.page_scripts`) in our server's own page and
turns what they saw, and what the server's ``/log`` says it made, into rows:

- ``split``: chapter 1's sentence with each event cut inside a character
  between two reads, decoded by ``TextDecoder`` with and without ``{stream: true}``;
- ``stops``: six ways to press stop (a fetch aborted, the openai SDK's
  ``signal``, a WebSocket told to stop or closed, an ``EventSource`` closed,
  the course page's own Stop), and the tokens the server made after it
  heard, as chapters 5, 6 and 14 count them (``tokens - tokens_at_stop``);
- ``failures``: an error mid-stream, as a reader of text alone, the written-out
  reader and the course page show it;
- ``markdown``: partial Markdown rendered at every piece, with the page's
  preparation (``static/markdown.js``) and as it stands, and what a render costs;
- ``again``: what each reader does after a stream ends or breaks off (the
  browser's network log counts the requests, the page server the ones it got).

The pure parts (rows from records, counts from renders) are functions of their
own, tested without a browser in ``tests/test_page_reader.py``.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from streamlab.client.timed import wait_log_sync
from streamlab.lab.experiments import page_scripts
from streamlab.lab.experiments.page_server import PageServer, page_server
from streamlab.lab.outside.node import openai_sdk
from streamlab.lab.outside.headless import BrowserUnavailable, chromium, responses_received, unavailable_reason, wait_for
from streamlab.lab.setups import runner
from streamlab.server.config import RETRY_MS

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

__all__ = [
    "STOP_WAYS", "Lab", "Reading", "again_rows", "broken_counts", "cost_at", "failure_rows",
    "js_function", "lab", "measure", "responses_of", "split_rows", "stop_rows",
]

PROMPT = "Tell me about the keeper of the lighthouse."

# The page's key for each way to stop: (the way, the route, how the page found its record in /log).
STOP_WAYS: dict[str, tuple[str, str]] = {
    "stop_fetch": ("fetch + AbortController.abort()", "/stream"),
    "stop_sdk": ("openai SDK (npm), signal aborted", "/v1/chat/completions"),
    "stop_ws_message": ("WebSocket, stop message", "/ws"),
    "stop_ws_close": ("WebSocket, close()", "/ws"),
    "stop_eventsource": ("EventSource, close()", "/generations"),
    "stop_page": ("the course page's Stop (POST cancel)", "/generations"),
}


@dataclass
class Lab:
    """What :func:`lab` started: our server, the page's server, the browser (None: why not, in ``why_no_browser``)."""

    server: Any  # streamlab.lab.setups.runner.RunningServer
    page: PageServer
    driver: Chrome | None
    why_no_browser: str | None
    why_no_sdk: str | None
    rate: float


@contextmanager
def lab(*, rate: float, install_sdk: bool = True) -> Iterator[Lab]:
    """Start the scripted server, the page server and Chromium at once; stop them all on the way out.

    The npm SDK is looked for (and installed, the first time) meanwhile. No
    Chromium: ``driver`` is None and ``why_no_browser`` says why; the servers
    still start, so the chapter can say what it would have measured.
    """
    with ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        store = stack.enter_context(tempfile.TemporaryDirectory(prefix="streamlab-page-"))
        starting = pool.submit(runner.start_server, "--scripted-rate", f"{rate:g}", "--max-active", "16",
                               "--db", str(Path(store) / "db.sqlite"))
        sdk = pool.submit(openai_sdk, install_sdk)
        why_no_browser = unavailable_reason()
        browser, driver = ExitStack(), None  # closed first on the way out: the page's connections before the servers
        try:
            if why_no_browser is None:
                try:
                    driver = browser.enter_context(chromium(network_log=True))
                except BrowserUnavailable as err:
                    why_no_browser = str(err)
            server = starting.result()
        except BaseException:
            browser.close()
            raise
        stack.callback(server.stop)
        modules, why_no_sdk = sdk.result()
        page = stack.enter_context(page_server(modules))
        stack.enter_context(browser)
        yield Lab(server, page, driver, why_no_browser, why_no_sdk, rate)


@dataclass
class Reading:
    """What the page saw and the server made, as rows for the chapter's tables (see the module's docstring)."""

    split: list[dict[str, Any]] = field(default_factory=list)
    stops: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    again: list[dict[str, Any]] = field(default_factory=list)
    markdown: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)  # the page's results as it returned them


def _run(driver: Chrome, script: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    driver.execute_script(script, args)
    try:
        return wait_for(lambda: driver.execute_script("return window.lab.finished && window.lab.results"), timeout,
                        "the page's experiments", interval=0.05)
    except TimeoutError as err:
        seen = driver.execute_script("return window.lab && window.lab.results")
        raise TimeoutError(f"{err}; the page had: {json.dumps(seen)[:2000]}") from None


def measure(setup: Lab, *, stop_after: int = 5, max_tokens: int = 30, end_tokens: int = 4, fail_after: int = 6,
            cost_pieces: int = 1000, max_opens: int = 3, wait_s: float | None = None, watch_s: float = 8.0,
            timeout: float = 60.0) -> Reading:
    """Run the page's experiments in our server's page (``/``); the rows the chapter shows.

    ``stop_after`` pieces before each stop button, answers of ``max_tokens``;
    ``end_tokens`` for the answers read to their end; ``fail_after`` pieces
    before the error; ``cost_pieces`` for the render cost. A ``fetch`` read
    to its end is watched ``wait_s`` more (None: our server's ``retry:`` and
    half a second, by when an ``EventSource`` is back); an ``EventSource``
    until the browser closes it, for ``max_opens`` connections, or ``watch_s`` at most.
    """
    driver = setup.driver
    assert driver is not None, "no browser: nothing to measure"
    wait_s = RETRY_MS / 1000 + 0.5 if wait_s is None else wait_s
    server = setup.server
    driver.get(server.url + "/")
    wait_for(lambda: driver.execute_script("return !!window.streamlab && !!window.marked"), 20, "the course page")
    driver.get_log("performance")  # the page's own loading is not the experiment's
    args = {"page": setup.page.url, "prompt": PROMPT, "stopAfter": stop_after, "maxTokens": max_tokens,
            "endTokens": end_tokens, "failAfter": fail_after, "costPieces": cost_pieces, "maxOpens": max_opens,
            "waitMs": int(wait_s * 1000), "watchMs": int(watch_s * 1000)}
    network = _run(driver, page_scripts.NETWORK, args, timeout)
    responses = responses_of(driver.get_log("performance"))
    page = _run(driver, page_scripts.PAGE, args, timeout)
    results = {**network, **page}
    failed = {name: r["failed"] for name, r in results.items() if isinstance(r, dict) and "failed" in r}
    if setup.why_no_sdk and "stop_sdk" in failed:
        results.pop("stop_sdk")
        failed.pop("stop_sdk")
    if failed:
        raise RuntimeError(f"the page's experiments failed: {json.dumps(failed)[:3000]}")
    records = _records(server, results, timeout)
    seen = {label: len(setup.page.seen("/cut", reader=label)) for label in ("eventsource", "fetch")}
    last_ids = [s.last_event_id for s in setup.page.seen("/cut", reader="eventsource")]
    return Reading(
        split=split_rows(results),
        stops=stop_rows(results, records),
        failures=failure_rows(results),
        again=again_rows(results, responses, seen, last_ids),
        markdown=broken_counts(results["markdown"]),
        raw=results,
    )


def _records(server: Any, results: dict[str, Any], timeout: float) -> dict[str, dict[str, Any]]:
    """Each stop's record in the server's ``/log``, once the server is done with it (``key -> record``)."""
    logs = server.logs()
    by_generation = {r["generation_id"]: r for r in logs if r.get("generation_id")}
    ids: dict[str, str] = {}
    for key in STOP_WAYS:
        found = results.get(key)
        if not found:
            continue
        if found.get("generation_id"):
            ids[key] = by_generation[found["generation_id"]]["id"]
        elif found.get("request_id"):
            ids[key] = str(found["request_id"])
    if "stop_ws_close" in results:  # the one /ws answer whose id the page never heard: the other is known
        ws = [r["id"] for r in logs if r["path"] == "/ws" and r["id"] != ids.get("stop_ws_message")]
        ids["stop_ws_close"] = ws[-1]
    return {key: wait_log_sync(server.port, request_id, timeout) for key, request_id in ids.items()}


# --------------------------------------------------------------------------
# Rows, from what the page returned (pure: tests/test_page_reader.py)
# --------------------------------------------------------------------------


def split_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The split sentence decoded both ways: reads, reads that ended inside a character, U+FFFD, the text whole."""
    from streamlab.lab.experiments.page_server import SENTENCE

    rows = []
    for key, decoder in (("split_plain", "decode(bytes): each read alone"),
                         ("split_stream", "decode(bytes, {stream: true})")):
        r = results[key]
        rows.append({"decoder": decoder, "reads": r["reads"], "reads ending inside a character": r["cut_reads"],
                     "U+FFFD in the text": r["replacement"], "text is the sentence": r["text"] == SENTENCE,
                     "text": r["text"]})
    return rows


def stop_rows(results: dict[str, Any], records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per way to stop: pieces the page read, what the server made after the click and after it heard."""
    rows = []
    for key, (way, route) in STOP_WAYS.items():
        if key not in results or key not in records:
            continue
        seen, record = results[key], records[key]
        heard = record.get("tokens_at_stop")
        rows.append({
            "way": way, "route": route, "pieces read at the click": seen["pieces"],
            "tokens made": record["tokens"], "tokens after the click": record["tokens"] - seen["pieces"],
            "tokens when the server heard": heard,
            "tokens after the server heard": None if heard is None else record["tokens"] - heard,
            "noticed by": record.get("stop_signal"), "stored as": record.get("stored_reason"),
            "the page saw": seen.get("said") or seen.get("end") or "",
        })
    return rows


def failure_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The failing answer as each reader showed it."""
    text, events, page = results["fails_text"], results["fails_events"], results["fails_page"]
    return [
        {"reader": "fetch, text only (ends when the body ends)", "pieces": text["pieces"], "shown as": text["shown"],
         "an error": text["shown"].startswith("an error")},
        {"reader": "fetch, the written-out reader (end and error events)", "pieces": events["pieces"],
         "shown as": events["shown"], "an error": events["shown"].startswith("an error")},
        {"reader": "the course page (EventSource, static/stream.js)", "pieces": page["pieces"],
         "shown as": f"{page['status']} [{page['badge']}]", "an error": page["kind"] == "error"
         and page["stop_reason"] == "error"},
    ]


def responses_of(entries: Sequence[dict[str, Any]]) -> list[tuple[str, int]]:
    """Chromium's performance-log entries -> every response the page got, in order: (URL, status)."""
    return [(response["url"], int(response["status"])) for response in responses_received(list(entries))]


def again_rows(results: dict[str, Any], responses: Sequence[tuple[str, int]], page_seen: dict[str, int],
               last_ids: Sequence[str | None]) -> list[dict[str, Any]]:
    """Who came back after a stream ended or broke off: requests made, statuses, and how the reader stopped."""

    def statuses(url: str) -> list[int]:
        return [status for seen, status in responses if seen == url]

    end, missing, cut = (results[k] for k in ("again_eventsource_end", "again_eventsource_404", "again_eventsource_cut"))
    fetch_end, fetch_cut = results["again_fetch_end"], results["again_fetch_cut"]
    resent = [i for i in last_ids if i is not None]
    return [
        {"reader": "EventSource", "stream": "our /generations, ended normally", "requests": len(statuses(end["url"])),
         "statuses": statuses(end["url"]), "pieces": end["pieces"], "stopped by": end["closed_by"]},
        {"reader": "EventSource", "stream": "a 404", "requests": len(statuses(missing["url"])),
         "statuses": statuses(missing["url"]), "pieces": missing["pieces"], "stopped by": missing["closed_by"]},
        {"reader": "EventSource", "stream": "broken off mid-answer (page server)", "requests": page_seen["eventsource"],
         "statuses": [], "pieces": cut["pieces"], "stopped by": cut["closed_by"],
         "Last-Event-ID sent back": resent},
        {"reader": "fetch", "stream": "our /stream, ended normally", "requests": len(statuses(fetch_end["url"])),
         "statuses": statuses(fetch_end["url"]), "pieces": fetch_end["pieces"], "stopped by": fetch_end["said"]},
        {"reader": "fetch", "stream": "broken off mid-answer (page server)", "requests": page_seen["fetch"],
         "statuses": [], "pieces": fetch_cut["pieces"], "stopped by": fetch_cut["said"]},
    ]


def broken_counts(found: dict[str, Any]) -> dict[str, Any]:
    """From each piece's render, how many showed broken structure, with the page's preparation and without."""
    kinds = sorted({kind for way in ("prepared", "raw") for render in found[way] for kind in render})
    counts = {way: {"renders": len(found[way]), "broken": sum(bool(render) for render in found[way]),
                    **{kind: sum(kind in render for render in found[way]) for kind in kinds}}
              for way in ("prepared", "raw")}
    cost = found["cost"]
    return {"pieces": found["pieces"], "final broken": found["final"], "kinds": kinds, **counts,
            "broken pieces": {way: [i + 1 for i, render in enumerate(found[way]) if render]
                              for way in ("prepared", "raw")},
            "cost": {"pieces": cost["pieces"], "chars": cost["chars"],
                     **{way: cost_at(cost["ms"][way]) for way in ("prepared", "raw")}}}


def cost_at(ms: Sequence[float], points: Sequence[int] = (125, 250, 500, 1000), window: int = 25) -> dict[int, float]:
    """Render time (ms) at each point of an answer rendered after every piece: the mean of the ``window`` before it.

    A mean, not a median: the browser rounds ``performance.now()`` (to 0.1 ms
    in Chromium, with jitter), and a median of rounded times is rounded too.
    """
    return {point: statistics.fmean(ms[max(0, point - window):point]) for point in points if point <= len(ms)}


def js_function(source: str, name: str) -> str:
    """The JavaScript function ``name`` of ``source``, with the comment above it, as written (what a chapter shows)."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"(export )?(async )?function {name}\(", line)), None)
    if start is None:
        raise ValueError(f"no function {name} at the start of a line")
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    while start > 0 and lines[start - 1].strip().startswith(("/*", "*", "//")):
        start -= 1
    return "\n".join(lines[start:end + 1])
