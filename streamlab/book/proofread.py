"""Proofreading an executed chapter: computed prose that follows its numbers, and clean outputs.

A chapter's sentences are computed from its measurements, so a sentence
written for one run can be wrong for the next: "1 sizes", "a 8-token
answer", "every size ... 88%", "died: True". ``prose_problems`` finds those
patterns in a Markdown string; ``notebook_problems`` reads an executed
notebook (papermill's copy) and checks

- every Markdown output (``display(Markdown(...))``: the chapter's computed
  sentences) and the recorded headline, with ``prose_problems``;
- that no cell wrote to stderr (a warning, a log line), unless the cell is
  tagged ``shows-stderr`` because the error is the lesson;
- that no output is a dump (a dict or list shown as the cell's value) or
  larger than a bound, and that the headline is shown once;
- every table a cell shows (a DataFrame's HTML, a Markdown table), with
  ``table_problems``: no Python value in a cell (``None``, ``NaN``,
  ``True``, ``[200, 204]``), no unrounded float (``7.666667``), no code name
  as a column header (``browser_saw``), no temporary path or throwaway port;
- the Markdown cells, the chapter's written prose, with
  ``written_problems``: no history of the project ("used to", "the old
  default", "an earlier version"), no temporary path or throwaway port;
- printed lines, for temporary paths and throwaway ports (a wire dump's
  ``Host:`` header and a configuration's ``proxy_pass ...;`` are the bytes
  themselves, and stay).

Code is not prose: a code cell's source, and what ``show_source`` shows (a
highlighted block, not a table), are left alone.

The notebook tests call ``check_executed`` on each chapter they already
executed, so it costs no second run. From the command line:
``python -m streamlab.book.proofread build/notebooks/*.ipynb``.
The words that avoid these mistakes are in ``streamlab.book.wording``.
"""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Iterable

from streamlab.book.wording import a_an, plural

MAX_TEXT_CHARS = 10_000  # a text output (stream, Markdown, plain) longer than this is a dump, not a result
MAX_HTML_CHARS = 60_000  # a table's HTML (show_source's highlighted code is ~10 KB)
ALLOW_STDERR_TAG = "shows-stderr"

# Python's values, as a repr puts them in a sentence.
_PY_WORDS = re.compile(r"(?<![\w-])(True|False|None(?! of\b)|NaN|nan)(?![\w-])")  # 'None of the 4' is English
_ITEM = r"(?:'[^'\n]*'|\"[^\"\n]*\"|-?\d[\d.e+-]*|None|True|False)"
_PY_LIST = re.compile(rf"\[\s*\]|\[{_ITEM}(?:,\s*{_ITEM})*\](?!\()")
_PY_DICT = re.compile(r"\{\s*\}|\{\s*['\"][^'\"\n]*['\"]\s*:")
_PY_TUPLE = re.compile(rf"\({_ITEM}(?:,\s*{_ITEM})+\)")
_MAYBE_PLURAL = re.compile(r"\w+\((?:s|es)\)")

# "1 sizes": one, then a plural noun. Words ending in s that are not plurals, and units, are left alone.
_ONE_THEN = re.compile(r"(?<![\w.,/])1 ([a-z]+s)\b(?![-'’])")
_NOT_PLURAL = {"is", "was", "has", "does", "as", "us", "its", "this", "thus", "plus", "minus", "less", "ms", "ns",
               "bps", "kbps", "mbps", "fps", "tps", "yes", "across", "versus", "whereas", "always", "perhaps"}
# "3 token": a number other than one, then one of the book's countable nouns in the singular.
NOUNS = ("token", "piece", "size", "write", "answer", "event", "byte", "reader", "gap", "prompt", "round", "word",
         "character", "connection", "request", "line", "frame", "chunk", "generation", "server", "hop", "minute",
         "second", "message", "case", "reconnect", "error", "chapter", "attempt", "stream", "call", "refusal", "row",
         "header", "client", "length", "worker", "batch", "step", "reply", "time")
_COMPOUND = r"(?:lengths?|counts?|limits?|ids?|budgets?|windows?|boundar(?:y|ies)|positions?|rates?|paces?|levels?)"
_MANY_THEN = re.compile(
    rf"(?<![\w.,/])(\d[\d,]*(?:\.\d+)?) ({'|'.join(NOUNS)})(?![\w'’-])(?! {_COMPOUND}\b)(?! (?:of|per)\b)"
    r"(?! [a-z]{2,}s\b)")  # '8 event sizes': the noun is a modifier of the plural after it
