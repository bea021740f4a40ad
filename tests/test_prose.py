"""The proofreader every executed chapter passes (tests/test_notebooks.py's run_chapter calls it), and the words it asks for.

The chapters themselves are checked where the notebook tests execute them,
at CI size, so no chapter runs twice: here the checker is tested on good and
bad sentences, and on small notebooks written for the purpose.
"""

from __future__ import annotations

import json

import pytest

from streamlab.book.proofread import check_executed, notebook_problems, prose_problems
from streamlab.book.wording import a_an, count, either, listing, of_all, plural, share_word, spread, with_article

BAD = {
    "Padded to 32-byte blocks, 1 sizes remain.": "number agreement",
    "It went out in 1 write(s).": "'(s)'",
    "the answer came in 3 piece, then stopped": "number agreement",
    "a 8-token answer": "'a' before '8-token'",
    "an 12-token answer": "'an' before '12-token'",
    "a 18-byte frame": "'a' before '18-byte'",
    "a SSE event": "'a' before 'SSE'",
    "a X-Accel-Buffering header": "'a' before 'X-Accel-Buffering'",
    "an apple a orange": "'a' before 'orange'",
    "the same text: **True**": "Python value",
    "died: True": "Python value",
    "stop reason `None`": "Python value",
    "stop reasons stored ['completed', 'stopped']": "Python list",
    "sizes [1, 2, 3]": "Python list",
    "what it got: {'status': 200}": "Python dict",
    "the cases (200, 7, 'completed')": "Python tuple",
    "Without padding every event size maps to exactly one text length (share: 88%).": "'every' next to a share of 88%",
    "Each gap stays under the threshold: 96% of them do, always.": "'always' next to a share of 96%",
    "1 size remains and only 0% of them pin down a length.": "'only' next to a share of 0%",
    "The stream never stalls: 4% of gaps are over 200 ms.": "'never' next to a share of 4%",
    "the target is met.": "'met' without the spread",
    "−9.9 ms, 108% of a bare loop from 2 rounds of 10 tokens: the target is met": "'met' from 2 rounds",
}

GOOD = [
    "Padded to 32-byte blocks, 1 size remains and it pins down no length.",
    "It went out in 1 write; the other went out in 3 writes.",
    "an 8-token answer, a 12-token answer, an 11-token one, an 18-byte frame, an 80 ms gap, a 0.2 s flush",
    "an SSE event, a URL, a WebSocket frame, an HTTP head, a user, a unique id, an hour, a one-off",
    "Without padding 7 of 8 event sizes identify the text length (88%).",
    "Over all 40 gaps, 96% stayed under 200 ms.",
    "Not every size identifies a length: 88% do.",
    "Only 12% of the gaps were longer than 200 ms.",
    "Every gap stayed under 200 ms (100%).",
    "None of the 4 answers was cut: 0% of them.",
    "1 of 3 pieces; 1 s; 1 ms; 1 process; 1 token/s",
    "30 tokens for nobody; 12 token lengths; 2 tokens per second; 10 of 12 pieces",
    "The target is met: 0.21–0.24 s over 5 rounds, under 0.25 s.",
    "Read the [chapter 2 run](../build/runs/02.json) back.",
    "the joined text equals the original",
    "the chapter 2 server, an RFC 6455 frame, an HTTP/1.1 connection, HTTP/2 stream, port 8000 server",
    "an X-Accel-Buffering header, an nginx proxy, an F frame",
]


@pytest.mark.parametrize("sentence", sorted(BAD))
def test_a_bad_sentence_is_flagged_with_what_is_wrong(sentence):
    problems = prose_problems(sentence)
    assert any(BAD[sentence] in p for p in problems), problems


@pytest.mark.parametrize("sentence", GOOD)
def test_a_good_sentence_passes(sentence):
    assert prose_problems(sentence) == []


