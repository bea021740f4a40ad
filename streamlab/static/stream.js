/* The stream reader: the browser's own EventSource reads the answer's events
 * (its pieces, its place in the server's line, its end or error), skips pieces
 * replayed after a reconnect, and ends the answer exactly once (finish), asking
 * the server's record of the generation when the stream broke off without an
 * end event. */

import { getJSON, sleep } from "./http.js";
import { forgetInflight } from "./inflight.js";
import { markEnding, paintAnswer, scheduleRender } from "./messages.js";
import { announce, els, setPageState, setStatus, state } from "./page.js";
import { refreshConversations, setConversation } from "./sidebar.js";
import { plural, reasonInWords } from "./words.js";

function streamingStatus() {
  let text = "Streaming… " + plural(state.pieces.length, "piece") + " received";
  if (state.resumed) {
    text += " · resumed after a reload";
  } else if (state.firstPieceAt) {
    text += " · first text after " + ((state.firstPieceAt - state.sentAt) / 1000).toFixed(2) + " s";
  }
  setStatus(text);
}

/** The server's line: its place now (sent on arrival and whenever it changes). */
function onQueued(event) {
  if (state.ended || event.target !== state.source || state.firstPieceAt) return;
  let ahead;
  try {
    ahead = JSON.parse(event.data).ahead;
  } catch (err) {
    return;
  }
  if (typeof ahead !== "number") return;
  state.ahead = ahead;
  els.body.dataset.ahead = String(ahead);
  setStatus("waiting: " + ahead + " ahead of you", "wait");
}

export function clearPlace() {
  state.ahead = null;
  delete els.body.dataset.ahead;
}

function onPiece(event) {
  if (state.ended || event.target !== state.source) return;
  if (event.lastEventId) {
    if (state.seen.has(event.lastEventId)) return; // replayed after a reconnect
    state.seen.add(event.lastEventId);
  }
  let piece;
  try {
    piece = JSON.parse(event.data).text;
  } catch (err) {
    return;
  }
  if (typeof piece !== "string") return;
  if (!state.firstPieceAt) {
    state.firstPieceAt = performance.now();
    clearPlace(); // its turn came: the status line says "Streaming…" from now on
  }
  state.pieces.push(piece);
  state.text += piece;
  streamingStatus();
  scheduleRender();
}

export function openStream(url) {
  const source = new EventSource(url);
  state.source = source;
  source.onmessage = onPiece;
  source.addEventListener("queued", onQueued);
  source.addEventListener("end", (event) => {
    if (event.target !== state.source) return;
    source.close();
    let end = {};
    try { end = JSON.parse(event.data); } catch (err) { /* keep what we have */ }
    finish(end);
  });
  source.addEventListener("error", (event) => {
    if (event.target !== state.source || state.ended) return;
    if (typeof event.data === "string") {
      // The server's own `event: error`: the generation failed.
      let data = {};
      try { data = JSON.parse(event.data); } catch (err) { /* as is */ }
      const message = (data.error && data.error.message) || "error";
      source.close();
      if (data.stop_reason) finish(Object.assign({}, data, { error: message }));
      else settleFromServer(message);
    } else if (source.readyState === EventSource.CLOSED) {
      // Closed for good without an end event: ask the server how it ended.
      settleFromServer(null);
    } else {
      setStatus("Connection lost — reconnecting… (" + plural(state.pieces.length, "piece") + " so far)", "warn");
    }
  });
}

/** The stream ended without its end event: the server's record of the generation says how. */
async function settleFromServer(errorMessage) {
  const id = state.generationId;
  for (let i = 0; i < 40 && id === state.generationId && !state.ended; i++) {
    try {
      const g = await getJSON("generations/" + encodeURIComponent(id));
      if (g.stored_reason) {
        if (typeof g.text === "string" && g.text.length >= state.text.length) state.text = g.text;
        // The generation's state speaks /log's words (its stop_reason is the model's, "eos"...);
        // its stored_reason is what an end event calls stop_reason.
        finish(Object.assign({}, g, { stop_reason: g.stored_reason, error: errorMessage }));
        return;
      }
    } catch (err) { /* try again */ }
    await sleep(250);
  }
  if (!state.ended) finish({ stop_reason: "error", error: errorMessage || "the stream broke off" });
}

export function finish(end) {
  if (state.ended) return;
  state.ended = true;
  state.end = end;
  if (state.source) state.source.close();
  clearPlace();
  forgetInflight();
  if (end.conversation_id && end.conversation_id !== state.conversationId) setConversation(end.conversation_id);
  const reason = end.stop_reason || (end.error ? "error" : null);  // the stored reason, as every end event says it
  const message = end.error && typeof end.error === "object" ? end.error.message : end.error;
  paintAnswer();
  markEnding(els.liveAnswer, reason, message, end.tokens);
  if (end.message_id) els.liveAnswer.dataset.messageId = end.message_id;
  let words = reasonInWords(reason, message);
  words = words.charAt(0).toUpperCase() + words.slice(1);
  const tokens = typeof end.tokens === "number" ? " · " + plural(end.tokens, "token") : "";
  setStatus(words + tokens, reason === "completed" ? "ok" : reason === "error" ? "error" : "warn");
  announce("Answer ended: " + words + tokens);
  setPageState("done");
  refreshConversations();
}