# A number that names rather than counts: 'chapter 2 server', 'RFC 6455 frame', 'port 8000 server', 'HTTP/1.1 connection'.
_NAMING = re.compile(r"(?:chapters?|part|section|step|figure|table|exercise|issue|RFC|port|version|Python|HTTP|#)\s*$",
                     re.I)
_ARTICLE = re.compile(r"(?<![\w'’-])(a|an|A|An) ([\w\d][\w.,+-]*)")
# A share, and the words that claim all or nothing.
_SHARE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?%")
_ALL_WORDS = re.compile(r"(?<!not )\b(every|everything|always|exactly|all(?! \d)(?! of the \d)|only)\b", re.I)
_NONE_WORDS = re.compile(r"(?<!not )\b(never|none|nothing|no one|nobody)\b", re.I)
_MET = re.compile(r"\b(met|meets)\b", re.I)
_SPREAD = re.compile(r"±|\bspread\b|\binterval\b|\bwithin (?:the )?noise\b|\d\s?[–-]\s?\d|\bIQR\b|\bfrom \d+ to \d+", re.I)
_ROUNDS = re.compile(r"\b(\d+) (?:rounds?|runs?|repeats?)\b")

# A float written with more than 3 decimals: 7.666667, 0.018476, 55.108762 (a version such as 1.25.1 is not one).
_LONG_FLOAT = re.compile(r"(?<![\w.])-?\d+\.\d{4,}(?:e[+-]?\d+)?(?!\.?\d)")
# A run's leftovers: a temporary folder, a port the system picked for one run (127.0.0.1:45971, port 45971).
_TEMP_PATH = re.compile(r"(?:/private)?/var/folders/\S+|(?<![\w.~-])/(?:var/)?tmp/\S*|\\AppData\\Local\\Temp\b\S*", re.I)
_HOST_PORT = re.compile(r"\b(?:127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\])(?::(\d{2,5}))\b")
_PORT_WORD = re.compile(r"(?<!-)\bports? (\d{2,5})\b")  # not the flag: '--port 99999 is not a port
FIRST_THROWAWAY_PORT = 10_000  # 127.0.0.1:8000 is the port the docs name; a port the system picked is above this
# The project's own history: a chapter says what is, not what was.
# ('Older versions of Starlette' is another project's history, and stays.)
_HISTORY = re.compile(r"\bold defaults?\b|\ban? (?:earlier|previous|older) version\b|\bthe old\b|\bformerly\b"
                      r"|\b(?:earlier|previous|older) versions? of (?:this|the) (?:chapter|book|course|library|server"
                      r"|code|project)\b|\bused to\b(?! (?:it|them|this|that)\b)", re.I)
_PASSIVE = re.compile(r"\b(?:is|are|be|been|being|get|gets|got|getting|was|were)\s+$", re.I)  # 'is used to time' is a use
_FENCED = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
# Code names as a table's column headers: browser_saw, run_on, bounded_timeout (not in backticks).
_CODE_NAME = re.compile(r"(?<![\w`.-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w`])")
# What a table cell holds when a Python value reached it unformatted.
_PY_CELL = re.compile(r"^(?:True|False|None|NaN|nan|NaT|<NA>|-?inf)$")
# (JSON on the wire, {"text": "abc"}, is the bytes themselves: a dict pandas shows has single quotes.)
_LIST_CELL = re.compile(rf"^\[(?:\s*|.*,.*|'.*'|-?\d[\d.e+-]*)\]$|^\[.*\.\.\.$|^\{{\s*\}}$|^\{{'[^']*':"
                        rf"|^\({_ITEM}(?:,\s*{_ITEM})+\)$")


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?;])\s+|\n+", text) if s.strip()]


def _plain(text: str) -> str:
    """The text as it reads: emphasis and code marks taken out, so '**8**-token' reads as '8-token'."""
    return re.sub(r"\*\*|__|`", "", text)