def test_wording_picks_words_from_numbers():
    assert plural(1, "size") == "1 size" and plural(0, "size") == "0 sizes" and plural(3, "write") == "3 writes"
    assert plural(2.5, "second") == "2.5 seconds" and plural(1234, "byte") == "1,234 bytes"
    assert plural(0.999, "token", number=".0f") == "1 token"  # agreement with the number as written
    assert plural(2, "reply") == "2 replies" and plural(2, "batch") == "2 batches" and plural(2, "proxy") == "2 proxies"
    assert count(1, "write") == "write" and count(4, "write") == "writes"
    for word, article in {"8-token": "an", "12-token": "a", "11-token": "an", "18": "an", "180": "a", "80": "an",
                          "1,800": "a", "11,000": "an", "SSE": "an", "HTTP": "an", "URL": "a", "WebSocket": "a",
                          "hour": "an", "user": "a", "X-Accel": "an", "nginx": "an", "unique": "a", "one-off": "a", "answer": "an", "event": "an",
                          "**8**-token": "an"}.items():
        assert a_an(word) == article, word
    assert with_article("8-token answer") == "an 8-token answer"
    assert of_all(8, 8, "size") == "all 8 sizes" and of_all(0, 8, "size") == "none of the 8 sizes"
    assert of_all(7, 8, "size") == "7 of 8 sizes (88%)" and of_all(1, 1, "size") == "the one size"
    assert of_all(2, 2, "reader") == "both readers" and of_all(0, 1, "size") == "no size"
    assert [share_word(s) for s in (1.0, 0.88, 0.5, 0.2, 0.05, 0.0)] == ["every", "most", "about half", "some", "few",
                                                                        "no"]
    assert either(True, "the same text", "a different text") == "the same text"
    assert [listing(x) for x in ([], ["a"], ["a", "b"], ["a", "b", "c"])] == ["", "a", "a and b", "a, b and c"]
    assert spread([0.24, 0.21, 0.22], unit=" s") == "0.21–0.24 s over 3 rounds"
    assert spread([0.22], unit=" s") == "0.22 s from 1 round, no spread"


def test_the_words_wording_writes_pass_the_proofreader():
    for n in (0, 1, 2, 8, 11, 18, 21):
        sentence = f"The stream took {plural(n, 'write')}; {with_article(f'{n}-token')} answer; {of_all(min(n, 3), 3, 'size')}."
        assert prose_problems(sentence) == [], sentence


def notebook(tmp_path, outputs, tags=()):
    """A one-cell executed notebook with these outputs."""
    cell = {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": "", "outputs": outputs,
            "execution_count": 1}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}), encoding="utf-8")
    return path


def markdown(text):
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/markdown": text, "text/plain": "<IPython.core.display.Markdown object>"}}


def test_an_executed_chapter_is_proofread(tmp_path):
    stderr = {"output_type": "stream", "name": "stderr", "text": "tqdm/auto.py:21: TqdmWarning: IProgress not found\n"}
    dump = {"output_type": "execute_result", "metadata": {}, "execution_count": 1,
            "data": {"text/plain": "{'headline': 'x', 'figures': {}}"}}
    big = {"output_type": "stream", "name": "stdout", "text": "x" * 20_000}
    headline = {"output_type": "stream", "name": "stdout", "text": "01 the chapter: 3 pieces\n"}
    path = notebook(tmp_path, [stderr, markdown("the same text: **True**"), dump, big, headline, headline])
    problems = notebook_problems(path, headline="01 the chapter: 3 pieces")
    assert any("stderr output" in p and "TqdmWarning" in p for p in problems)
    assert any("Python value" in p for p in problems)
    assert any("a dump" in p for p in problems)
    assert any("20000 characters printed" in p for p in problems)
    assert any("headline is shown 2 times" in p for p in problems)
    with pytest.raises(AssertionError, match="nb.ipynb: 5 problems"):
        check_executed(path, headline="01 the chapter: 3 pieces")
    assert any("headline: number agreement" in p for p in notebook_problems(path, headline="1 pieces"))


def test_a_clean_chapter_passes_and_a_cell_whose_lesson_is_the_error_may_write_stderr(tmp_path):
    table = {"output_type": "execute_result", "metadata": {}, "execution_count": 1,
             "data": {"text/html": "<table></table>", "text/plain": "   a\n0  1"}}
    headline = {"output_type": "stream", "name": "stdout", "text": "01 the chapter: 3 pieces\n"}
    check_executed(notebook(tmp_path, [markdown("The answer came in 3 pieces."), table, headline]),
                   headline="01 the chapter: 3 pieces")
    error = {"output_type": "stream", "name": "stderr", "text": "streamlab serve: --port 99999 is not a port\n"}
    check_executed(notebook(tmp_path, [error], tags=["shows-stderr"]))


def test_run_notebooks_says_what_the_proofreader_found_in_one_line(tmp_path):
    from streamlab.book.notebooks import proofread

    headline = {"output_type": "stream", "name": "stdout", "text": "01 the chapter: 3 pieces\n"}
    assert proofread(notebook(tmp_path, [markdown("The answer came in 3 pieces."), headline]),
                     "01 the chapter: 3 pieces") == ""
    said = proofread(notebook(tmp_path, [markdown("It came in 1 pieces."), headline]), "01 the chapter: 3 pieces")
    assert said.startswith("proofread: 1 problem, the first: cell 0: number agreement: '1 pieces'") and "\n" not in said
