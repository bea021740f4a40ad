/* The conversation shown: its messages loaded into #history, an answer this
 * tab was reading resumed, one another tab is writing looked at again until it
 * ends; and a new, empty conversation. */

import { resume } from "./answer.js";
import { getJSON } from "./http.js";
import { forgetInflight, recallInflight } from "./inflight.js";
import { messageElement, scrollToBottom } from "./messages.js";
import { els, setStatus, state } from "./page.js";
import { setConversation } from "./sidebar.js";

export async function loadConversation(id, attempt) {
  clearTimeout(state.poll);
  let conversation;
  try {
    conversation = await getJSON("conversations/" + encodeURIComponent(id));
  } catch (err) {
    if (err.status === 404) {
      setConversation(null);
      els.history.replaceChildren();
      setStatus("That conversation no longer exists; this is a new one.");
      return;
    }
    setStatus("Could not load the conversation: " + err.message, "error");
    return;
  }
  if (state.conversationId !== id || !state.ended) return; // moved on meanwhile
  let messages = conversation.messages || [];
  const inflight = recallInflight();
  let resuming = null;
  if (inflight && inflight.conversationId === id) {
    const at = messages.findIndex((m) => m.id === inflight.messageId);
    if (at >= 0 && messages[at].status === "streaming") {
      // Its prompt and answer go to the live turn, not the history.
      const start = at > 0 && messages[at - 1].role === "user" ? at - 1 : at;
      messages = messages.slice(0, start).concat(messages.slice(at + 1));
      resuming = inflight;
    } else {
      forgetInflight();
    }
  }
  els.history.replaceChildren(...messages.map(messageElement));
  els.live.hidden = true;
  scrollToBottom();
  if (resuming) {
    resume(resuming);
    return;
  }
  // An answer still being written, read by another tab or by none: look
  // again until the server has closed it.
  const writing = (conversation.messages || []).some((m) => m.status === "streaming");
  if (writing && (attempt || 0) < 60) {
    state.poll = setTimeout(() => loadConversation(id, (attempt || 0) + 1), 1000);
  }
}

export function newConversation() {
  if (!state.ended) return;
  clearTimeout(state.poll);
  setConversation(null);
  els.history.replaceChildren();
  els.live.hidden = true;
  setStatus("Ready.");
  els.prompt.focus();
}
