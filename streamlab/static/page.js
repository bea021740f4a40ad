/* The page itself: its elements, the state of the answer on it, and the status line. */

const $ = (id) => document.getElementById(id);
export const els = {
  body: document.body,
  title: $("title"),
  scroller: $("scroller"),
  history: $("history"),
  live: $("live"),
  livePrompt: $("live-prompt"),
  liveAnswer: $("live-answer"),
  answer: $("answer"),
  form: $("composer"),
  prompt: $("prompt"),
  maxTokens: $("max-tokens"),
  send: $("send"),
  stop: $("stop"),
  status: $("status"),
  announce: $("announce"),
  conversations: $("conversations"),
  newConversation: $("new"),
};

/** The answer on the page (one at a time), shared by the modules: answer.js begins a turn, stream.js ends it. */
export const state = {
  conversationId: null,
  generationId: null,
  source: null,
  text: "",
  pieces: [],
  seen: new Set(),
  end: null,
  ended: true,
  stopRequested: false,
  sentAt: 0,
  firstPieceAt: 0,
  ahead: null, // readers ahead of this answer in the server's line; null when not waiting
  renderPending: false,
  poll: null,
};

export function setPageState(name) {
  els.body.dataset.state = name;
  const streaming = name === "streaming";
  els.send.disabled = streaming;
  els.newConversation.disabled = streaming;
  els.answer.setAttribute("aria-busy", streaming ? "true" : "false");
  if (!streaming) els.stop.disabled = true;
}

export function setStatus(text, kind) {
  els.status.textContent = text;
  els.status.dataset.kind = kind || "";
}

/** For screen readers: said once, not at every piece. */
export function announce(text) {
  els.announce.textContent = text;
}
