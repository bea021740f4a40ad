"""What the page runs in chapter 15: the fetch reader written out, and the experiments around it, as JavaScript.

Three scripts, each run in our server's own page (``/``, with its modules and
``marked`` loaded) by :mod:`streamlab.lab.experiments.page_reader`:

- ``READER``: an event stream read with ``fetch``: bytes, ``TextDecoder``,
  lines, events. The chapter shows it; the two scripts below use it.
- ``NETWORK``: everything that waits on the network, started at once: the
  split character decoded with and without ``{stream: true}``, six ways to
  stop an answer, an error mid-stream, and what each reader does after a
  stream ends or breaks off. Results go to ``window.lab``.
- ``PAGE``: what needs the page to itself, one after another: the course
  page shown an answer that fails, and partial Markdown rendered at every
  piece, with the page's preparation and without, timed by ``performance.now()``.

Every script is called with one argument (the sizes, and the page server's
URL) and sets ``window.lab.finished`` when it is done.
"""

from __future__ import annotations

__all__ = ["NETWORK", "PAGE", "READER"]

#: The fetch reader, written out: what EventSource does inside, with the decoder's one option in view.
READER = """
/** Read an event stream from a fetch response: bytes -> text -> lines -> events (name, data). */
async function readEvents(response, onEvent, { stream = true, onRead = () => {} } = {}) {
  const reader = response.body.getReader();        // the body as it arrives: one Uint8Array per read
  const decoder = new TextDecoder("utf-8");        // bytes -> text; bytes that make no character -> U+FFFD
  let rest = "", name = "message", data = [];
  for (;;) {
    const { value, done } = await reader.read();   // rejects if the body breaks off or the fetch is aborted
    if (done) break;
    onRead(value);
    // {stream: true}: a character cut at the end of this read waits for the next one instead of breaking.
    const lines = (rest + decoder.decode(value, { stream })).split(/\\r\\n|\\r|\\n/);
    rest = lines.pop();                            // the last line may be half: keep it for the next read
    for (const line of lines) {
      if (line === "") {                           // a blank line: the event is whole, hand it over
        if (data.length) onEvent(name, data.join("\\n"));
        name = "message";
        data = [];
      } else if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }                                              // (id:, retry: and comments are left out here)
  }
}
"""

_COMMON = """
const A = arguments[0];
window.lab = { results: {}, finished: false };
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const post = (path, body, signal) => fetch(path, {
  method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal });
const ask = { prompt: A.prompt, max_tokens: A.maxTokens };
async function all(tasks) {
  await Promise.all(Object.entries(tasks).map(async ([name, task]) => {
    try { window.lab.results[name] = await task(); }
    catch (err) { window.lab.results[name] = { failed: String((err && err.stack) || err) }; }
  }));
  window.lab.finished = true;
}
"""

