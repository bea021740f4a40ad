/* The answer this tab is reading, kept in sessionStorage (per tab), so that a
 * reload can pick the same answer up again (see resume in answer.js). */

const INFLIGHT_KEY = "streamlab.inflight"; // per tab: the answer this tab was reading

export function rememberInflight(inflight) {
  try { sessionStorage.setItem(INFLIGHT_KEY, JSON.stringify(inflight)); } catch (err) { /* private mode */ }
}

export function recallInflight() {
  try { return JSON.parse(sessionStorage.getItem(INFLIGHT_KEY) || "null"); } catch (err) { return null; }
}

export function forgetInflight() {
  try { sessionStorage.removeItem(INFLIGHT_KEY); } catch (err) { /* private mode */ }
}
