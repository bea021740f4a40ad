/* Which conversation is the current one (in the URL's #c=, and in
 * localStorage for the next visit), and the sidebar's list of conversations. */

import { getJSON } from "./http.js";
import { els, state } from "./page.js";

const STORAGE_KEY = "streamlab.conversation";

export function setConversation(id) {
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

export function conversationFromLocation() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("c");
  if (fromHash) return fromHash;
  try { return localStorage.getItem(STORAGE_KEY); } catch (err) { return null; }
}

export async function refreshConversations() {
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