#: Everything that waits on the network, all at once.
NETWORK = READER + _COMMON + """
/** Whether a read's bytes end inside a character: its last lead byte wants more bytes than follow it. */
function endsInsideCharacter(bytes) {
  for (let i = bytes.length - 1; i >= Math.max(0, bytes.length - 4); i--) {
    const b = bytes[i];
    if ((b & 0xC0) === 0x80) continue;             // a continuation byte: look further back
    const wants = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    return bytes.length - i < wants;
  }
  return false;
}

async function split(stream) {
  const out = { reads: 0, cut_reads: 0, bytes: 0, text: "", events: 0 };
  const response = await fetch(A.page + "/split?decoder=" + (stream ? "stream" : "plain"));
  await readEvents(response, (name, data) => {
    out.events++;
    if (name === "message") out.text += JSON.parse(data).text;
  }, { stream, onRead: (bytes) => { out.reads++; out.bytes += bytes.length; if (endsInsideCharacter(bytes)) out.cut_reads++; } });
  out.replacement = Array.from(out.text).filter((c) => c === "\\uFFFD").length;
  return out;
}

// -- the stop button, six ways; each stops after A.stopAfter pieces ---------------------------------------

async function fetchAbort() {
  const controller = new AbortController();
  const response = await post("stream", ask, controller.signal);
  const out = { request_id: response.headers.get("X-Request-Id"), pieces: 0, said: "read to the end" };
  try {
    await readEvents(response, (name, data) => {
      if (name !== "message" || data === "[DONE]" || controller.signal.aborted) return;
      if (++out.pieces === A.stopAfter) controller.abort();          // the stop button
    });
  } catch (err) { out.said = err.name; }                               // AbortError
  return out;
}

async function sdkAbort() {
  const { default: OpenAI } = await import(A.page + "/npm/openai/index.mjs");
  const client = new OpenAI({ baseURL: location.origin + "/v1", apiKey: "unused", dangerouslyAllowBrowser: true,
                              maxRetries: 0 });
  const controller = new AbortController();
  const { data: stream, request_id } = await client.chat.completions.create(
    { model: "scripted", messages: [{ role: "user", content: A.prompt }], max_tokens: A.maxTokens, stream: true },
    { signal: controller.signal }).withResponse();
  const out = { request_id, pieces: 0, said: "the loop ended" };
  try {
    for await (const chunk of stream) {
      if (!chunk.choices?.[0]?.delta?.content || controller.signal.aborted) continue;
      if (++out.pieces === A.stopAfter) controller.abort();          // the stop button
    }
  } catch (err) { out.said = err.constructor.name; }
  out.aborted = controller.signal.aborted;
  return out;
}

function webSocket(how) {
  return new Promise((resolve) => {
    const ws = new WebSocket(`ws://${location.host}/ws`);
    const out = { request_id: null, pieces: 0, late: 0, said: null };
    ws.onopen = () => ws.send(JSON.stringify(ask));
    ws.onmessage = (message) => {
      const m = JSON.parse(message.data);
      if (typeof m.text === "string") {
        if (out.said) { out.late++; return; }                          // a piece that was on its way
        if (++out.pieces < A.stopAfter) return;
        out.said = how;
        if (how === "close") { ws.close(1000); resolve(out); }         // the stop button: hang up
        else ws.send(JSON.stringify({ stop: true }));                  // the stop button: say so
      } else if (m.done || m.error) { out.request_id = m.id; out.end = m.stop_reason; ws.close(1000); resolve(out); }
    };
    ws.onclose = () => resolve(out);
  });
}

async function eventSourceClose() {
  const created = await (await post("generations", ask)).json();
  return new Promise((resolve) => {
    const source = new EventSource(created.events);
    const out = { generation_id: created.id, pieces: 0, said: "closed" };
    source.onmessage = () => { if (++out.pieces === A.stopAfter) { source.close(); resolve(out); } };  // the stop button
  });
}

async function coursePageStop() {                                       // the course page's own Stop button
  const $ = (id) => document.getElementById(id);
  $("max-tokens").value = String(A.maxTokens);
  $("prompt").value = A.prompt;
  $("composer").requestSubmit();
  while (window.streamlab.pieces.length < A.stopAfter) await sleep(2);
  const out = { pieces: window.streamlab.pieces.length };
  $("stop").click();
  while (window.streamlab.state !== "done") await sleep(10);
  return Object.assign(out, { generation_id: window.streamlab.generationId, end: window.streamlab.end.stop_reason,
                              shown: window.streamlab.pieces.length });
}

// -- an error mid-stream, read two ways -----------------------------------------------------------------------

async function failing(careful) {
  const response = await fetch(A.page + "/fails?after=" + A.failAfter + "&reader=" + (careful ? "events" : "text"));
  const out = { pieces: 0, shown: null };
  if (!careful) {                                                       // reads text and nothing else
    await readEvents(response, (name, data) => { if (typeof JSON.parse(data).text === "string") out.pieces++; });
    out.shown = "a complete answer";                                    // the body ended, so it thinks the answer did
    return out;
  }
  await readEvents(response, (name, data) => {
    const d = JSON.parse(data);
    if (name === "message") out.pieces++;
    else if (name === "end") out.shown = "a complete answer";
    else if (name === "error") out.shown = "an error: " + d.error.message;
  });
  out.shown = out.shown || "an answer cut off";                         // neither end nor error: say so
  return out;
}

// -- after the end: who reconnects ------------------------------------------------------------------------

function watchSource(url, extra) {
  return new Promise((resolve) => {
    const out = Object.assign({ url: new URL(url, location.href).href, opens: 0, pieces: 0, ends: 0, errors: 0,
                                closed_by: null }, extra);
    const source = new EventSource(url);
    const finish = (who) => { if (!out.closed_by) { out.closed_by = who; source.close(); resolve(out); } };
    source.onopen = () => { if (++out.opens >= A.maxOpens) finish("the page"); };
    source.onmessage = () => { out.pieces++; };
    source.addEventListener("end", () => { out.ends++; });
    source.onerror = () => { out.errors++; if (source.readyState === EventSource.CLOSED) finish("the browser"); };
    setTimeout(() => finish("the page"), A.watchMs);                  // a bound: the browser stops it long before
  });
}

async function fetchOnce(url, init) {
  const out = { url: new URL(url, location.href).href, pieces: 0, said: "read to the end" };
  try {
    await readEvents(await fetch(url, init), (name, data) => { if (name === "message" && data !== "[DONE]") out.pieces++; });
  } catch (err) { out.said = err.name; }
  await sleep(A.waitMs);                                                // time enough to come back, if it would
  return out;
}

all({
  split_plain: () => split(false),
  split_stream: () => split(true),
  stop_fetch: fetchAbort,
  stop_sdk: sdkAbort,
  stop_ws_message: () => webSocket("stop message"),
  stop_ws_close: () => webSocket("close"),
  stop_eventsource: eventSourceClose,
  stop_page: coursePageStop,
  fails_text: () => failing(false),
  fails_events: () => failing(true),
  again_eventsource_end: async () => {
    const created = await (await post("generations", { prompt: A.prompt, max_tokens: A.endTokens })).json();
    return watchSource(created.events, { generation_id: created.id });
  },
  again_eventsource_404: () => watchSource("generations/no-such-answer/events", {}),
  again_eventsource_cut: () => watchSource(A.page + "/cut?reader=eventsource", {}),
  again_fetch_end: () => fetchOnce("stream?reader=fetch", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: A.prompt, max_tokens: A.endTokens }) }),
  again_fetch_cut: () => fetchOnce(A.page + "/cut?reader=fetch"),
});
"""

