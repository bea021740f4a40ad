/* How the page says things: an answer's stop reason in words, and counts. */

const REASONS = {
  completed: "completed",
  stopped: "stopped by you",
  max_tokens: "cut off: token limit",
  client_left: "cut off: the reader left",
  slow_reader: "cut off: the reader fell too far behind",
  interrupted: "interrupted",
  error: "failed",
};

export function reasonInWords(reason, message) {
  if (reason === "error") return message ? "failed: " + message : "failed";
  return REASONS[reason] || (reason ? String(reason) : "ended");
}

export function plural(n, word) {
  return n + " " + word + (n === 1 ? "" : "s");
}
