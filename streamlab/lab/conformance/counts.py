"""The public conformance suites, run against our protocol code: counts per suite and group, for the book.

Three tables, each in its own module and each case named by the public
suite it follows:

    eventsource.py   web-platform-tests' eventsource/format-* cases (and a few of the standard's own steps)
    autobahn.py      Autobahn|Testsuite's WebSocket cases, groups 1-7, 9 and 10
    http_framing.py  RFC 9112's request-smuggling shapes (llhttp, h11, the HTTP Garden)

``run_all`` runs them here, in the process, with no socket: the event
stream through the parser and the client's recorder, every WebSocket case
through ``Connection`` as Autobahn's echo server, every request through the
head parser and the body reader. ``make test`` runs the same tables against
the server too (tests/test_conformance_*.py), and the EventSource cases
against our client and server.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from streamlab.lab.conformance import autobahn, eventsource, http_framing

__all__ = ["run_all"]


def _sse() -> list[dict[str, Any]]:
    groups: dict[str, Counter] = {}
    for case in eventsource.CASES:
        group = "wpt eventsource/format-*" if case.id.startswith("format-") else "the WHATWG algorithm's own steps"
        tally = groups.setdefault(group, Counter())
        tally["cases"] += 1
        tally["passed"] += all(not eventsource.run(case, way) for way in eventsource.WAYS)
    return [{"suite": "event stream (web-platform-tests)", "group": group, "cases": t["cases"], "passed": t["passed"],
             "non-strict": 0, "how": "whole, split at every byte, byte by byte; parser and client"}
            for group, t in groups.items()]


def _ws() -> list[dict[str, Any]]:
    tallies: dict[int, Counter] = {group: Counter() for group in autobahn.GROUPS}
    for case in autobahn.CASES:
        script = case.build()
        out = autobahn.run_echo(script)
        tally = tallies[case.group]
        tally["cases"] += 1
        if not autobahn.check(script, out):
            tally["passed"] += 1
            tally["non-strict"] += not autobahn.strict(script, out)
    return [{"suite": "WebSocket (Autobahn|Testsuite)", "group": f"{group}: {autobahn.GROUPS[group]}",
             "cases": t["cases"], "passed": t["passed"], "non-strict": t["non-strict"],
             "how": "Connection as Autobahn's echo server"} for group, t in tallies.items()]


def _http() -> list[dict[str, Any]]:
    groups: dict[str, Counter] = {}
    for case in http_framing.CASES:
        tally = groups.setdefault(case.group, Counter())
        tally["cases"] += 1
        tally["passed"] += all(not http_framing.run(case, way) for way in http_framing.WAYS)
    return [{"suite": "HTTP/1.1 framing (RFC 9112)", "group": group, "cases": t["cases"], "passed": t["passed"],
             "non-strict": 0, "how": "whole, split at every byte, byte by byte; head parser and body reader"}
            for group, t in groups.items()]


def run_all() -> list[dict[str, Any]]:
    """One row per suite and group: its cases, how many passed, how many of those only as Autobahn's "non-strict"."""
    return _sse() + _ws() + _http()
