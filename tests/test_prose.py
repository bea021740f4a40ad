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
    # Unrounded floats, a run's leftovers, the project's history.
    "The SSE event costs 7.666667 bytes per byte of text.": "unrounded float",
    "Its first event came after 0.018476 s, 55.108762 ms before the end.": "unrounded float",
    "Servers listening at `http://127.0.0.1:45971` and `http://127.0.0.1:42279`.": "throwaway port",
    "The reader was on the replica at port 45277 when it was killed.": "throwaway port",
    "the second turn went to another replica (localhost:35385).": "throwaway port",
    "nginx read its certificate from /tmp/streamlab-streams-a8d8t3gu/tls/cert.pem.": "temporary path",
    "The results went to /var/folders/x1/abc/T/run.json.": "temporary path",
    "A long prompt used to freeze everyone.": "history",
    "One refuses past 2 at once (the old default), one has no limit.": "history",
    "An earlier version of this chapter ran its 17 readers on one model.": "history",
    "The server's old default was 2.": "history",
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
    "0.287 s, 0.250 s and 0.21 s; 7.67 bytes; 1,234 tokens; 1.0x; nginx 1.25.1; 20%",
    "Open http://127.0.0.1:8000/ (port 8000, the default), or pass --port 0.",
    "The model is converted once into ~/.cache/streamlab/, and the store is build/streamlab.db.",
    "The two prompts are used to time the generation; a reader gets used to it.",
    "Older versions of Starlette wrote into a GzipFile and flushed nothing.",
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


# --------------------------------------------------------------------------
# Tables, written prose and printed lines
# --------------------------------------------------------------------------


def html_table(frame, styled=False, precision=None):
    """A DataFrame's HTML as a notebook shows it, or its Styler's (which writes 6 decimals unless told)."""
    if not styled:
        return frame.to_html()
    style = frame.style if precision is None else frame.style.format(precision=precision)
    return style.to_html()


@pytest.mark.parametrize("styled", [False, True], ids=["DataFrame", "Styler"])
def test_a_table_of_python_values_code_names_and_leftovers_is_flagged(styled):
    import pandas as pd

    from streamlab.book.proofread import table_problems

    frame = pd.DataFrame({
        "browser_saw": [True, False], "tokens": [7.666667, 3.0], "statuses": [[200, 204], [200, 200, 200]],
        "replica": ["127.0.0.1:45971", "http://127.0.0.1:35385"], "file": ["/tmp/streamlab-x1/cert.pem", "—"],
        "stop reason": [None, float("nan")],
    })
    problems = table_problems(html_table(frame, styled))
    said = "\n".join(problems)
    assert "a code name as a column header (say it in words): 'browser_saw'" in said
    assert "a Python value in a table: 'True' in column 'browser_saw'" in said
    assert "an unrounded float in a table (round it: 2 or 3 decimals) in column 'tokens': '7.666667'" in said
    assert "a Python value in a table: 'False' in column 'browser_saw'" in said
    assert "a Python list, dict or tuple in a table cell in column 'statuses': '[200, 204]' and 1 more cell" in said
    assert "a throwaway port in a table in column 'replica'" in said
    assert "a temporary path in a table in column 'file'" in said
    assert any(f"{k!r} in column 'stop reason'" in said for k in ("None", "NaN", "nan")), said


@pytest.mark.parametrize("styled", [False, True], ids=["DataFrame", "Styler"])
def test_a_table_in_words_and_rounded_numbers_passes(styled):
    import pandas as pd

    from streamlab.book.proofread import table_problems

    frame = pd.DataFrame({
        "tokens": [30, 1024], "first text (s)": [0.12, 0.135], "complete": ["yes", "no"],
        "stop reason": ["max_tokens", "client_left"], "frame payload": ['{"text": "abc"}', "—"],
        "said": ["200, 6 events and [DONE]", "(status of a broken body: none)"], "port": [8000, 8001],
    }, index=pd.Index(["max_tokens", "stopped"], name="stored as"))
    assert table_problems(html_table(frame.round(3), styled, precision=3)) == []
    if styled:  # a Styler without a format writes 0.120000
        assert any("unrounded float" in p for p in table_problems(html_table(frame, styled)))


