"""The interfaces that were duck-typed, declared: every token source and every registry has what is asked of it."""

from __future__ import annotations

import inspect

import pytest

from streamlab.model.generation import Generation, PieceStream
from streamlab.server.answers.scripted import ScriptedEngine, ScriptedGeneration
from streamlab.server.answers.sources import ModelSource, TokenSource, UpstreamSource
from streamlab.server.answers.upstream import UpstreamGeneration
from streamlab.server.resources.resumable import GenerationRegistry, Registry
from streamlab.server.resources.shared_log import SharedRegistry


def members(protocol: type) -> list[str]:
    return [name for name in vars(protocol) if not name.startswith("_") and name not in ("kind",)]


@pytest.mark.parametrize("source", [ModelSource, UpstreamSource, ScriptedEngine])
def test_every_token_source_has_what_jobs_ask_of_it(source):
    for name in members(TokenSource):
        assert hasattr(source, name), f"{source.__name__} has no {name}"
        wanted = getattr(TokenSource, name)
        if callable(wanted):
            assert inspect.iscoroutinefunction(getattr(source, name)) == inspect.iscoroutinefunction(wanted), name
            assert list(inspect.signature(getattr(source, name)).parameters) == list(
                inspect.signature(wanted).parameters)[: len(inspect.signature(getattr(source, name)).parameters)], name
    assert isinstance(source.kind, str)


@pytest.mark.parametrize("registry", [Registry, SharedRegistry])
def test_both_registries_answer_the_four_routes_alike(registry):
    for name in members(GenerationRegistry):
        mine, wanted = getattr(registry, name), getattr(GenerationRegistry, name)
        assert inspect.iscoroutinefunction(mine), f"{registry.__name__}.{name} is not a coroutine"
        assert list(inspect.signature(mine).parameters) == list(inspect.signature(wanted).parameters), name


@pytest.mark.parametrize("stream", [Generation, ScriptedGeneration, UpstreamGeneration])
def test_every_piece_stream_declares_what_the_server_reads(stream):
    assert issubclass(stream, PieceStream)
    assert stream.relayed is (stream is UpstreamGeneration)  # only a relay waits for its upstream to answer
    for name in ("start", "stop", "stopping", "pieces", "wait", "answered", "stopped_by", "gateway_status"):
        assert hasattr(stream, name), f"{stream.__name__} has no {name}"
