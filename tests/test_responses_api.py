"""``POST /v1/responses``: OpenAI's Responses API, read by the openai SDK (Python and npm), over the fake model.

What must hold: the typed events come in the API's order, numbered from 0
with no gap; the SDK reads the stream and the whole response unchanged; the
length limit is ``response.incomplete`` with its reason, a failure is
``response.failed``, never a short answer; closing the stream early stops
the generation within a few tokens; a reader in line is told so in the API's
own word; and the route keeps the house rules (a 400 in OpenAI's shape that
names the field, the store, ``/log``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import httpx
import openai
import pytest

from fakes import DEFAULT_SCRIPT
from streamlab.client import timed as client
from streamlab.lab.outside.node import NODE_PREFIX, openai_sdk

pytestmark = pytest.mark.timeout(120)

OPENING = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def sdk(app) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{app.url}/v1", api_key="unused", max_retries=0)


def events_of(app, **body) -> list[dict]:
    """The stream's events as sent: (SSE event name, data) pairs, read over a plain socket."""
    trace = client.post_sync(app.port, "/v1/responses", {"input": "Say hello.", "stream": True, **body})
    assert trace.status == 200
    return trace


def test_the_sdk_reads_the_typed_events_in_order_numbered_without_a_gap(app):
    events = list(sdk(app).responses.create(model="fake", input="Say hello.", max_output_tokens=200, stream=True))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == [*OPENING, *["response.output_text.delta"] * len(deltas), *CLOSING, "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in deltas) == DEFAULT_SCRIPT
    final = events[-1].response
    assert final.status == "completed" and final.output_text == DEFAULT_SCRIPT and final.incomplete_details is None
    log = app.logs()[-1]
    assert log["path"] == "/v1/responses" and log["stored_reason"] == "completed"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (log["prompt_tokens"], log["tokens"])
    assert events[-2].item.status == "completed" and events[-4].text == DEFAULT_SCRIPT  # the done events, whole


def test_the_whole_response_is_the_final_object(app):
    response = sdk(app).responses.create(model="fake", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Say hello."}]}], instructions="Be brief.", max_output_tokens=200)
    assert response.object == "response" and response.status == "completed"
    assert response.output_text == DEFAULT_SCRIPT and response.output[0].role == "assistant"
    assert response.usage.output_tokens == app.logs()[-1]["tokens"]


def test_the_length_limit_is_incomplete_with_its_reason(app):
    events = list(sdk(app).responses.create(model="fake", input="Say hello.", max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == DEFAULT_SCRIPT[:5]
    whole = sdk(app).responses.create(model="fake", input="Say hello.", max_output_tokens=5)
    assert (whole.status, whole.incomplete_details.reason, whole.output_text) == ("incomplete", "max_output_tokens",
                                                                                 DEFAULT_SCRIPT[:5])


def test_a_failure_mid_stream_is_response_failed_not_a_short_answer(apps):
    failing = apps(fail_after=5)
    events = list(sdk(failing).responses.create(model="fake", input="Say hello.", max_output_tokens=50, stream=True))
    assert events[-1].type == "response.failed" and "generation failed" in events[-1].response.error.message
    assert not any(e.type in ("response.completed", "response.output_text.done") for e in events)
    trace = events_of(failing, max_output_tokens=50)
    assert trace.stop_reason == "error" and not trace.complete  # our own reader says so too
    with pytest.raises(openai.InternalServerError):  # whole: a 500 in OpenAI's shape, no partial text
        sdk(failing).responses.create(model="fake", input="Say hello.", max_output_tokens=50)


def test_closing_the_stream_early_stops_the_generation(apps):
    slow = apps(decode_seconds=0.02)
    stream = sdk(slow).responses.create(model="fake", input="Say hello.", max_output_tokens=400, stream=True)
    seen = 0
    for event in stream:
        seen += event.type == "response.output_text.delta"
        if seen == 3:
            break
    stream.close()
    record = client.wait_log_sync(slow.port, slow.logs()[-1]["id"])
    assert record["client_left"] and record["stored_reason"] == "client_left"
    # The reader's close reaches a server watching for EOF within a token or two (chapter 5's bound, 2).
    assert record["tokens_at_stop"] <= 3 + 2 and record["tokens"] <= record["tokens_at_stop"] + 1


def test_a_reader_in_line_is_told_in_the_apis_word(apps):
    one = apps(max_active=1, decode_seconds=0.01, ping_interval=0.05)
    holder = threading.Thread(target=lambda: client.post_sync(one.port, "/stream", {"prompt": "x", "max_tokens": 60,
                                                                                      "ignore_eos": True}))
    holder.start()
    deadline = time.monotonic() + 10
    while not any(not r["done"] for r in one.logs()) and time.monotonic() < deadline:
        time.sleep(0.01)
    trace = events_of(one, max_output_tokens=4)
    holder.join(20)
    names = [e.kind for e in trace.events if e.kind != "ping"]
    assert names[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert trace.events[0].data["response"]["status"] == "queued"
    assert names.count("response.created") == 1 and trace.complete and trace.text == DEFAULT_SCRIPT[:4]


def test_refusals_are_400s_in_openais_shape_that_name_the_field(app):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(app).responses.create(model="fake", input="Hi", previous_response_id="resp_1")
    assert "previous_response_id" in caught.value.message and caught.value.body["type"] == "invalid_request_error"
    typo = httpx.post(f"{app.url}/v1/responses", json={"input": "Hi", "max_output_token": 3})
    assert typo.status_code == 400 and "max_output_tokens" in typo.json()["error"]["message"]
    tools = httpx.post(f"{app.url}/v1/responses", json={"input": "Hi", "tools": [{"type": "web_search"}]})
    assert tools.status_code == 400 and tools.json()["error"]["param"] is None
    ignored = httpx.post(f"{app.url}/v1/responses", json={"input": "Hi", "store": False, "max_output_tokens": 2})
    assert ignored.status_code == 200 and ignored.headers["x-ignored-fields"] == "store"


def test_the_answer_is_stored_like_every_other(app):
    response = sdk(app).responses.create(model="fake", input="Remember the lighthouse.", max_output_tokens=200)
    record = app.logs()[-1]
    conversation = client.get_json_sync(app.port, f"/conversations/{record['conversation_id']}")
    texts = [m["content"] for m in conversation["messages"]]
    assert texts == ["Remember the lighthouse.", response.output_text]


NODE_READER = """
import OpenAI from "openai";
const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 0 });
const stream = await client.responses.create({ model: "fake", input: "Say hello.", max_output_tokens: 200,
                                               stream: true });
const kinds = [], seq = []; let text = "";
for await (const event of stream) {
  kinds.push(event.type); seq.push(event.sequence_number);
  if (event.type === "response.output_text.delta") text += event.delta;
}
console.log(JSON.stringify({ kinds, seq, text }));
"""


@pytest.fixture(scope="session")
def openai_npm() -> str:
    """The npm ``openai`` SDK, installed into the cache's ``node/`` on first use (the chapters' own installer)."""
    if shutil.which("node") is None:
        pytest.skip("needs node (the npm openai SDK runs under Node)")
    modules, why_not = openai_sdk()
    if modules is None:
        pytest.skip(why_not)
    return str(modules)


@pytest.mark.timeout(300)  # the first run installs the npm package
def test_the_npm_sdk_reads_the_stream_unchanged(app, openai_npm, tmp_path):
    script = NODE_PREFIX / f"responses-reader-{tmp_path.name}.mjs"  # beside node_modules, where imports resolve
    script.write_text(NODE_READER)
    try:
        done = subprocess.run(["node", str(script), f"{app.url}/v1"], capture_output=True, text=True, timeout=60)
    finally:
        script.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-2000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read["text"] == DEFAULT_SCRIPT and read["seq"] == list(range(len(read["kinds"])))
    assert read["kinds"][:4] == OPENING and read["kinds"][-1] == "response.completed"
