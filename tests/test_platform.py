"""The function-platform stand-in: its execution limit, its buffering runtime, its bill.

The platform (``proxy.py`` run with platform options) runs in the test's
event loop in front of an in-process server over the fake model, whose
tokens come 0.05 s apart: an answer of 40 tokens lasts about 2 s, and a
limit of 0.5 s cuts it after a few pieces.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import pytest

from streamlab.net.errors import UserError
from streamlab.client import timed as client
from streamlab.lab.experiments.other_hops import Bill
from streamlab.hops.function_platform import Billing, busy_time, parse_args, platform_command
from streamlab.hops.exchange import COMPLETE
from streamlab.hops.forwarders import EXECUTION_LIMIT, cut_event
from streamlab.hops.proxy import Proxy, serve_proxy
from streamlab.protocol.sse import EventStreamParser

pytestmark = pytest.mark.timeout(60)

DECODE = 0.05  # seconds per fake token
BODY = {"prompt": "hi", "max_tokens": 40, "seed": 0, "chat": False, "ignore_eos": True}
LIMIT = 0.5


@pytest.fixture(scope="module")
def slow(apps):  # noqa: ANN001, ANN201
    return apps(decode_seconds=DECODE)


@asynccontextmanager
async def platform(port: int, **options: Any) -> AsyncIterator[Proxy]:
    options.setdefault("billing", Billing())
    async with serve_proxy(port, block=1, **options) as proxy:
        yield proxy


def through(port: int, body: dict = BODY, **options: Any) -> tuple[Any, list[dict]]:
    """One /stream request through a platform with ``options``: the trace and the platform's log."""

    async def main() -> tuple[Any, list[dict]]:
        async with platform(port, **options) as proxy:
            trace = await client.post(proxy.port, "/stream", body)
            await asyncio.sleep(0.05)  # the exchange's bill is written as the connection closes
            return trace, await client.get_json(proxy.port, "/_proxy/log")

    return asyncio.run(main())


# --------------------------------------------------------------------------
# The bill (pure)
# --------------------------------------------------------------------------


def test_billing_is_duration_times_memory_times_price_rounded_up_to_the_millisecond():
    bill = Billing(memory_mb=2048, price_per_gb_s=0.00002)
    charge = bill.charge(1.2341)
    assert charge["billed_s"] == pytest.approx(1.235)
    assert charge["gb_s"] == pytest.approx(2.47)
    assert charge["cost_usd"] == pytest.approx(2.47 * 0.00002)
    assert Billing(memory_mb=512).charge(0.0001)["billed_s"] == pytest.approx(0.001)  # a minimum of one unit
    assert Billing(memory_mb=512).charge(0.0001)["gb_s"] == pytest.approx(0.0005)
    assert Billing().billed_seconds(0.003) == pytest.approx(0.003)  # no rounding up of an exact millisecond


