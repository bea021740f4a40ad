/* Markdown from partial text. The answer is rendered again as it grows, so
 * what is half written at its end is prepared first (an open code fence is
 * closed, a half-written table row or link is held back) and the answer does
 * not jump about. The model's text is untrusted: raw HTML in it is shown as
 * text, never run, and the rendered HTML passes an allowlist.
 *
 * The renderer is the vendored marked (static/vendor/marked.umd.js), a classic
 * deferred script that runs before the page's modules and sets window.marked.
 */

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
export function prepareMarkdown(text, partial) {
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

export const markdown =
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
export function renderPartial(text) {
  return render(text, true);
}

/** HTML for text that has ended (completely or not). Never throws. */
export function renderFinal(text) {
  return render(text, false);
}
