"""Tokens in, pieces out: the model and what turns its tokens into text a reader can be sent.

    loading.py         the tokenizer and the model: the embedded default, the atomic cache, the device
    sampling.py        seeded top-p sampling with a light repetition penalty
    detokenizer.py     incremental, UTF-8-safe detokenizing (and the naive one, for contrast)
    stop_sequences.py  stop sequences found across pieces, held back so none is ever half sent
    lifecycle.py       one generation's phases, written down in one place (begin, feed, stop, end)
    generation.py      a generation in its own thread, its pieces handed to asyncio with their times
    batching.py        the batched engine: one loop steps every generation in one forward pass
    backlog.py         backpressure: how far an answer may run ahead of its reader

Two engines drive a generation, a thread each or one batch, both through the
lifecycle's public moves. Nothing here knows about HTTP.
"""
