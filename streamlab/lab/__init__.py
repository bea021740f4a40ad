"""The experiments behind the chapters, and the other programs they measure against.

    experiments.py   the chapters' experiments as functions: run against a live server, tidy rows back
    runner.py        start the server, the proxy or the platform as a process on a free port (or in process)
    records.py       where a run keeps things, the prompts, runs recorded for later chapters
    measures.py      ``Report``: figures, ratios and targets, printed and saved as every benchmark does
    wire_shown.py    chapter 2's raw wire: an event stream as it arrives, a WebSocket upgrade and its frames
    wire_cost.py     what one piece costs on the wire in each format (chapter 3)
    strangers.py     the hostile requests of chapter 9 and the answers they must get
    ecosystem.py     chapter 10: the formats read by their own SDKs, a cut stream, the relay
    overhead.py      what streaming adds to a bare loop, and from piece to socket (chapter 11)
    load.py          readers at once on the real model, threads against the batched engine
    many_streams.py  thousands of scripted streams, ours against rivals.py's servers
    rivals.py        the same scripted source served by uvicorn + Starlette, sse-starlette, websockets
    backpressure.py  a 1 KB/s reader under each backpressure policy
    sse_or_websocket.py  chapter 6: nginx's defaults against each, a drop, a stop mid-answer
    browser_readers.py   what EventSource, fetch and WebSocket send from a page (headers, cookies, Origin)
    between.py       chapter 12's nginx settings, the reader's verdict on a trace, the two designs' bills
    replicas.py      chapter 13: replicas behind nginx, workers (in process or as processes), one shared log
    redis_server.py  a private redis-server on a free loopback port, its own folder, stopped by itself
    connection_limit.py  chapter 14: eight event streams from one Chromium page, over HTTP/1.1 and HTTP/2
    curl.py          curl -N as a subprocess, each chunk of its stdout timed
    llamacpp.py      llama.cpp's server (make engine) on a loopback port, as an upstream
    info.py          python -m streamlab info: load the model, time its first token and its speed
    browser.py, headless.py, cross_site.py   headless Chromium: the page, the screenshot, a hostile page

The lab uses every layer below it; the book above it only presents what it measures.
"""
