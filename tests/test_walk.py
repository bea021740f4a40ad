"""The walk of one ``POST /stream``, traced: which server modules it enters, from where, and how often.

``docs/library.md`` says the walk goes down once and back once, each module
entered once each way: the line (``jobs.py``) admits it at the door and takes
its slot back at the end, and nothing between asks it anything; the answer
(``answer.py``) does every step in between itself. A profile hook on the
server's loop thread records every call into a module of ``streamlab/server``
from another module, while one answer streams over the fake model; the test
asserts on that list, so a step moved back into the line shows here.
"""

from __future__ import annotations

import inspect
import sys
import threading
from pathlib import Path

import pytest

from inprocess import serving
from fakes import FakeLM
from streamlab.client import timed as client

pytestmark = pytest.mark.timeout(60)

SERVER = Path(__file__).resolve().parents[1] / "streamlab" / "server"
LOOP_THREAD = "streamlab-in-process-server"
RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def walk_of(request) -> list[tuple[str, str, str]]:  # noqa: ANN001
    """Every entry into a server module from another one on the loop thread: (from, into, function)."""
    entries: list[tuple[str, str, str]] = []
    seen: dict[int, object] = {}

    def module(frame) -> str | None:  # noqa: ANN001
        path = frame.f_code.co_filename
        return str(Path(path).relative_to(SERVER)) if path.startswith(str(SERVER)) else None

    def profile(frame, event, arg) -> None:  # noqa: ANN001
        if event != "call" or threading.current_thread().name != LOOP_THREAD:
            return
        into = module(frame)
        if into is None or frame.f_back is None:
            return
        code = frame.f_code
        if code.co_flags & RESUMABLE:
            if id(frame) in seen:
                return  # a coroutine or generator resumed where it waited: not a call, the same visit going on
            seen[id(frame)] = frame  # held, so that no later frame takes its id
        came_from = module(frame.f_back) or "outside"
        if came_from != into:
            entries.append((came_from, into, code.co_qualname))

    with serving(FakeLM("Hello, world!", decode_seconds=0.002)) as server:
        client.get_json_sync(server.port, "/health")  # the first connection's set-up, before the count
        previous = sys.getprofile()
        done = threading.Event()

        def install() -> None:
            sys.setprofile(profile)
            done.set()

        server.loop.call_soon_threadsafe(install)
        done.wait(5)
        try:
            trace = request(server.port)
        finally:
            stopped = threading.Event()
            server.loop.call_soon_threadsafe(lambda: (sys.setprofile(previous), stopped.set()))
            stopped.wait(5)
    assert trace.status == 200 and trace.complete
    return entries


def test_a_stream_enters_the_line_once_going_in_and_once_coming_back():
    entries = walk_of(lambda port: client.stream_sync(port, "Hi", 8))
    calls = [function for _, _, function in entries]
    line = [(came_from, function) for came_from, _, function in entries if function.startswith("Jobs.")]
    assert line == [("answers/answer.py", "Jobs.admit"), ("answers/answer.py", "Jobs.release")], line
    # Down, then back: admitted before anything is written, the slot given back after the last piece.
    pieces = [i for i, function in enumerate(calls) if function == "EventDelivery.piece"]
    assert len(pieces) == 8
    assert (calls.index("Jobs.admit") < calls.index("EventDelivery.opening") < pieces[0]
            < pieces[-1] < calls.index("Jobs.release") < calls.index("EventDelivery.ending"))


def test_the_request_is_read_once_and_its_answer_owns_every_step():
    entries = walk_of(lambda port: client.stream_sync(port, "Hi", 8))
    read = [(came_from, function) for came_from, into, function in entries
            if into == "answers/requests.py" and came_from != "answers/fields.py"]  # not the schema's converters
    assert read == [("app.py", "parse_generation_request")], read
    # The store is written by the answer alone (the turn, the answer's row, each piece, the ending) ...
    writers = {came_from for came_from, into, _ in entries if into.startswith("store/") and not came_from.startswith("store/")
               and came_from != "outside"}
    assert writers == {"answers/answer.py"}, writers
    # ... and the model's source is asked by the door (the prompt measured) and by the answer (its generation).
    asked = {(came_from, function) for came_from, into, function in entries if into == "answers/sources.py"}
    assert {came_from for came_from, _ in asked} == {"answers/jobs.py", "answers/answer.py"}, asked
    assert ("answers/answer.py", "ModelSource.generation") in asked