def prose_problems(text: str) -> list[str]:
    """What a reader should not see in a computed sentence; each problem quotes its words."""
    problems: list[str] = []
    for pattern, what in ((_PY_WORDS, "a Python value in prose"), (_PY_LIST, "a Python list in prose"),
                          (_PY_DICT, "a Python dict in prose"), (_PY_TUPLE, "a Python tuple in prose"),
                          (_MAYBE_PLURAL, "'(s)': choose singular or plural from the number")):
        problems += [f"{what}: {m.group()!r}" for m in pattern.finditer(text)]
    plain = _plain(text)
    problems += [f"number agreement: {m.group()!r}" for m in _ONE_THEN.finditer(plain)
                 if m.group(1) not in _NOT_PLURAL and not re.search(r"(ss|us|is|ous)$", m.group(1))
                 and not _NAMING.search(plain[:m.start()])]
    problems += [f"number agreement: {m.group()!r}" for m in _MANY_THEN.finditer(plain)
                 if m.group(1).replace(",", "") not in {"1", "1.0"} and not _NAMING.search(plain[:m.start()])]
    problems += _article_problems(plain)
    problems += _long_floats(plain) + _leftovers(plain) + _history(_CODE_SPAN.sub(" ", _FENCED.sub(" ", text)))
    for sentence in _sentences(plain):
        problems += _share_problems(sentence)
        if _MET.search(sentence):
            rounds = [int(n) for n in _ROUNDS.findall(sentence)]
            if rounds and min(rounds) < 3:
                problems.append(f"'met' from {plural(min(rounds), 'round')}: too few to say so: {sentence.strip()!r}")
            elif not _SPREAD.search(sentence):
                problems.append(f"'met' without the spread (a range, ±, or an interval): {sentence.strip()!r}")
    return problems


def _leftovers(text: str) -> list[str]:
    """Temporary paths and throwaway ports, each quoted."""
    found = [f"a temporary path: {m.group()!r}" for m in _TEMP_PATH.finditer(text)]
    for pattern in (_HOST_PORT, _PORT_WORD):
        found += [f"a throwaway port: {m.group()!r}" for m in pattern.finditer(text)
                  if m.group(1) and FIRST_THROWAWAY_PORT <= int(m.group(1)) <= 65_535]
    return found


def _history(text: str) -> list[str]:
    return [f"the project's history ({m.group()!r}, in {_around(text, m)!r}): say what is"
            for m in _HISTORY.finditer(text)
            if not (m.group().lower().startswith("used") and _PASSIVE.search(text[:m.start()]))]


def _around(text: str, m: re.Match[str], width: int = 30) -> str:
    return " ".join(text[max(0, m.start() - width):m.end() + width].split())


def _long_floats(text: str) -> list[str]:
    return [f"an unrounded float: {m.group()!r} (round it: 2 or 3 decimals)" for m in _LONG_FLOAT.finditer(text)]


def written_problems(text: str) -> list[str]:
    """What a chapter's written prose (a Markdown cell) must not hold: the project's history, a run's leftovers.

    Code blocks and code spans are code, and left out.
    """
    prose = _CODE_SPAN.sub(" ", _FENCED.sub(" ", text))
    return _history(prose) + _leftovers(_FENCED.sub(" ", text))


def _article_problems(text: str) -> list[str]:
    problems = []
    for m in _ARTICLE.finditer(text):
        article, word = m.group(1).lower(), m.group(2)
        first = word[0]
        if first.isdigit() or re.match(r"^[A-Z]{2,}|^[A-Z](?![a-z])", word):
            judged = True  # numbers and acronyms: said by their sound, which a_an knows
        else:
            # words: only the plain cases (a vowel letter not u, a consonant not h); 'a user', 'an hour' are right
            judged = first.lower() in "aeio" and not re.match(r"^(one|once|eu|ewe)", word, re.I) or (
                first.isalpha() and first.lower() not in "aeiouh")
        if judged and a_an(word) != article:
            problems.append(f"'{m.group(1)}' before {word!r}: say '{a_an(word)} {word}'")
    return problems


def _share_problems(sentence: str) -> list[str]:
    shares = [float(v) for v in _SHARE.findall(sentence)]
    if not shares:
        return []
    problems = []
    below = [s for s in shares if s < 100]
    if below:
        for m in _ALL_WORDS.finditer(sentence):
            word = m.group(1).lower()
            if word == "only" and min(below) > 0:
                continue  # 'only 12% of the gaps' is a small share, said as one
            problems.append(f"'{m.group(1)}' next to a share of {min(below):g}%: {sentence.strip()!r}")
    above = [s for s in shares if s > 0]
    if above:
        problems += [f"'{m.group(1)}' next to a share of {max(above):g}%: {sentence.strip()!r}"
                     for m in _NONE_WORDS.finditer(sentence)]
    return problems


