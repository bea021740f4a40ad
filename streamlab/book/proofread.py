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
  larger than a bound, and that the headline is shown once.

The notebook tests call ``check_executed`` on each chapter they already
executed, so it costs no second run. From the command line:
``python -m streamlab.book.proofread build/notebooks/*.ipynb``.
The words that avoid these mistakes are in ``streamlab.book.wording``.
"""

from __future__ import annotations

import json
import re
import sys
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
    for sentence in _sentences(plain):
        problems += _share_problems(sentence)
        if _MET.search(sentence):
            rounds = [int(n) for n in _ROUNDS.findall(sentence)]
            if rounds and min(rounds) < 3:
                problems.append(f"'met' from {plural(min(rounds), 'round')}: too few to say so: {sentence.strip()!r}")
            elif not _SPREAD.search(sentence):
                problems.append(f"'met' without the spread (a range, ±, or an interval): {sentence.strip()!r}")
    return problems


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
            problems += [f"{where}: {p}" for p in prose_problems(markdown)]
        elif kind == "execute_result" and set(data) == {"text/plain"}:
            value = _text(data["text/plain"]).lstrip()
            shown.append(value)
            if value[:1] in "{[(" and not value.startswith("(<"):
                problems.append(f"{where}: the cell's value is a dump ({value[:60]!r}...): show a table or a sentence")
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
