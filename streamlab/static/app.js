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
 * Hooks for tests: #prompt #send #stop #answer #status #history,
 * document.body.dataset.state = idle | streaming | done,
 * document.body.dataset.ahead (while the answer waits in line), and window.streamlab.
 */
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
  const els = {
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

  const STORAGE_KEY = "streamlab.conversation";
  const INFLIGHT_KEY = "streamlab.inflight"; // per tab: the answer this tab was reading

  // ------------------------------------------------------------------ words

  const REASONS = {
    completed: "completed",
    stopped: "stopped by you",
    max_tokens: "cut off: token limit",
    client_left: "cut off: the reader left",
    slow_reader: "cut off: the reader fell too far behind",
    interrupted: "interrupted",
    error: "failed",
  };

  function reasonInWords(reason, message) {
    if (reason === "error") return message ? "failed: " + message : "failed";
    return REASONS[reason] || (reason ? String(reason) : "ended");
  }

  function plural(n, word) {
    return n + " " + word + (n === 1 ? "" : "s");
  }

  // --------------------------------------------------------------- Markdown

  const FENCE = /^\s*(`{3,}|~{3,})(.*)$/;
  const PARTIAL_FENCE = /^\s*(`{1,2}|~{1,2})$/;
  const SETEXT_OR_RULE = /^ {0,3}(-+|=+)\s*$/;
  const TABLE_ROW = /^\s*\|/;

  /** The code fence still open at the end of these lines, or null. */
  function openFence(lines) {
    let open = null;
    for (const line of lines) {
      const m = FENCE.exec(line);
      if (!m) continue;
      const marks = m[1];
      if (open) {
        if (marks[0] === open[0] && marks.length >= open.length && m[2].trim() === "") open = null;
      } else if (!(marks[0] === "`" && m[2].includes("`"))) {
        open = marks; // a backtick fence's info string may not contain a backtick
      }
    }
    return open;
  }

  function cellCount(row) {
    return row.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").length;
  }

  function isDelimiterRow(row, cells) {
    return (
      /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/.test(row) &&
      /\|\s*$/.test(row) &&
      cellCount(row) === cells
    );
  }

  /** Hold back a table that is still being written, up to its last whole row. */
  function holdBackTable(lines) {
    let start = lines.length;
    while (start > 0 && TABLE_ROW.test(lines[start - 1])) start--;
    let run = lines.length - start;
    if (run === 0) return;
    // The last row is being written until it ends with a pipe and has all its cells.
    const last = lines[lines.length - 1];
    if (!/\|\s*$/.test(last) || (run > 1 && cellCount(last) < cellCount(lines[start]))) {
      lines.pop();
      run--;
    }
    // A header alone, or a header whose delimiter row is not whole yet, would
    // show as a paragraph of pipes and then jump into a table: wait for it.
    if (run === 1 || (run === 2 && !isDelimiterRow(lines[start + 1], cellCount(lines[start])))) {
      lines.length = start;
    }
  }

  /** Inline markup left open at the very end: a link, a code span, bold. */
  function closeInline(line) {
    const ticks = (line.match(/`/g) || []).length;
    if (ticks % 2 === 1) {
      // Inside a code span (where brackets are literal): close it, or wait for its first character.
      return /`$/.test(line) ? line.slice(0, -1) : line + "`";
    }
    line = line
      .replace(/!?\[([^\[\]\n]*)\]\([^()\s]*(\s+"[^"]*"?)?$/, "$1") // [text](http://exa
      // a bracket after a word is more likely an index, arr[i], than a link: leave it
      .replace(/(^|[\s(])!?\[([^\[\]\n]*)\]$/, "$1$2") // [text]
      .replace(/(^|[\s(])!?\[([^\[\]\n]*)$/, "$1$2"); // [tex
    const strong = (line.match(/\*\*/g) || []).length;
    if (strong % 2 === 1) line = /\*\*\s*$/.test(line) ? line.replace(/\*\*\s*$/, "") : line + "**";
    return line;
  }

  /**
   * Markdown source ready to render. Always: an open code fence is closed (a
   * stopped answer may end inside one). While partial: what is half written at
   * the end is held back or closed, so that rendering it now and rendering it
   * whole later look the same where they overlap.
   */
  function prepareMarkdown(text, partial) {
    let lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    if (partial) {
      while (lines.length && lines[lines.length - 1].trim() === "") lines.pop();
      if (lines.length && PARTIAL_FENCE.test(lines[lines.length - 1])) lines.pop();
    }
    const fence = openFence(lines);
    if (partial && !fence && lines.length) {
      // "Items:\n-" is a setext heading until the list item's text arrives.
      if (SETEXT_OR_RULE.test(lines[lines.length - 1])) lines.pop();
      holdBackTable(lines);
      const last = lines.length - 1;
      if (last >= 0 && !FENCE.test(lines[last])) lines[last] = closeInline(lines[last]);
    }
    let source = lines.join("\n");
    if (fence) source += "\n" + fence;
    return source;
  }

  function escapeHtml(text) {
    return String(text)
      .replace(/&/g, "&amp;")
      .replace(/</g, "&lt;")
      .replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;")
      .replace(/'/g, "&#39;");
  }

  /** The URL if it is one a reader may follow (http, https, mailto, or relative), else null. */
  function safeUrl(href) {
    if (!href) return null;
    try {
      const url = new URL(href, location.href);
      return ["http:", "https:", "mailto:"].includes(url.protocol) ? href : null;
    } catch (err) {
      return null;
    }
  }

  const markdown =
    window.marked && window.marked.Marked
      ? new window.marked.Marked({
          gfm: true,
          breaks: false,
          async: false,
          renderer: {
            // Raw HTML in the model's text is shown as text.
            html(token) {
              const text = escapeHtml(token.text);
              return token.block ? '<p class="raw-html">' + text + "</p>" : text;
            },
            link(token) {
              const inner = this.parser.parseInline(token.tokens);
              const href = safeUrl(token.href);
              if (!href) return inner;
              const title = token.title ? ' title="' + escapeHtml(token.title) + '"' : "";
              return (
                '<a href="' + escapeHtml(href) + '"' + title +
                ' rel="nofollow noopener noreferrer" target="_blank">' + inner + "</a>"
              );
            },
            // An image would be fetched from wherever the text says: show a link instead.
            image(token) {
              const alt = escapeHtml(token.text || "image");
              const href = safeUrl(token.href);
              if (!href) return alt;
              return (
                '<a class="image-link" href="' + escapeHtml(href) +
                '" rel="nofollow noopener noreferrer" target="_blank">[image: ' + alt + "]</a>"
              );
            },
          },
        })
      : null;

  const ALLOWED = {
    A: ["href", "title", "rel", "target", "class"],
    BLOCKQUOTE: [], BR: [], CODE: ["class"], DEL: [], EM: [], HR: [],
    H1: [], H2: [], H3: [], H4: [], H5: [], H6: [],
    INPUT: ["type", "checked", "disabled"], LI: [], OL: ["start"], P: ["class"], PRE: [],
    STRONG: [], TABLE: [], TBODY: [], TD: ["align"], TH: ["align"], THEAD: [], TR: [], UL: [],
  };

  /** Defence in depth: whatever the renderer let through, keep only these elements and attributes. */
  function sanitize(html) {
    const template = document.createElement("template");
    template.innerHTML = html; // an inert document: nothing loads, nothing runs
    const elements = Array.from(template.content.querySelectorAll("*"));
    for (const el of elements) {
      const allowed = ALLOWED[el.tagName];
      if (!allowed) {
        el.replaceWith(document.createTextNode(el.textContent || ""));
        continue;
      }
      for (const attr of Array.from(el.attributes)) {
        if (!allowed.includes(attr.name)) el.removeAttribute(attr.name);
      }
      if (el.tagName === "A" && el.hasAttribute("href") && !safeUrl(el.getAttribute("href"))) {
        el.removeAttribute("href");
      }
      if (el.tagName === "INPUT" && el.getAttribute("type") !== "checkbox") el.remove();
    }
    return template.innerHTML;
  }

  function render(text, partial) {
    const source = prepareMarkdown(text, partial);
    try {
      if (!markdown) throw new Error("marked is not loaded");
      return sanitize(markdown.parse(source));
    } catch (err) {
      console.warn("streamlab: Markdown rendering failed, showing plain text", err);
      return '<p class="plain">' + escapeHtml(text) + "</p>";
    }
  }

  /** HTML for text that is still arriving. Never throws. */
  function renderPartial(text) {
    return render(text, true);
  }

  /** HTML for text that has ended (completely or not). Never throws. */
  function renderFinal(text) {
    return render(text, false);
  }

  // ------------------------------------------------------------------ state

  const state = {
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

  function setPageState(name) {
    els.body.dataset.state = name;
    const streaming = name === "streaming";
    els.send.disabled = streaming;
    els.newConversation.disabled = streaming;
    els.answer.setAttribute("aria-busy", streaming ? "true" : "false");
    if (!streaming) els.stop.disabled = true;
  }

  function setStatus(text, kind) {
    els.status.textContent = text;
    els.status.dataset.kind = kind || "";
  }

  /** For screen readers: said once, not at every piece. */
  function announce(text) {
    els.announce.textContent = text;
  }

  function setConversation(id) {
    state.conversationId = id || null;
    if (id) {
      history.replaceState(null, "", "#c=" + encodeURIComponent(id));
      try { localStorage.setItem(STORAGE_KEY, id); } catch (err) { /* private mode */ }
    } else {
      history.replaceState(null, "", location.pathname + location.search);
      try { localStorage.removeItem(STORAGE_KEY); } catch (err) { /* private mode */ }
    }
    markCurrentConversation();
  }

  function conversationFromLocation() {
    const fromHash = new URLSearchParams(location.hash.slice(1)).get("c");
    if (fromHash) return fromHash;
    try { return localStorage.getItem(STORAGE_KEY); } catch (err) { return null; }
  }

  // ------------------------------------------------------------------- HTTP

  async function errorText(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (err) { /* not JSON */ }
    return "HTTP " + response.status;
  }

  async function getJSON(path) {
    const response = await fetch(path, { headers: { Accept: "application/json" } });
    if (!response.ok) {
      const err = new Error(await errorText(response));
      err.status = response.status;
      throw err;
    }
    return response.json();
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // ----------------------------------------------------------------- render

  function nearBottom() {
    const s = els.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 80;
  }

  function scrollToBottom() {
    els.scroller.scrollTop = els.scroller.scrollHeight;
  }

  function paintAnswer() {
    const stick = nearBottom();
    els.answer.innerHTML = state.ended ? renderFinal(state.text) : renderPartial(state.text);
    if (stick) scrollToBottom();
  }

  /** At most one render per animation frame, however many pieces arrive in it. */
  function scheduleRender() {
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
  function markEnding(article, reason, message, tokens) {
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

  function messageElement(message) {
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
  function archiveLiveTurn() {
    if (els.live.hidden) return;
    for (const node of [els.livePrompt, els.liveAnswer]) {
      const copy = node.cloneNode(true);
      copy.removeAttribute("id");
      copy.querySelectorAll("[id]").forEach((el) => el.removeAttribute("id"));
      els.history.append(copy);
    }
    els.live.hidden = true;
  }

  function resetLiveTurn(prompt) {
    els.livePrompt.querySelector(".content").textContent = prompt;
    els.answer.innerHTML = "";
    markEnding(els.liveAnswer, null);
    els.live.hidden = false;
    scrollToBottom();
  }

  // ------------------------------------------------------------ conversations

  async function refreshConversations() {
    let list;
    try {
      list = await getJSON("conversations");
    } catch (err) {
      return; // the list is a convenience; the page works without it
    }
    const items = list.map((c) => {
      const li = document.createElement("li");
      const a = document.createElement("a");
      a.href = "#c=" + encodeURIComponent(c.id);
      a.dataset.conversationId = c.id;
      a.textContent = c.title || "Untitled";
      a.title = c.title || c.id;
      li.append(a);
      return li;
    });
    els.conversations.replaceChildren(...items);
    markCurrentConversation();
  }

  function markCurrentConversation() {
    let title = null;
    for (const a of els.conversations.querySelectorAll("a")) {
      const current = a.dataset.conversationId === state.conversationId;
      if (current) {
        a.setAttribute("aria-current", "page");
        title = a.textContent;
      } else {
        a.removeAttribute("aria-current");
      }
    }
    els.title.textContent = state.conversationId ? title || "Conversation" : "New conversation";
  }

  async function loadConversation(id, attempt) {
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

  function newConversation() {
    if (!state.ended) return;
    clearTimeout(state.poll);
    setConversation(null);
    els.history.replaceChildren();
    els.live.hidden = true;
    setStatus("Ready.");
    els.prompt.focus();
  }

  // ---------------------------------------------------------------- streaming

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

  function clearPlace() {
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

  function openStream(url) {
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

  function finish(end) {
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

  function rememberInflight(inflight) {
    try { sessionStorage.setItem(INFLIGHT_KEY, JSON.stringify(inflight)); } catch (err) { /* private mode */ }
  }

  function recallInflight() {
    try { return JSON.parse(sessionStorage.getItem(INFLIGHT_KEY) || "null"); } catch (err) { return null; }
  }

  function forgetInflight() {
    try { sessionStorage.removeItem(INFLIGHT_KEY); } catch (err) { /* private mode */ }
  }

  /**
   * This tab was reading an answer when it was reloaded. The server kept the
   * answer's events (and went on generating for a grace period), so a new
   * EventSource gets all of them again, from the first, then the live ones.
   */
  function resume(inflight) {
    beginTurn(inflight.prompt || "");
    state.resumed = true;
    state.generationId = inflight.generationId;
    if (inflight.messageId) els.liveAnswer.dataset.messageId = inflight.messageId;
    setStatus("Resuming the answer…");
    els.stop.disabled = false;
    openStream(inflight.events || "generations/" + encodeURIComponent(inflight.generationId) + "/events");
  }

  async function send(prompt, maxTokens) {
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
  async function stop() {
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
})();