class _Tables(HTMLParser):
    """The tables of an HTML output, each as its header rows and its body rows of cell texts.

    A header row is one in ``<thead>`` (or, in a table without one, a first
    row of ``<th>`` only). Text in ``<code>`` is kept in backticks, as
    Markdown writes it; a highlighted code block (``highlighttable``),
    ``<style>`` and ``<script>`` are not tables.
    """

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[list[tuple[bool, list[tuple[str, str]]]]] = []
        self._row: list[tuple[str, str]] | None = None
        self._cell: list[str] | None = None
        self._head = False
        self._skip = 0  # inside a highlighted block's table
        self._hidden = 0  # inside <style> or <script>
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            if self._skip or "highlighttable" in (dict(attrs).get("class") or ""):
                self._skip += 1
            else:
                self.tables.append([])
        elif tag in ("style", "script"):
            self._hidden += 1
        elif self._skip or not self.tables:
            return
        elif tag == "thead":
            self._head = True
        elif tag == "tbody":
            self._head = False
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = [tag, ""]
        elif tag == "code" and self._cell is not None:
            self._cell[1] += "`"

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._skip:
            self._skip -= 1
        elif tag in ("style", "script"):
            self._hidden = max(0, self._hidden - 1)
        elif self._skip or not self.tables:
            return
        elif tag == "code" and self._cell is not None:
            self._cell[1] += "`"
        elif tag in ("td", "th") and self._cell is not None:
            if self._row is not None:
                self._row.append((self._cell[0], " ".join(self._cell[1].split())))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            rows = self.tables[-1]
            head = self._head or (not rows and all(kind == "th" for kind, _ in self._row))
            rows.append((head, self._row))
            self._row = None
        elif tag == "thead":
            self._head = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None and not self._skip and not self._hidden:
            self._cell[1] += data

    def split(self) -> list[tuple[list[str], list[tuple[str, str, str]]]]:
        """Each table as (its header cells, its body cells as (column header, text, th or td))."""
        found = []
        for rows in self.tables:
            heads = [cells for head, cells in rows if head]
            columns = [text for _, text in heads[0]] if heads else []
            body = [(columns[i] if i < len(columns) else "", text, kind)
                    for head, cells in rows if not head for i, (kind, text) in enumerate(cells)]
            found.append(([text for cells in heads for _, text in cells], body))
        return found


def _cells_problems(head: list[str], body: list[tuple[str, str, str]], where: str) -> list[str]:
    """One line per kind of problem and column: what a reader should not see in a table."""
    found: dict[tuple[str, str], list[str]] = {}
    for text in head:
        for m in _CODE_NAME.finditer(text):
            found.setdefault((f"a code name as a column header (say it in words): {m.group()!r}", ""), []).append(text)
    for column, text, _ in body:
        if _PY_CELL.match(text):
            found.setdefault((f"a Python value in a table: {text!r}", column), []).append(text)
        elif _LIST_CELL.match(text):
            found.setdefault(("a Python list, dict or tuple in a table cell", column), []).append(text)
        if _LONG_FLOAT.search(text):
            found.setdefault(("an unrounded float in a table (round it: 2 or 3 decimals)", column), []).append(text)
        for problem in _leftovers(text):
            found.setdefault((problem.split(":")[0] + " in a table", column), []).append(text)
    lines = []
    for (what, column), texts in found.items():
        named = f" in column {column!r}" if column else ""
        more = f" and {plural(len(texts) - 1, 'more cell')}" if len(texts) > 1 else ""
        sample = "" if repr(texts[0]) in what else f": {texts[0][:80]!r}"
        lines.append(f"{where}{what}{named}{sample}{more}")
    return lines


def table_problems(html_text: str) -> list[str]:
    """What the tables of an HTML output (a DataFrame, a Styler) show that a reader should not see."""
    problems = []
    tables = _Tables(html_text).split()
    for number, (head, body) in enumerate(tables, 1):
        where = f"table {number}: " if len(tables) > 1 else "table: "
        problems += _cells_problems(head, body, where)
    return problems


_MD_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")


def _md_cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def markdown_table_problems(text: str) -> list[str]:
    """The column headers of the Markdown tables in ``text`` (their cells are prose, which prose_problems reads)."""
    lines = _FENCED.sub("", text).splitlines()
    head = [cell for above, rule in zip(lines, lines[1:]) if _MD_RULE.match(rule) and "|" in above
            for cell in _md_cells(above)]
    return _cells_problems(head, [], "table: ")