def test_busy_time_counts_overlapping_runs_once():
    assert busy_time([]) == 0
    assert busy_time([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4)
    assert busy_time([(0, 10), (2, 3)]) == pytest.approx(10)


def test_the_asynchronous_bill_is_the_posts_plus_the_worker_busy_time():
    billing = Billing(memory_mb=1024, price_per_gb_s=1.0)
    streams = [{"bill": billing.charge(s)} for s in (3.0, 3.2, 2.9)]
    posts = [{"bill": billing.charge(0.01)} for _ in range(3)]
    runs = [{"started": 100.0, "ended": 103.0}, {"started": 100.1, "ended": 103.1}, {"started": 100.2, "ended": 102.9}]
    held, asynchronous = Bill.held_open(streams), Bill.asynchronous(posts, runs, billing)
    assert held.billed_s == pytest.approx(9.1)
    assert asynchronous.billed_s == pytest.approx(0.03 + 3.1)
    assert asynchronous.cost_usd < held.cost_usd
    assert held.row()["answers"] == 3


def test_the_cut_event_names_the_limit():
    (event,) = EventStreamParser().feed(cut_event(2.5))
    assert event.event == "error"
    assert f'"type": "{EXECUTION_LIMIT}"' in event.data and '"limit_s": 2.5' in event.data


def test_command_line_streams_by_default_and_checks_its_numbers():
    args = parse_args(["--upstream", "8000", "--max-duration", "2"])
    assert (args.upstream, args.block, args.max_duration, args.error_event, args.buffer_response) == (8000, 1, 2.0, False, False)
    assert args.memory_mb == 1024
    with pytest.raises(UserError):  # one line, exit 2, from the cli wrapper
        parse_args(["--upstream", "8000", "--max-duration", "0"])
    with pytest.raises(UserError):  # one line, exit 2, from the cli wrapper
        parse_args(["--upstream", "8000"])  # a platform without a limit is just a proxy
    with pytest.raises(UserError):  # one line, exit 2, from the cli wrapper
        parse_args(["--upstream", "8000", "--max-duration", "2", "--error-event", "--gzip", "flush"])
    command = platform_command("--upstream", "1")
    assert command[1:] == ["-m", "streamlab", "platform", "--port", "0", "--exit-on-stdin-eof", "--upstream", "1"]


# --------------------------------------------------------------------------
# The limit, as the reader sees it
# --------------------------------------------------------------------------


def test_a_silent_cut_looks_like_any_truncation(slow):
    trace, log = through(slow.port, max_duration=LIMIT)
    assert trace.status == 200
    assert 0 < len(trace.text_events) < BODY["max_tokens"]
    assert not trace.complete and trace.stop_reason is None and trace.error is None  # nothing says why
    (exchange,) = log
    assert exchange["outcome"] == EXECUTION_LIMIT  # not the reader leaving, though the hop closed both
    assert exchange["bill"]["billed_s"] >= LIMIT


def test_a_cut_with_the_error_event_is_recognisable(slow):
    trace, log = through(slow.port, max_duration=LIMIT, error_event=True)
    assert 0 < len(trace.text_events) < BODY["max_tokens"]
    assert not trace.complete
    assert trace.stop_reason == "error"
    assert trace.error["type"] == EXECUTION_LIMIT and trace.error["limit_s"] == LIMIT
    assert log[0]["outcome"] == EXECUTION_LIMIT


def test_the_cut_closes_the_upstream_so_the_server_stops_generating(slow):
    trace, _ = through(slow.port, max_duration=LIMIT)
    record = client.wait_log_sync(slow.port, trace.request_id, timeout=10)
    assert record["stop_signal"] is not None  # the server noticed the platform hang up
    assert record["tokens"] < BODY["max_tokens"]


def test_an_answer_within_the_limit_is_whole_and_billed(slow):
    trace, log = through(slow.port, {**BODY, "max_tokens": 5}, max_duration=30)
    assert trace.complete and trace.stop_reason is not None and len(trace.text_events) == 5
    (exchange,) = log
    assert exchange["outcome"] == COMPLETE and exchange["bill"]["billed_s"] >= exchange["seconds"] > 0


# --------------------------------------------------------------------------
# The buffering runtime
# --------------------------------------------------------------------------


def test_a_buffering_runtime_sends_the_first_event_with_the_end(slow):
    trace, log = through(slow.port, {**BODY, "max_tokens": 8}, max_duration=30, buffer_response=True)
    assert trace.complete and len(trace.text_events) == 8
    assert trace.first_text == trace.end  # every event in the one write at the end
    assert trace.first_byte == trace.chunks[0][0] and len({t for t, _ in trace.chunks}) <= 2  # head + body
    assert log[0]["mode"] == "whole response" and log[0]["writes"] == 1 and log[0]["outcome"] == COMPLETE


def test_a_buffering_runtime_cut_at_its_limit_answers_504_naming_it(slow):
    trace, log = through(slow.port, max_duration=LIMIT, buffer_response=True)
    assert trace.status == 504 and not trace.text_events
    assert trace.stop_reason == "error" and EXECUTION_LIMIT in trace.error["message"]
    assert log[0]["outcome"] == EXECUTION_LIMIT and log[0]["status"] == 504  # not an upstream error
