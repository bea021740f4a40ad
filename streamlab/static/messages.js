/* The messages on the page: the live answer painted (at most once a frame),
 * a stored message made an element, how an answer ended marked on it, and the
 * live turn moved into the history. */

import { renderFinal, renderPartial } from "./markdown.js";
import { els, state } from "./page.js";
import { plural, reasonInWords } from "./words.js";

function nearBottom() {
  const s = els.scroller;
  return s.scrollHeight - s.scrollTop - s.clientHeight < 80;
}

export function scrollToBottom() {
  els.scroller.scrollTop = els.scroller.scrollHeight;
}

export function paintAnswer() {
  const stick = nearBottom();
  els.answer.innerHTML = state.ended ? renderFinal(state.text) : renderPartial(state.text);
  if (stick) scrollToBottom();
}

/** At most one render per animation frame, however many pieces arrive in it. */
export function scheduleRender() {
  if (state.renderPending) return;
  state.renderPending = true;
  const run = () => {
    state.renderPending = false;
    paintAnswer();
  };
  // A hidden tab gets no animation frames: fall back to a timer.
  if (document.hidden) setTimeout(run, 100);
  else requestAnimationFrame(run);
}

/** Mark a message element with how it ended. */
export function markEnding(article, reason, message, tokens) {
  const badge = article.querySelector(".badge");
  article.classList.remove("incomplete", "complete", "streaming");
  article.removeAttribute("data-stop-reason");
  badge.hidden = true;
  badge.textContent = "";
  if (reason === "streaming") {
    article.classList.add("streaming");
    badge.textContent = "still being written…";
    badge.hidden = false;
  } else if (reason) {
    article.dataset.stopReason = reason;
    if (reason === "completed") {
      article.classList.add("complete");
    } else {
      article.classList.add("incomplete");
      badge.textContent = "incomplete — " + reasonInWords(reason, message);
      badge.hidden = false;
    }
  }
  const meta = article.querySelector(".meta");
  if (meta) meta.textContent = typeof tokens === "number" ? plural(tokens, "token") : "";
}

export function messageElement(message) {
  const article = document.createElement("article");
  const assistant = message.role === "assistant";
  article.className = "msg " + (assistant ? "assistant" : message.role === "user" ? "user" : "other");
  if (message.id) article.dataset.messageId = message.id;
  const role = document.createElement("div");
  role.className = "role";
  role.append(assistant ? "Model" : message.role === "user" ? "You" : String(message.role));
  const meta = document.createElement("span");
  meta.className = "meta";
  const badge = document.createElement("span");
  badge.className = "badge";
  badge.hidden = true;
  role.append(" ", meta, " ", badge);
  const content = document.createElement("div");
  if (assistant) {
    content.className = "content md";
    content.innerHTML = renderFinal(message.content || "");
  } else {
    content.className = "content plain";
    content.textContent = message.content || "";
  }
  article.append(role, content);
  if (assistant) {
    const reason = message.status === "streaming" ? "streaming" : message.stop_reason;
    markEnding(article, reason, null, message.tokens);
    if (message.incomplete && !article.classList.contains("incomplete") && reason !== "streaming") {
      article.classList.add("incomplete"); // trust the server's flag over our reading of the reason
    }
  }
  return article;
}

/** Move a finished live turn into the history, as it is (no re-render). */
export function archiveLiveTurn() {
  if (els.live.hidden) return;
  for (const node of [els.livePrompt, els.liveAnswer]) {
    const copy = node.cloneNode(true);
    copy.removeAttribute("id");
    copy.querySelectorAll("[id]").forEach((el) => el.removeAttribute("id"));
    els.history.append(copy);
  }
  els.live.hidden = true;
}

export function resetLiveTurn(prompt) {
  els.livePrompt.querySelector(".content").textContent = prompt;
  els.answer.innerHTML = "";
  markEnding(els.liveAnswer, null);
  els.live.hidden = false;
  scrollToBottom();
}