def printed_problems(text: str) -> list[str]:
    """Temporary paths and throwaway ports in printed lines, except the lines that are bytes or configuration.

    A wire dump's header line (``Host: 127.0.0.1:45971\\r\\n``) and a configuration's
    line (``proxy_pass http://127.0.0.1:45971;``) show exactly what was sent or written.
    """
    problems = []
    for line in text.splitlines():
        if _WIRE_LINE.search(line):
            continue
        problems += _leftovers(line)
    return problems


_WIRE_LINE = re.compile(r"^\s*[A-Z][A-Za-z0-9-]*: |\\r\\n\s*$|[;{}]\s*$|^\s*(?:GET|POST|PUT|DELETE|HEAD|OPTIONS) \S+ HTTP/")


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _outputs(notebook: dict[str, Any]) -> Iterable[tuple[int, dict[str, Any], set[str]]]:
    for index, cell in enumerate(notebook.get("cells", [])):
        tags = set(cell.get("metadata", {}).get("tags", []))
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            yield index, output, tags


def notebook_problems(path: str | Path, *, headline: str | None = None) -> list[str]:
    """Everything in an executed notebook's outputs that a clean chapter does not show (see the module's list)."""
    notebook = json.loads(Path(path).read_text(encoding="utf-8"))
    problems: list[str] = []
    shown: list[str] = []
    for index, output, tags in _outputs(notebook):
        where = f"cell {index}"
        kind = output.get("output_type")
        if kind == "stream":
            text = _text(output.get("text", ""))
            shown.append(text)
            if output.get("name") == "stderr" and ALLOW_STDERR_TAG not in tags:
                first = next((line for line in text.splitlines() if line.strip()), "")
                problems.append(f"{where}: stderr output: {first[:200]!r}")
            if len(text) > MAX_TEXT_CHARS:
                problems.append(f"{where}: {len(text)} characters printed (over {MAX_TEXT_CHARS})")
            problems += [f"{where}: {p} (printed)" for p in printed_problems(text)]
            continue
        data = output.get("data", {})
        for mime, value in data.items():
            text = _text(value)
            if mime.startswith("image/"):
                continue
            bound = MAX_HTML_CHARS if mime in {"text/html", "text/latex"} else MAX_TEXT_CHARS
            if len(text) > bound:
                problems.append(f"{where}: a {mime} output of {len(text)} characters (over {bound})")
        if "text/markdown" in data:
            markdown = _text(data["text/markdown"])
            shown.append(markdown)
            problems += [f"{where}: {p}" for p in prose_problems(markdown) + markdown_table_problems(markdown)]
        elif "text/html" in data:
            problems += [f"{where}: {p}" for p in table_problems(_text(data["text/html"]))]
        elif set(data) == {"text/plain"}:
            value = _text(data["text/plain"]).lstrip()
            shown.append(value)
            if kind == "execute_result" and value[:1] in "{[(" and not value.startswith("(<"):
                problems.append(f"{where}: the cell's value is a dump ({value[:60]!r}...): show a table or a sentence")
            elif "\n" in value.strip():  # a table (a Series, a DataFrame) shown as text
                cells = [("", word, "td") for word in value.split()]
                problems += [f"{where}: {p} (shown as text)" for p in _cells_problems([], cells, "")]
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") == "markdown":
            problems += [f"cell {index} (Markdown): {p}" for p in written_problems(_text(cell.get("source", "")))]
    if headline is not None:
        problems += [f"headline: {p}" for p in prose_problems(headline)]
        times = sum(text.count(headline) for text in shown)
        if times > 1:
            problems.append(f"the headline is shown {times} times: once is enough")
    return problems


def check_executed(path: str | Path, *, headline: str | None = None) -> None:
    """Raise ``AssertionError`` listing every problem of an executed chapter (none: returns)."""
    problems = notebook_problems(path, headline=headline)
    if problems:
        raise AssertionError(f"{Path(path).name}: {plural(len(problems), 'problem')} in its outputs:\n  "
                             + "\n  ".join(problems))


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    failed = 0
    for path in paths:
        results = path.parent.parent / "results" / f"{path.stem}.json"
        headline = json.loads(results.read_text(encoding="utf-8"))["headline"] if results.is_file() else None
        problems = notebook_problems(path, headline=headline)
        failed += bool(problems)
        print(f"{path.name}: {plural(len(problems), 'problem') if problems else 'clean'}")
        for problem in problems:
            print(f"  {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
