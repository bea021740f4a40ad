/* One turn: send a prompt (POST /generations, then read its events), stop it
 * (the server stops generating; the end event says when), and resume the
 * answer this tab was reading when it was reloaded. */

import { errorText } from "./http.js";
import { rememberInflight } from "./inflight.js";
import { archiveLiveTurn, resetLiveTurn } from "./messages.js";
import { announce, els, setPageState, setStatus, state } from "./page.js";
import { refreshConversations, setConversation } from "./sidebar.js";
import { clearPlace, finish, openStream } from "./stream.js";
import { plural } from "./words.js";

function beginTurn(prompt) {
  announce("The answer is being written.");
  Object.assign(state, {
    generationId: null, source: null, text: "", pieces: [], seen: new Set(), end: null,
    ended: false, stopRequested: false, resumed: false, sentAt: performance.now(), firstPieceAt: 0,
  });
  clearPlace();
  resetLiveTurn(prompt);
  setPageState("streaming");
}

/**
 * This tab was reading an answer when it was reloaded. The server kept the
 * answer's events (and went on generating for a grace period), so a new
 * EventSource gets all of them again, from the first, then the live ones.
 */
export function resume(inflight) {
  beginTurn(inflight.prompt || "");
  state.resumed = true;
  state.generationId = inflight.generationId;
  if (inflight.messageId) els.liveAnswer.dataset.messageId = inflight.messageId;
  setStatus("Resuming the answer…");
  els.stop.disabled = false;
  openStream(inflight.events || "generations/" + encodeURIComponent(inflight.generationId) + "/events");
}

export async function send(prompt, maxTokens) {
  if (!state.ended) return;
  clearTimeout(state.poll);
  archiveLiveTurn();
  beginTurn(prompt);
  setStatus("Sending…");
  const body = { prompt: prompt, max_tokens: maxTokens, chat: true };
  if (state.conversationId) body.conversation_id = state.conversationId;
  let created;
  try {
    const response = await fetch("generations", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify(body),
    });
    if (!response.ok) throw new Error(await errorText(response));
    created = await response.json();
  } catch (err) {
    finish({ stop_reason: "error", error: err.message || String(err) });
    return;
  }
  state.generationId = created.id;
  if (created.conversation_id) setConversation(created.conversation_id);
  if (created.message_id) els.liveAnswer.dataset.messageId = created.message_id;
  rememberInflight({
    generationId: created.id,
    conversationId: created.conversation_id,
    messageId: created.message_id,
    events: created.events,
    prompt: prompt,
  });
  setStatus("Waiting for the first piece…");
  refreshConversations(); // a new conversation has a title now
  els.stop.disabled = false;
  openStream(created.events || "generations/" + encodeURIComponent(created.id) + "/events");
  if (state.stopRequested) stop();
}

/** The stop button: ask the server to stop generating. The end event says when it has. */
export async function stop() {
  if (state.ended) return;
  state.stopRequested = true;
  els.stop.disabled = true;
  if (!state.generationId) return; // send() cancels as soon as it knows the id
  setStatus("Stopping… (" + plural(state.pieces.length, "piece") + " received)");
  try {
    // The URL says it all, but the server takes no POST that is not JSON (415), so: {} as JSON.
    const response = await fetch("generations/" + encodeURIComponent(state.generationId) + "/cancel", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: "{}",
    });
    if (!response.ok && !state.ended) setStatus("Stop: " + (await errorText(response)), "warn");
  } catch (err) {
    if (!state.ended) setStatus("Stop failed: " + err.message, "error");
  }
}