#: What needs the page to itself: the course page's reader shown a failure, then partial Markdown at every piece.
PAGE = READER + _COMMON + """
const MARKS = { "`": "stray backticks", "|": "a table shown as pipes", "[": "a half link", "**": "stray asterisks" };

/** What of the answer's structure shows broken in rendered HTML: its marks left in the text, outside code. */
function broken(html) {
  const template = document.createElement("template");
  template.innerHTML = html;
  template.content.querySelectorAll("pre, code").forEach((element) => element.remove());
  const text = template.content.textContent;
  return Object.keys(MARKS).filter((mark) => text.includes(mark)).map((mark) => MARKS[mark]);
}

async function coursePageFailure() {
  const { resume } = await import("/static/answer.js");               // the course page's own modules
  resume({ prompt: A.prompt, generationId: "failing", events: A.page + "/fails?after=" + A.failAfter + "&reader=page" });
  while (window.streamlab.state !== "done") await sleep(10);
  const answer = document.getElementById("live-answer"), status = document.getElementById("status");
  return { pieces: window.streamlab.pieces.length, status: status.textContent, kind: status.dataset.kind || "",
           stop_reason: answer.dataset.stopReason || "", badge: answer.querySelector(".badge").textContent };
}

async function markdownRenders() {
  const { markdown, renderFinal, renderPartial } = await import("/static/markdown.js");
  const pieces = [];
  await readEvents(await fetch(A.page + "/markdown"), (name, data) => {
    if (name === "message") pieces.push(JSON.parse(data).text);
  });
  const out = { pieces: pieces.length, prepared: [], raw: [], final: broken(renderFinal(pieces.join(""))) };
  let text = "";
  for (const piece of pieces) {
    text += piece;
    out.prepared.push(broken(renderPartial(text)));                    // what the page shows
    out.raw.push(broken(markdown.parse(text)));                        // the same text rendered as it stands
  }
  // The cost: an answer of A.costPieces pieces (the answer again and again), rendered whole after every piece.
  const box = document.createElement("div");
  document.body.append(box);
  const times = { prepared: [], raw: [] };
  for (const [way, render] of [["prepared", renderPartial], ["raw", (t) => markdown.parse(t)]]) {
    text = "";
    for (let i = 0; i < A.costPieces; i++) {
      text += pieces[i % pieces.length];
      const started = performance.now();
      box.innerHTML = render(text);
      times[way].push(performance.now() - started);
    }
  }
  box.remove();
  out.cost = { pieces: A.costPieces, chars: text.length, ms: times };
  return out;
}

(async () => {
  const results = window.lab.results;
  try { results.fails_page = await coursePageFailure(); } catch (err) { results.fails_page = { failed: String(err) }; }
  try { results.markdown = await markdownRenders(); } catch (err) { results.markdown = { failed: String(err.stack || err) }; }
  window.lab.finished = true;
})();
"""