def test_show_source_is_code_not_a_table():
    from IPython.display import Code

    from streamlab.book.proofread import table_problems

    code = Code("def f(browser_saw=None):\n    return open('/tmp/x/y')  # 127.0.0.1:45971, 7.666667\n",
                language="python")
    assert table_problems(code._repr_html_()) == []


def test_a_markdown_table_names_its_columns_in_words():
    from streamlab.book.proofread import markdown_table_problems

    bad = "| way | browser_saw |\n|---|---|\n| SSE | yes |\n"
    assert any("'browser_saw'" in p for p in markdown_table_problems(bad))
    assert markdown_table_problems("| field | `max_tokens` |\n|---|---|\n| a | 3 |\n") == []


def test_written_prose_keeps_no_history_and_code_is_left_alone():
    from streamlab.book.proofread import written_problems

    assert any("history" in p and "freeze everyone" in p for p in written_problems(
        "## A long prompt used to freeze everyone\n\nReading a prompt is one pass."))
    assert any("throwaway port" in p for p in written_problems("The replica at port 45277 died."))
    assert written_problems("Run `python -m streamlab serve --port 0`; the docs use 127.0.0.1:8000.\n\n"
                            "```\nrm -rf /tmp/old  # the old way, used to be\n```\n") == []


def test_printed_lines_keep_no_leftovers_but_a_wire_dump_is_the_bytes():
    from streamlab.book.proofread import printed_problems

    assert any("throwaway port" in p for p in printed_problems("server: http://127.0.0.1:42397\n"))
    assert any("temporary path" in p for p in printed_problems("wrote /tmp/pytest-of-root/x.json\n"))
    wire = ("GET /ws HTTP/1.1\\r\\n\nHost: 127.0.0.1:45971\\r\\n\nUpgrade: websocket\\r\\n\n"
            "location = /ws {\n    proxy_pass http://127.0.0.1:44021;\n}\n")
    assert printed_problems(wire) == []


def test_an_executed_chapter_s_tables_markdown_cells_and_prints_are_proofread(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"run_on": [2, 1], "complete": [True, False]})
    table = {"output_type": "execute_result", "metadata": {}, "execution_count": 1,
             "data": {"text/html": frame.to_html(), "text/plain": frame.to_string()}}
    series = {"output_type": "execute_result", "metadata": {}, "execution_count": 2,
              "data": {"text/plain": "0    True\n1     NaN\nName: complete, dtype: object"}}
    printed = {"output_type": "stream", "name": "stdout", "text": "watching: http://127.0.0.1:42659\n"}
    path = notebook(tmp_path, [table, series, printed, markdown("The cost is 0.018476 s.")])
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb["cells"] += [
        {"cell_type": "markdown", "metadata": {}, "source": "One refuses past 2 (the old default)."},
        {"cell_type": "code", "metadata": {}, "execution_count": 2, "outputs": [],
         "source": "n_prompts = 2  # answers used to measure the pace, in /tmp/x at 127.0.0.1:45971"},
    ]
    path.write_text(json.dumps(nb), encoding="utf-8")
    said = "\n".join(notebook_problems(path))
    assert "cell 0: table: a code name as a column header (say it in words): 'run_on'" in said
    assert "cell 0: table: a Python value in a table: 'True' in column 'complete'" in said
    assert "a Python value in a table: 'True' (shown as text)" in said
    assert "cell 0: a throwaway port: '127.0.0.1:42659' (printed)" in said
    assert "cell 0: an unrounded float: '0.018476'" in said
    assert "cell 1 (Markdown): the project's history ('the old'" in said
    assert "cell 2" not in said, "a code cell's source is code, not prose"
