"""The experiments behind the chapters, the programs they start, and where their results go.

Five packages, each importing only those below it (tests/test_layers.py checks it):

    experiments/   one module per thing measured (chapter in brackets)
        three_ways.py        the same answers by /complete, /stream and /ws, recorded for chapters 3 and 4 (2)
        wire_shown.py        the raw wire: an event stream as it arrives, a WebSocket upgrade and its frames (2)
        wire_cost.py         what one piece costs on the wire in each format, and what its size shows (3)
        hang_up.py           a /complete reader who hangs up: what the server goes on making (5)
        crash_loss.py        an answer's writes to its database watched up to a kill -9: what the crash lost (7)
        vanished.py          a reader whose network vanishes mid-answer, in a namespace of its own (5)
        sse_or_websocket.py  nginx's defaults against each, a drop, a stop mid-answer (6)
        browser_readers.py   what EventSource, fetch and WebSocket send from a page (headers, cookies, Origin) (6)
        reconnects.py        an EventSource after the end: how often it reconnects, what stops it (8)
        refusals.py          the hostile requests and the answers they must get, stalls, a crowd, slowloris (9)
        cross_site.py        what a page of another origin can make the server do, in headless Chromium (9)
        api_formats.py       the formats people use, read by their own SDKs, a cut stream (10)
        relay_leaving.py     a relay's client who leaves: what the upstream goes on making (10)
        overhead.py          what streaming adds to a bare loop, and from piece to socket (11)
        load.py              readers at once on the real model, threads against the batched engine (11)
        many_streams.py      thousands of scripted streams, ours against the rival servers (11)
        backpressure.py      a 1 KB/s reader under each backpressure policy (11)
        other_hops.py        gzip and caches in nginx, the reader's verdict on a trace, a platform's two bills (12)
        failover.py          kill what serves a reader (a replica, a worker) and see what the reader keeps (13)
        log_cost.py          what the shared log costs per event, Redis against memory (13)
        redis_restart.py     Redis killed and started again: what its log kept, with and without its file (13)
        connection_limit.py  eight event streams from one Chromium page, over HTTP/1.1 and HTTP/2 (14)
        page_reader.py       the reader's side in Chromium: a split character, stop, errors, partial Markdown (15)
        page_scripts.py      what that page runs (the fetch reader written out, the experiments), as JavaScript (15)
        page_server.py       the page's own server: a character cut between writes, an error, a broken stream (15)
        model_speed.py       python -m streamlab info: load the model, time its first token and its speed
    outside/       other people's programs: redis_server.py, llamacpp.py (make engine), curl.py (curl -N, timed),
                   headless.py (finding and starting Chromium), browser.py (a reader on the page, the screenshot),
                   rivals.py (the same scripted source served by uvicorn + Starlette, sse-starlette, websockets),
                   node.py (the npm openai SDK, installed once for the tests and chapters 10 and 15)
    setups/        our own programs started for an experiment: runner.py (the server, the proxy or the platform
                   as a process on a free port, or in process), replicas.py (replicas behind nginx, workers),
                   warm_starter.py (one process that imports torch once and forks the servers: streamlab.net.warm)
    conformance/   the public suites' cases as tables: eventsource.py (web-platform-tests), autobahn.py
                   (Autobahn|Testsuite), http_framing.py (RFC 9112), and counts.py (the chapter's counts)
    results/       records.py (where a run keeps things, the prompts, runs recorded for later chapters) and
                   measures.py (``Report``: figures, ratios and targets, as every benchmark prints and saves them)

Starting, waiting for and stopping a process is ``streamlab.net.processes``'s, for every layer. The lab uses
every layer below it; the book above it only presents what it measures.
"""
