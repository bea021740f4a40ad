"""Words a computed sentence picks from its numbers: a chapter's prose says what its values say.

A chapter's sentences are written before its numbers are known, so the words
must follow the values rather than the writer's expectation:

    plural(1, "size")                 '1 size'          plural(3, "size") -> '3 sizes'
    count(n, "remains", "remain")     the verb that agrees with n (count(2, "was") -> 'were')
    with_article("8-token answer")    'an 8-token answer' (a_an gives the article alone)
    of_all(7, 8, "size")              '7 of 8 sizes (88%)'   of_all(8, 8, "size") -> 'all 8 sizes'
    share_word(0.88)                  'most'  (never 'every' below 100%)
    either(equal, "is the same text", "differs")   words for a yes/no, never 'True'
    listing(["eof", "close frame"])   'eof and close frame': a list as a sentence says it, never ['eof', ...]
    spread([0.21, 0.24, 0.22], unit=" s")           '0.21–0.24 s over 3 rounds'

``streamlab.book.proofread`` checks the rendered chapters for the mistakes
these prevent.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

__all__ = ["a_an", "count", "either", "listing", "of_all", "plural", "share_word", "spread", "with_article"]

# Plurals that do not just add "s"; a noun not listed takes "s" (or "es" after s, x, ch, sh).
_IRREGULAR = {"reply": "replies", "entry": "entries", "query": "queries", "body": "bodies", "proxy": "proxies",
              "copy": "copies", "policy": "policies", "retry": "retries", "try": "tries", "child": "children",
              "person": "people", "index": "indexes", "series": "series", "is": "are", "was": "were", "has": "have"}


def plural_of(word: str) -> str:
    """The plural of one English noun (the last word of ``word`` when it has several)."""
    head, _, last = word.rpartition(" ")
    if last in _IRREGULAR:
        many = _IRREGULAR[last]
    elif re.search(r"(s|x|z|ch|sh)$", last):
        many = last + "es"
    elif re.search(r"[^aeiou]y$", last):
        many = last[:-1] + "ies"
    else:
        many = last + "s"
    return f"{head} {many}" if head else many


def count(n: float, word: str, many: str | None = None) -> str:
    """``word`` or its plural as ``n`` asks, without the number: count(1, 'write') is 'write'."""
    return word if n == 1 else (many or plural_of(word))


def plural(n: float, word: str, many: str | None = None, *, number: str | None = None) -> str:
    """'1 size', '0 sizes', '2.5 seconds': the number and the noun in agreement.

    ``number`` is how to write ``n`` (a format spec such as ``",.0f"``);
    whole numbers are written without a decimal point.
    """
    shown = format(n, number) if number else (f"{int(n):,}" if float(n).is_integer() else f"{n:g}")
    return f"{shown} {count(1 if shown == '1' else 2, word, many)}"  # as written: 0.999 shown as '1' is one


# How a number's English name begins, for a/an: 8, 11, 18, 80-89, 800..., 11 000, 18 000 000 start with a vowel sound.
def _number_sounds_like_vowel(digits: str) -> bool:
    digits = digits.replace(",", "")
    whole = digits.split(".")[0]
    if not whole or not whole.isdigit():
        return False
    if whole.startswith("8"):
        return True
    # eleven, eighteen: 11 and 18, and 11 or 18 of a thousand, a million, ...
    return whole[:2] in {"11", "18"} and len(whole) % 3 == 2


# Letters said by name in an acronym ("an SSE stream", "a URL"), whose name starts with a vowel sound.
_VOWEL_LETTERS = set("AEFHILMNORSX")
# Words spelt with a vowel that start with a consonant sound, and words with a silent h.
_CONSONANT_SOUND = re.compile(
    r"^(uni(q|t|v|f|o|c|s)|usa|use|usi|usu|uti|ura|ure|uri|uro|ubiq|unanim|eu|ewe|one\b|once\b|u\b)", re.I)
_VOWEL_SOUND = re.compile(r"^(hour|honest|honou?r|heir|herb\b|nginx)", re.I)
_ACRONYM = re.compile(r"^[A-Z][A-Z0-9]+s?\b")


def a_an(word: str) -> str:
    """'a' or 'an' for the word (or number, or acronym) it goes before: by its sound, not its letter.

    a_an('8-token') -> 'an', a_an('12-token') -> 'a', a_an('SSE') -> 'an', a_an('URL') -> 'a',
    a_an('hour') -> 'an', a_an('user') -> 'a'.
    """
    word = word.lstrip("*_`\"'([“‘")
    if not word:
        return "a"
    number = re.match(r"^[\d,.]+", word)
    if number:
        return "an" if _number_sounds_like_vowel(number.group()) else "a"
    if (_ACRONYM.match(word) and not re.match(r"^[A-Z][a-z]", word)) or re.match(r"^[A-Z](?![A-Za-z])", word):
        return "an" if word[0] in _VOWEL_LETTERS else "a"
    if _VOWEL_SOUND.match(word):
        return "an"
    if _CONSONANT_SOUND.match(word):
        return "a"
    return "an" if word[0].lower() in "aeiou" else "a"


def with_article(phrase: str) -> str:
    """The phrase after its article: 'an 8-token answer', 'a 12-token answer'."""
    return f"{a_an(phrase)} {phrase}"


def share_word(share: float) -> str:
    """A quantifier a share allows: 'every' only at 100%, 'no' only at 0%, 'most', 'about half', 'some' between."""
    if share >= 1:
        return "every"
    if share <= 0:
        return "no"
    if share >= 0.6:
        return "most"
    if share >= 0.4:
        return "about half"
    return "some" if share >= 0.1 else "few"


def of_all(part: int, whole: int, noun: str, many: str | None = None) -> str:
    """How many of a whole, worded by the count: 'all 8 sizes', 'none of the 8 sizes', '7 of 8 sizes (88%)'.

    One of one is 'the one size', none of one 'no size'; the share is written only when it is not all or none.
    """
    if whole == 1:
        return f"the one {noun}" if part == 1 else f"no {noun}"
    if part == whole:
        return f"all {whole} {count(whole, noun, many)}" if whole != 2 else f"both {count(2, noun, many)}"
    if part == 0:
        return f"none of the {whole} {count(whole, noun, many)}"
    return f"{part} of {whole} {count(whole, noun, many)} ({part / whole:.0%})"


def listing(items: Sequence[Any], last: str = "and") -> str:
    """Items as a sentence lists them: 'a', 'a and b', 'a, b and c' (no Python brackets, no quotes)."""
    words = [str(item) for item in items]
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} {last} {words[-1]}"


def either(flag: Any, yes: str, no: str) -> str:
    """The words for a yes-or-no result, so a sentence never shows 'True' or 'False'."""
    return yes if flag else no


def spread(values: Sequence[float], *, unit: str = "", digits: int = 2, noun: str = "round") -> str:
    """Values as a reader should see a measured figure: the range and how many rounds, e.g. '0.21-0.24 s over 3 rounds'.

    One value says so ('0.22 s from 1 round, no spread'): a target is not
    'met' on one round.
    """
    values = [float(v) for v in values]
    if not values:
        return f"no {plural_of(noun)}"
    lo, hi = min(values), max(values)
    if len(values) == 1:
        return f"{lo:.{digits}f}{unit} from {plural(1, noun)}, no spread"
    return f"{lo:.{digits}f}–{hi:.{digits}f}{unit} over {plural(len(values), noun)}"
