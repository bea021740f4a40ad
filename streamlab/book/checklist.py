"""The production checklist: every fix the chapters measure, one line each, hop by hop along the path.

The chapters find what breaks a stream and measure the fix; an engineer
about to ship wants the fixes in one list, each with the chapter that shows
why. ``CHECKLIST`` is that list, written once here (the book renders it into
``build/book/checklist.html``; ``tests/test_glossary.py`` checks that every
chapter it names exists). The hops are the path picture's
(``streamlab.book.path_picture.HOPS``), so an item sits where its fix goes.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Callable

from streamlab.book.path_picture import HOPS, path_picture

__all__ = ["CHECKLIST", "Item", "render_checklist"]


@dataclass(frozen=True)
class Item:
    """One fix: where it goes (a hop of the path), what to do (Markdown with `code`), why, the chapters that measure it."""

    hop: str
    fix: str
    why: str
    chapters: tuple[str, ...]


CHECKLIST: tuple[Item, ...] = (
    # The server: the headers, the events, the bounds.
    Item("server", "Send `Content-Type: text/event-stream`", "an `EventSource` refuses any other type",
         ("02_three_ways",)),
    Item("server", "Send `Cache-Control: no-cache, no-store, no-transform`",
         "no cache keeps or replays the stream, and no hop rewrites (compresses) it", ("02_three_ways",
                                                                                      "12_what_else_sits_between")),
    Item("server", "Send `X-Accel-Buffering: no` on every stream",
         "nginx passes each event at once instead of filling its buffer first", ("06_the_proxy",)),
    Item("server", "Send a keep-alive ping (an SSE comment, `: ping`) more often than the shortest idle timeout",
         "a model that pauses looks like a dead connection to a balancer", ("06_the_proxy",)),
    Item("server", "Send whole text: an incremental detokenizer, flushed when the answer ends",
         "a token can end inside a character, which alone decodes to U+FFFD", ("01_split_characters",)),
    Item("server", "Watch every connection for EOF while generating, and stop the model when the reader leaves",
         "otherwise the model writes the whole answer for nobody", ("05_when_the_user_leaves",)),
    Item("server", "Set `TCP_USER_TIMEOUT` and TCP keep-alive on accepted connections (`--tcp-user-timeout`)",
         "a reader whose network vanished is noticed in seconds, not after the kernel's retries", (
             "05_when_the_user_leaves",)),
    Item("server", "Store each answer as it streams, with its stop reason; mark the cut ones incomplete",
         "a stop, a disconnect or a crash (`interrupted`) keeps what was said", ("07_persisting_partial_answers",)),
    Item("server", "Number the events (`id:`) and resume from `Last-Event-ID` without generating again",
         "a dropped connection costs a reconnect, not a second answer", ("08_reconnect_and_resume",)),
    Item("server", "Answer `204 No Content` to a reader who already has the end",
         "an `EventSource` reconnects after every close; any status but 200 stops it, 204 says there is nothing more",
         ("08_reconnect_and_resume",)),
    Item("server", "End every stream with its terminator (`end`, `[DONE]`, `message_stop`), and check for it when reading",
         "a stream cut cleanly looks complete to a reader that does not", ("10_the_formats_people_actually_use",)),
    Item("server", "Send a failure as an `error` event before closing", "a silent close reads as a short answer",
         ("10_the_formats_people_actually_use", "15_the_reader_in_the_browser")),
    Item("server", "Check `Host` against an allow-list and `Origin` (403); take only `application/json` (415)",
         "a web page the reader visits cannot drive a server on their machine", ("09_a_stranger_at_the_door",)),
    Item("server", "Give the whole request head and body a deadline (408)",
         "a client that sends one byte at a time holds a connection for free", ("09_a_stranger_at_the_door",)),
    Item("server", "Read long prompts in chunks (`--prefill-chunk`)",
         "the other readers keep streaming while a long prompt is read, at some cost to that prompt",
         ("09_a_stranger_at_the_door",)),
    Item("server", "Batch the generations, with a bounded line behind the batch; past it, 503 with `Retry-After`",
         "a crowd gets a fair wait and a clear refusal instead of a timeout", ("09_a_stranger_at_the_door",
                                                                              "11_serving_many_readers")),
    Item("server", "Bound what is queued for one reader (`--max-queued`, `--slow-reader-timeout`)",
         "a slow reader costs a bounded buffer, not the server's memory", ("11_serving_many_readers",)),
    Item("server", "On a function platform, name its execution limit in an `error` event, or answer asynchronously",
         "a platform cuts a long stream silently, and bills the time it is held open", (
             "12_what_else_sits_between",)),
    # nginx, the reverse proxy.
    Item("nginx", "`proxy_buffering off` for event streams, or let the server's `X-Accel-Buffering: no` through",
         "with buffering on, the first event waits for the buffer (or the end)", ("06_the_proxy",)),
    Item("nginx", "Keep `X-Accel-Buffering` out of `proxy_ignore_headers` on stream routes (a cache-everything rule puts it"
                  " there)", "ignored, the server's header no longer turns buffering off", ("12_what_else_sits_between",)),
    Item("nginx", "`proxy_read_timeout` longer than the longest silence between pings",
         "nginx's default (60 s) closes a stream that waits longer", ("06_the_proxy",)),
    Item("nginx", "For WebSockets: `proxy_http_version 1.1;` and the `Upgrade` and `Connection` headers",
         "without them the handshake reaches the server without `Upgrade` and is refused", ("06_the_proxy",)),
    Item("nginx", "`http2 on;` in the TLS server block (nginx 1.25.1 and later)",
         "a browser's streams to one origin share one connection instead of waiting for one of six",
         ("14_many_streams_in_one_browser",)),
    # The CDN, and any hop that compresses or caches.
    Item("CDN", "Never cache event streams: no cache-everything rule on their routes",
         "a cache replays an old stream to a reconnecting reader, all at once", ("12_what_else_sits_between",)),
    Item("CDN", "Compress a stream with a flush after every write, or not at all (`no-transform`)",
         "a compressor that buffers holds every event until the end", ("12_what_else_sits_between",)),
    Item("CDN", "Test each hop with `curl -N`, straight to the server and then through the hop",
         "the first hop where the answer stops streaming is the one to fix", ("12_what_else_sits_between",)),
    # The load balancer, and the replicas behind it.
    Item("load balancer", "Keep the events in a log every replica reads (Redis), not in one process",
         "a reader whose replica died resumes on another with nothing lost or twice", ("13_more_than_one_server",)),
    Item("load balancer", "Keep conversations in a shared store, so no sticky session is needed",
         "a second turn, WebSocket or not, can land on any replica", ("13_more_than_one_server",)),
    Item("load balancer", "Idle timeout above the ping interval (60 to 100 s in the clouds)",
         "the balancer closes a silent stream as a dead one", ("06_the_proxy",)),
    # The worker.
    Item("worker", "Carry a cancel to the worker from any replica, and stop within a token or two",
         "a Stop pressed on one replica stops a model running elsewhere", ("13_more_than_one_server",)),
    Item("worker", "Let another worker take over an abandoned job and continue it from the kept tokens",
         "a worker killed mid-answer costs a pause, not the answer", ("13_more_than_one_server",)),
    # The browser: the reader's page.
    Item("browser", "Stop with the abort signal (`AbortController.abort()`, the SDK's `signal`), or close the socket",
         "the server hears the reader leave and stops the model", ("15_the_reader_in_the_browser",)),
    Item("browser", "Decode with `TextDecoder.decode(bytes, {stream: true})`",
         "a character cut between two reads is kept for the next one, not broken", ("15_the_reader_in_the_browser",)),
    Item("browser", "More than six streams to one origin need HTTP/2",
         "over HTTP/1.1 the seventh waits until one of the six ends", ("14_many_streams_in_one_browser",)),
    Item("browser", "Prepare partial Markdown before rendering it",
         "half a link or a table's first row otherwise jumps as the text arrives", ("15_the_reader_in_the_browser",)),
)


def _inline(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def render_checklist(chapter_ref: Callable[[str], str], items: tuple[Item, ...] = CHECKLIST) -> str:
    """The checklist as HTML, hop by hop in the path's order; ``chapter_ref(stem)`` links a chapter."""
    parts = [path_picture(caption="each fix below sits at its hop").svg]
    for hop, what in HOPS:
        mine = [item for item in items if item.hop == hop]
        if not mine:
            continue
        parts.append(f'<h2 id="{html.escape(hop.replace(" ", "-").lower())}">{html.escape(hop)}'
                     f' <span class="muted">({html.escape(what)})</span></h2><ul class="checklist">')
        for item in mine:
            where = ", ".join(chapter_ref(stem) for stem in item.chapters)
            parts.append(f"<li><b>{_inline(item.fix)}</b>: {_inline(item.why)}. <span class=\"meta\">{where}</span>"
                         "</li>")
        parts.append("</ul>")
    return "\n".join(parts)
