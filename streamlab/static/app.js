/* streamlab's page: send a prompt, watch the answer arrive as Server-Sent Events.
 *
 * No framework and no build step: the point is to see the protocol. The answer
 * arrives through the browser's own EventSource; each piece is appended to the
 * text, and the whole text is rendered as Markdown again, at most once per
 * animation frame. Partial Markdown is prepared first (an open code fence is
 * closed, a half-written table row or link is held back) so the answer does not
 * jump about while it grows. The model's text is untrusted: raw HTML in it is
 * shown as text, never run, and the rendered HTML passes an allowlist.
 *
 * A server at its limit puts the answer in line: its `queued` events say how
 * many are ahead, shown in #status as "waiting: N ahead of you" until the
 * first piece comes.
 *
 * The script is ES modules, loaded as they are (no bundler), each importing
 * only from those below it:
 *   app.js           this one: the form, the buttons and links wired, window.streamlab, the start
 *   conversation.js  the conversation shown: loaded, resumed, a new one
 *   answer.js        one turn: send, stop, resume after a reload
 *   stream.js        the EventSource: pieces, place in line, the end (finish)
 *   sidebar.js       the current conversation (#c=, localStorage) and the list of them
 *   messages.js      the live answer painted, messages as elements, how they ended
 *   markdown.js      partial Markdown held back, rendered by marked, sanitized
 *   page.js          the page's elements, the answer's state, the status line
 *   inflight.js      the answer this tab is reading, in sessionStorage
 *   http.js, words.js
 *
 * Hooks for tests: #prompt #send #stop #answer #status #history,
 * document.body.dataset.state = idle | streaming | done,
 * document.body.dataset.ahead (while the answer waits in line), and window.streamlab.
 */

import { send, stop } from "./answer.js";
import { loadConversation, newConversation } from "./conversation.js";
import { markdown, prepareMarkdown, renderFinal, renderPartial } from "./markdown.js";
import { els, setPageState, setStatus, state } from "./page.js";
import { conversationFromLocation, refreshConversations, setConversation } from "./sidebar.js";

// ------------------------------------------------------------------ wiring

els.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const prompt = els.prompt.value.trim();
  if (!prompt || !state.ended) return;
  const maxTokens = Math.max(1, parseInt(els.maxTokens.value, 10) || 200);
  els.prompt.value = "";
  send(prompt, maxTokens);
});

els.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    els.form.requestSubmit();
  }
});

els.stop.addEventListener("click", stop);
els.newConversation.addEventListener("click", newConversation);

els.conversations.addEventListener("click", (event) => {
  if (!state.ended && event.target.closest("a")) event.preventDefault(); // finish or stop first
});

window.addEventListener("hashchange", () => {
  if (!state.ended) return;
  const id = new URLSearchParams(location.hash.slice(1)).get("c");
  if (id && id !== state.conversationId) {
    setConversation(id);
    loadConversation(id);
    setStatus("Ready.");
  } else if (!id && state.conversationId) {
    newConversation();
  }
});

window.streamlab = {
  get generationId() { return state.generationId; },
  get conversationId() { return state.conversationId; },
  get pieces() { return state.pieces; },
  get text() { return state.text; },
  get end() { return state.end; },
  get ahead() { return state.ahead; },
  get state() { return els.body.dataset.state; },
  renderPartial: renderPartial,
  renderFinal: renderFinal,
  prepareMarkdown: prepareMarkdown,
};

// ------------------------------------------------------------------ start

setPageState("idle");
if (!markdown) setStatus("The Markdown renderer did not load; answers are shown as plain text.", "warn");
const initial = conversationFromLocation();
if (initial) {
  setConversation(initial);
  loadConversation(initial);
}
refreshConversations();
