"""The exercises grade themselves, and their grading can fail.

Every exercise notebook is executed twice with papermill: with its model
answer injected, every check must pass; as handed out (unsolved), every
check must fail, each with a message that says why. Together these show
that no check passes by accident. A deliberately wrong answer shows that the
checks also tell a wrong answer from a right one, naming what differs.

The grader itself, the student copy that ``make exercises`` builds, and the
notebooks' layout are tested without a kernel.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import nbformat
import pytest

from streamlab.book import grading
from streamlab.book.notebooks import chapters
from streamlab.book.grading import (
    EXERCISES,
    SOLUTIONS,
    CountingTokenizer,
    Grader,
    build_student_copy,
    exercises,
    grade_notebook,
    solution_for,
)

REPO = Path(__file__).resolve().parents[1]
NAMES = [
    "ex1_detokenizer",
    "ex2_sse_parser",
    "ex3_websocket_frames",
    "ex4_watch_for_eof",
    "ex5_first_event",
    "ex6_persist_partial",
    "ex7_reading_pace",
    "ex8_follow_a_resumable_answer",
    "ex9_keep_strangers_out",
    "ex10_openai_chunks",
    "ex11_slow_reader",
    "ex12_flushing_gzip",
    "ex13_follow_across_replicas",
    "ex14_six_connections",
    "ex15_utf8_reader",  # an exercise's number is its chapter's
]


def number_of(name: str) -> int:
    """ex15_utf8_reader -> 15."""
    return int(re.match(r"ex(\d+)_", name).group(1))


def notebook(name: str) -> Path:
    return EXERCISES / f"{name}.ipynb"


def code_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


# --------------------------------------------------------------------------
# The grader, without a notebook
# --------------------------------------------------------------------------


def test_check_prints_pass_and_fail_with_expected_and_got(capsys):
    grader = Grader("t", quiet=False)
    assert grader.check("adds up", 1 + 1 == 2, expected=2, got=2)
    assert not grader.check("joins", False, expected="'ab'", got="'a'")
    out = capsys.readouterr().out.splitlines()
    assert out == ["PASS adds up", "FAIL joins: expected 'ab', got 'a'"]
    assert grading.check("module-level check uses the current grader", True)
    assert "module-level check uses the current grader" in grader.results


def test_section_fails_every_check_it_did_not_reach(tmp_path):
    results = tmp_path / "r.json"
    grader = Grader("t", results, quiet=True)

    def push(token_id):
        raise NotImplementedError("push: return the text")

    with grader.section("first", "second", "third"):
        grader.check("first", True)
        push(1)
        grader.check("second", True)  # never reached
    data = json.loads(results.read_text())
    assert [(c["name"], c["passed"]) for c in data["checks"]] == [("first", True), ("second", False), ("third", False)]
    assert data["checks"][1]["message"] == "not implemented yet: push: return the text"
    assert (data["passed"], data["total"]) == (1, 3)


def test_section_names_other_errors_and_where_they_came_from():
    grader = Grader("t", quiet=True)

    def student_code():
        return len(None)

    with grader.section("len"):
        student_code()
    message = grader.results["len"].message
    assert message.startswith("raised TypeError: ") and "in student_code, line" in message

    def flush():
        raise NotImplementedError

    with grader.section("bare"):
        flush()
    assert grader.results["bare"].message == "not implemented yet: flush raises NotImplementedError"


def test_a_rerun_check_replaces_its_earlier_result():
    grader = Grader("t", quiet=True)
    grader.check("a", False, 1, 2)
    grader.check("b", True)
    grader.check("a", True)
    assert [(r.name, r.passed) for r in grader.results.values()] == [("b", True), ("a", True)]


def test_summary_records_soft_checks_and_prints_a_table(tmp_path, capsys):
    grader = Grader("ex0 demo", tmp_path / "r.json", quiet=True)
    grader.check("hard", True)
    with grader.section("soft one", soft=["soft one"]):
        raise ValueError("no words")
    data = grader.summary()
    out = capsys.readouterr().out
    assert "FAIL* soft one  raised ValueError: no words" in out
    assert data["headline"] == "ex0 demo: 1/2 checks passed"
    assert json.loads((tmp_path / "r.json").read_text())["checks"][1]["soft"] is True


def test_long_values_are_cut_in_messages():
    grader = Grader("t", quiet=True)
    grader.check("long", False, expected="x" * 1000, got="y")
    message = grader.results["long"].message
    assert len(message) < 400 and "(1000 characters)" in message


def test_try_it_returns_the_value_or_says_why_not(capsys):
    assert grading.try_it(lambda: [1, 2]) == [1, 2]

    def flush():
        raise NotImplementedError("flush: not yet")

    assert grading.try_it(flush) is None
    assert capsys.readouterr().out.strip() == "not implemented yet: flush: not yet"


class FakeBackend:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


class FakeTokenizer:
    backend_tokenizer = FakeBackend()
    clean_up_tokenization_spaces = False

    def decode(self, ids, skip_special_tokens=True):
        return self.backend_tokenizer.decode(ids)


def test_counting_tokenizer_counts_every_way_of_decoding():
    counting = CountingTokenizer(FakeTokenizer())
    assert counting.decode([1, 2, 3]) == "bcd"
    assert counting.backend_tokenizer.decode([0] * 7) == "a" * 7
    assert counting.clean_up_tokenization_spaces is False  # everything else is the real tokenizer's
    assert counting.sizes == [3, 7]


def test_the_library_detokenizer_stays_within_the_window_the_check_allows():
    """The exercise's bound (16 ids per decode call) is one the course's own detokenizer meets."""
    from streamlab.model.detokenizer import Detokenizer

    counting = CountingTokenizer(FakeTokenizer())
    detok = Detokenizer(counting)
    for i in range(4096):
        detok.push(i)
    assert max(counting.sizes) <= 16


def test_solution_for_maps_notebooks_to_modules():
    assert solution_for(Path("students/alice/ex4_watch_for_eof.ipynb")) == SOLUTIONS / "ex4.py"
    with pytest.raises(ValueError):
        solution_for(Path("chapter.ipynb"))


# --------------------------------------------------------------------------
# The notebooks as handed out
# --------------------------------------------------------------------------


def test_every_exercise_has_a_solution():
    assert [nb.stem for nb in exercises()] == NAMES
    for nb in exercises():
        assert solution_for(nb).is_file(), nb.name
    assert sorted(p.name for p in SOLUTIONS.glob("*.py")) == sorted(f"ex{number_of(name)}.py" for name in NAMES)


def test_the_teachers_page_names_every_exercise_and_every_chapter():
    """One row per exercise, in order, and every chapter named by at least one of them."""
    readme = (EXERCISES / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| \[(ex\d+_\w+)\]\(\2\.ipynb\) \| (\d+) min \|(.*)\|$", readme, re.M)
    assert [name for _, name, _, _ in rows] == NAMES
    assert [int(number) for number, _, _, _ in rows] == [number_of(name) for name in NAMES]
    named = {int(n) for *_, rest in rows for n in re.findall(r"\]\(\.\./(\d\d)_\w+\.ipynb\)", rest)}
    every = set(range(1, len(chapters()) + 1))
    assert named >= every, f"no exercise for chapters {sorted(every - named)}"
    for *_, rest in rows:
        for link in re.findall(r"\]\(\.\./(\d\d_\w+\.ipynb)\)", rest):
            assert (EXERCISES.parent / link).is_file(), link
    counts = ["One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten", "Eleven", "Twelve",
              "Thirteen", "Fourteen", "Fifteen"]
    assert f"{counts[len(NAMES) - 1]} exercises" in readme, "the page's count of exercises"


@pytest.mark.parametrize("name", NAMES)
def test_layout_parameters_student_cell_hook_and_no_outputs(name):
    nb = nbformat.read(notebook(name), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    assert re.search(r"^solution = None\b", params[0].source, re.M)
    assert re.search(r"^results_path = None\b", params[0].source, re.M)
    student = [i for i, c in enumerate(code) if c.source.startswith("# YOUR CODE HERE")]
    assert len(student) == 1, "exactly one cell for the student"
    assert "raise NotImplementedError" in code[student[0]].source
    hook = code[student[0] + 1].source
    assert "if solution:" in hook and "exec(Path(solution).read_text(" in hook
    assert "grader.summary()" in code[-1].source
    assert all(not c.outputs and c.execution_count is None for c in code), "store notebooks without outputs"
    assert re.search(r"\]\(\.\./\d\d_\w+\.ipynb\)", nb.cells[0].source), "the brief links its chapter"


# Lines the students' skeletons give them, which the model answers keep.
SCAFFOLD = {"self.tokenizer = tokenizer", "self.max_queued = max_queued",
            "self.slow_reader_timeout = slow_reader_timeout"}


def distinctive_lines(solution: Path) -> set[str]:
    """The code lines of a model answer worth hiding: no docstrings, imports, comments or scaffold."""
    source = solution.read_text(encoding="utf-8")
    lines: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for statement in body:
            if isinstance(statement, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
                continue
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                continue  # a docstring
            for line in (ast.get_source_segment(source, statement) or "").splitlines():
                line = line.strip()
                if len(line) >= 20 and not line.startswith("#") and line not in SCAFFOLD:
                    lines.add(line)
    assert lines, solution
    return lines


def bodies(solution: Path) -> list[str]:
    """Each function of a model answer, its body with whitespace squeezed: what a leak would paste."""
    source = solution.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = "\n".join(ast.get_source_segment(source, s) or "" for s in node.body)
            found.append(" ".join(body.split()))
    return found


def assert_no_solution_code(path: Path) -> None:
    code = "\n".join(code_cells(path))
    leaked = sorted(line for line in distinctive_lines(solution_for(path)) if line in code)
    assert not leaked, f"{path.name} holds lines of its model answer: {leaked[:3]}"
    squeezed = " ".join(code.split())
    for solution in SOLUTIONS.glob("*.py"):
        for body in bodies(solution):
            assert body not in squeezed, f"{path.name} holds a function body of solutions/{solution.name}"


def test_no_solution_code_in_the_exercise_notebooks():
    for nb in exercises():
        assert_no_solution_code(nb)


@pytest.mark.parametrize("name", NAMES)
def test_the_leak_check_finds_a_pasted_answer(tmp_path, name):
    nb = nbformat.read(notebook(name), as_version=4)
    student = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("# YOUR CODE HERE"))
    student.source += "\n" + solution_for(notebook(name)).read_text(encoding="utf-8")
    pasted = tmp_path / notebook(name).name
    nbformat.write(nb, pasted)
    with pytest.raises(AssertionError, match="model answer"):
        assert_no_solution_code(pasted)


def test_student_copy_has_no_solutions_and_no_outputs(tmp_path):
    dest = tmp_path / "build" / "exercises"
    (dest / "solutions").mkdir(parents=True)
    (dest / "solutions" / "ex1.py").write_text("stale")  # a copy made by hand earlier must not survive
    written = build_student_copy(dest)
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    chapter_files = [f"chapters/{nb.name}" for nb in chapters()]
    assert files == sorted([f"{n}.ipynb" for n in NAMES] + ["Makefile", "README.md"] + chapter_files)
    assert sorted(p.relative_to(dest).as_posix() for p in written) == files
    assert not {p.name for p in SOLUTIONS.iterdir()} & {p.name for p in dest.rglob("*")}
    for path in dest.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None
        assert_no_solution_code(path)

    readme = (dest / "README.md").read_text(encoding="utf-8")
    for link in re.findall(r"\]\(([^)]+\.ipynb)\)", readme):
        assert (dest / link).resolve().is_file(), f"README link {link} leads nowhere from the copy"


def markdown_links(path: Path) -> list[str]:
    if path.suffix == ".md":
        text = path.read_text(encoding="utf-8")
    else:
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    return [link for link in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"^([a-z]+:|#)", link)]


def test_student_copy_names_no_solution_and_its_links_resolve_from_the_copy(tmp_path):
    build_student_copy(tmp_path / "made")
    dest = tmp_path / "elsewhere" / "exercises"  # handed out: the copy alone, moved away from the repository
    dest.parent.mkdir()
    (tmp_path / "made").rename(dest)
    readme = (dest / "README.md").read_text(encoding="utf-8")
    teacher = (EXERCISES / "README.md").read_text(encoding="utf-8")
    assert readme != teacher and len(readme.splitlines()) < len(teacher.splitlines())
    assert "# YOUR CODE HERE" in readme and "python -m streamlab.book.grading ex1_detokenizer.ipynb" in readme
    for path in [dest / "README.md", *dest.glob("ex*.ipynb")]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"solution|model answer|--solutions", text, re.I), f"{path.name} tells of the solutions"
    for path in [dest / "README.md", *dest.glob("ex*.ipynb"), *dest.glob("chapters/*.ipynb")]:
        for link in markdown_links(path):
            target = (path.parent / link.partition("#")[0]).resolve()
            assert target.is_file() and dest.resolve() in target.parents, f"{path.name}: {link} leads out of the copy"
    for name in NAMES:
        links = markdown_links(dest / f"{name}.ipynb")
        assert any(re.fullmatch(r"chapters/\d\d_\w+\.ipynb", link) for link in links), f"{name} links its chapter"
    assert set(re.findall(r"\]\((ex\d+_\w+)\.ipynb\)", readme)) == set(NAMES), "the README lists every exercise"


@pytest.mark.notebook
def test_the_student_copy_still_grades_without_the_hook(tmp_path):
    """The copy has no solution parameter and no hook cell; graded unsolved, every check fails for its reason."""
    build_student_copy(tmp_path / "copy")
    nb = nbformat.read(tmp_path / "copy" / "ex6_persist_partial.ipynb", as_version=4)
    assert not any("solution" in c.source for c in nb.cells)
    graded = grade_notebook(tmp_path / "copy" / "ex6_persist_partial.ipynb", out_dir=tmp_path / "graded")
    assert not graded["crashed"] and graded["total"] >= 5 and graded["passed"] == 0
    assert all(c["message"].startswith("not implemented yet") for c in graded["checks"])


def test_make_exercises_builds_the_student_copy():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^\.PHONY:.*\bexercises\b", makefile, re.M)
    dry = subprocess.run(["make", "-n", "exercises"], cwd=REPO, capture_output=True, text=True, check=True)
    assert "-m streamlab.book.grading --student-copy build/exercises" in dry.stdout


def test_cli_student_copy(tmp_path, capsys):
    assert grading.main(["--student-copy", str(tmp_path / "copy")]) == 0
    out = capsys.readouterr().out
    assert "no solutions" in out and len(out.splitlines()) == 1, "one line, not a path per file"
    assert (tmp_path / "copy" / "ex1_detokenizer.ipynb").is_file()


def tiny_exercise(folder: Path) -> Path:
    """An exercise of one check, for grading without an exercise's set-up."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    parameters = nbformat.v4.new_code_cell("results_path = None")
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, nbformat.v4.new_code_cell(
        "from streamlab.book.grading import Grader\n"
        "grader = Grader('ex0 tiny', results_path)\n"
        "grader.check('one and one make two', 1 + 1 == 2)\n"
        "grader.summary();")]
    path = folder / "ex0_tiny.ipynb"
    nbformat.write(nb, path)
    return path


def test_the_kernels_of_grading_and_the_chapters_get_curve_keys_where_they_can():
    import zmq
    from jupyter_client import KernelManager

    from streamlab.book import notebooks

    config = notebooks.kernel_config()
    if "transport_encryption" in KernelManager.class_trait_names() and zmq.has("curve"):
        assert config.KernelManager.transport_encryption == "auto"
    else:
        assert "KernelManager" not in config


@pytest.mark.notebook
def test_grading_says_where_the_notebook_went_and_the_kernel_does_not_warn(tmp_path, capfd, monkeypatch):
    """One line names the executed copy; ipykernel's "running over TCP without encryption" stays out.

    The kernel writes its warning to the stderr it inherits, which ``capfd`` reads; graded again with the
    kernel settings of before, the warning is there, so its absence is this setting's doing.
    """
    import zmq

    notebook = tiny_exercise(tmp_path)
    assert grading.main(["--out", str(tmp_path / "graded"), str(notebook)]) == 0
    captured = capfd.readouterr()
    executed = tmp_path / "graded" / f"{tmp_path.name}_ex0_tiny.ipynb"
    assert f"  executed notebook: {executed}\n" in captured.out and executed.is_file()
    assert "without encryption" not in captured.err + captured.out
    if not zmq.has("curve"):
        pytest.skip("pyzmq without CurveZMQ: the kernel still warns here")

    from traitlets.config import Config

    from streamlab.book import notebooks

    monkeypatch.setattr(notebooks, "kernel_config", Config)
    assert grading.main(["--out", str(tmp_path / "graded"), str(notebook)]) == 0
    assert "without encryption" in capfd.readouterr().err


# --------------------------------------------------------------------------
# Executed: solved every check passes, unsolved every check fails, with its reason
# --------------------------------------------------------------------------


def assert_grading_can_fail(name: str, tmp_path: Path, **parameters) -> tuple[dict, dict]:
    path = notebook(name)
    unsolved = grade_notebook(path, out_dir=tmp_path / "unsolved", parameters=parameters)
    solved = grade_notebook(path, solution=solution_for(path), out_dir=tmp_path / "solved", parameters=parameters)
    for run in (solved, unsolved):
        assert not run["crashed"], f"{run['executed']}: {run['crashed']}"
    names = [c["name"] for c in solved["checks"]]
    assert len(names) >= 5 and len(set(names)) == len(names)
    assert [c["name"] for c in unsolved["checks"]] == names, "the same checks, solved or not"

    failing = [c for c in solved["checks"] if not c["passed"]]
    assert not failing, "with the model answer:\n" + grading.format_table(failing)

    passing = [c["name"] for c in unsolved["checks"] if c["passed"]]
    assert not passing, f"passed with nothing written: {passing}"
    for c in unsolved["checks"]:
        message = c["message"]
        specific = re.fullmatch(r"not implemented yet: .{10,}", message) or re.fullmatch(
            r"expected .{5,}, got .*", message, re.S
        )
        assert specific, f"{c['name']}: message {message!r} does not say what went wrong"
    # The executed notebook shows the same, one line per check.
    executed = nbformat.read(unsolved["executed"], as_version=4)
    printed = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    for n in names:
        assert f"FAIL {n}: " in printed or f"FAIL (soft) {n}: " in printed, n
    return solved, unsolved


@pytest.mark.notebook
def test_ex1_detokenizer(tmp_path):
    assert_grading_can_fail("ex1_detokenizer", tmp_path)


@pytest.mark.notebook
def test_ex2_sse_parser(tmp_path):
    assert_grading_can_fail("ex2_sse_parser", tmp_path)


@pytest.mark.notebook
def test_ex2_a_wrong_parser_fails_the_checks_it_should(tmp_path):
    """A parser that knows only LF and never heard of BOMs or sticky ids: the checks say exactly where."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "class SSEParser:\n"
        "    def __init__(self):\n"
        "        self.buffer = b''\n"
        "    def feed(self, chunk):\n"
        "        self.buffer += chunk\n"
        "        *blocks, self.buffer = self.buffer.split(b'\\n\\n')\n"
        "        events = []\n"
        "        for block in blocks:\n"
        "            fields = dict(line.decode().split(': ', 1) for line in block.split(b'\\n') if b': ' in line)\n"
        "            if 'data' in fields:\n"
        "                events.append((fields.get('event', 'message'), fields['data'], fields.get('id', '')))\n"
        "        return events\n",
        encoding="utf-8",
    )
    result = grade_notebook(notebook("ex2_sse_parser"), solution=wrong, out_dir=tmp_path)
    outcome = {c["name"]: c for c in result["checks"]}
    assert outcome["one event, LF line ends"]["passed"]
    assert outcome["event type and id"]["passed"]
    for name in ("CRLF line ends", "a byte order mark at the start", "the id stays for later events",
                 "multi-line data is joined with \\n", "200 random splits give the reference events"):
        assert not outcome[name]["passed"], name
        assert outcome[name]["message"].startswith("expected "), outcome[name]["message"]
    assert "got [('message', 'line two', '')]" in outcome["multi-line data is joined with \\n"]["message"]


@pytest.mark.notebook
def test_ex3_websocket_frames_through_the_command_line(tmp_path, capsys):
    """The teacher's command: exit 0 with the answers, 1 without; a table either way."""
    path = notebook("ex3_websocket_frames")
    assert grading.main(["--solutions", str(SOLUTIONS), "--out", str(tmp_path / "a"), str(path)]) == 0
    out = capsys.readouterr().out
    assert "9/9 checks passed" in out and "PASS  encode a masked text frame: Hello, key 37 fa 21 3d" in out
    assert f"executed notebook: {tmp_path / 'a' / 'exercises_ex3_websocket_frames.ipynb'}" in out
    report = tmp_path / "class.json"
    assert grading.main(["--out", str(tmp_path / "b"), "--json", str(report), str(path)]) == 1
    out = capsys.readouterr().out
    assert "0/9 checks passed" in out and "FAIL  decode the masked Hello" in out
    assert json.loads(report.read_text())[0]["failed"] == 9


@pytest.mark.notebook
def test_ex3_websocket_frames(tmp_path):
    assert_grading_can_fail("ex3_websocket_frames", tmp_path)


@pytest.mark.notebook
@pytest.mark.model
def test_ex4_watch_for_eof(tmp_path, servers):
    solved, _ = assert_grading_can_fail(
        "ex4_watch_for_eof", tmp_path, server_port=servers().port, naive_server_port=servers("--naive").port
    )
    assert solved["total"] == 5


@pytest.mark.notebook
@pytest.mark.model
def test_ex5_first_event(tmp_path, servers):
    solved, unsolved = assert_grading_can_fail("ex5_first_event", tmp_path, server_port=servers().port)
    soft = [c["name"] for c in solved["checks"] if c["soft"]]
    assert soft == ["the explanation mentions the buffer and the head"]


@pytest.mark.notebook
def test_ex6_persist_partial(tmp_path):
    assert_grading_can_fail("ex6_persist_partial", tmp_path)


@pytest.mark.notebook
def test_ex7_reading_pace(tmp_path):
    assert_grading_can_fail("ex7_reading_pace", tmp_path)


@pytest.mark.notebook
def test_ex8_follow_a_resumable_answer(tmp_path):
    assert_grading_can_fail("ex8_follow_a_resumable_answer", tmp_path)


@pytest.mark.notebook
@pytest.mark.browser
def test_ex9_keep_strangers_out(tmp_path):
    from streamlab.lab.outside import headless

    if headless.unavailable_reason():
        pytest.skip(f"no headless Chromium: {headless.unavailable_reason()}")
    assert_grading_can_fail("ex9_keep_strangers_out", tmp_path)


@pytest.mark.notebook
def test_ex10_openai_chunks(tmp_path):
    assert_grading_can_fail("ex10_openai_chunks", tmp_path)


@pytest.mark.notebook
def test_ex11_slow_reader(tmp_path):
    assert_grading_can_fail("ex11_slow_reader", tmp_path)


@pytest.mark.notebook
def test_ex12_flushing_gzip(tmp_path):
    assert_grading_can_fail("ex12_flushing_gzip", tmp_path)


@pytest.mark.notebook
def test_ex12_a_compressor_without_the_flush_holds_the_stream(tmp_path):
    """Valid gzip that compresses well, and yet the reader gets the answer in one read: the checks say which."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "import zlib\n"
        "class FlushingGzip:\n"
        "    def __init__(self):\n"
        "        self.z = zlib.compressobj(6, zlib.DEFLATED, 31)\n"
        "    def feed(self, data):\n"
        "        return self.z.compress(data)\n"
        "    def finish(self):\n"
        "        return self.z.flush()\n",
        encoding="utf-8",
    )
    result = grade_notebook(notebook("ex12_flushing_gzip"), solution=wrong, out_dir=tmp_path)
    outcome = {c["name"]: c for c in result["checks"]}
    for name in ("the whole body is one valid gzip stream", "two responses at once do not mix",
                 "it still compresses: under 60% of what went in",
                 "the reader gets the whole answer through your compressor", "the body is gzip on the wire"):
        assert outcome[name]["passed"], name
    for name in ("each event is readable right after its feed", "your compressor lets the stream flow"):
        assert not outcome[name]["passed"], name
    assert outcome["each event is readable right after its feed"]["message"].endswith("got 0 of 50")
    assert outcome["your compressor lets the stream flow"]["message"].endswith("got 1 read")


@pytest.mark.notebook
def test_ex13_follow_across_replicas(tmp_path):
    assert_grading_can_fail("ex13_follow_across_replicas", tmp_path)


@pytest.mark.notebook
def test_ex13_ids_compared_as_text_lose_the_pieces_past_nine(tmp_path):
    """The model answer with its ids compared as strings: '…-10' sorts before '…-9', and the checks say where."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(solution_for(notebook("ex13_follow_across_replicas")).read_text(encoding="utf-8").replace(
        "entry_order(event_id) <= entry_order(last_id)", "event_id <= last_id"), encoding="utf-8")
    result = grade_notebook(notebook("ex13_follow_across_replicas"), solution=wrong, out_dir=tmp_path)
    failed = sorted(c["name"] for c in result["checks"] if not c["passed"])
    assert "ids past -9 in one millisecond: every piece kept" in failed, failed
    assert "every replica says 404: LookupError" not in failed and "a replica that starts over: each id once" not in failed


@pytest.mark.notebook
def test_ex14_six_connections(tmp_path):
    assert_grading_can_fail("ex14_six_connections", tmp_path)


@pytest.mark.notebook
def test_ex14_one_limit_for_every_origin_is_caught(tmp_path):
    """Six connections in all instead of six per origin: right for one origin, wrong for two."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(solution_for(notebook("ex14_six_connections")).read_text(encoding="utf-8").replace(
        'frees.setdefault(stream["origin"], [])', 'frees.setdefault("every origin", [])'), encoding="utf-8")
    result = grade_notebook(notebook("ex14_six_connections"), solution=wrong, out_dir=tmp_path)
    outcome = {c["name"]: c for c in result["checks"]}
    assert outcome["eight at once over HTTP/1.1: the 7th and 8th wait for the first two ends"]["passed"]
    assert not outcome["four and four to two origins: none waits"]["passed"]
    assert outcome["four and four to two origins: none waits"]["message"].endswith("1.2, 1.2]")


@pytest.mark.notebook
def test_ex15_utf8_reader(tmp_path):
    assert_grading_can_fail("ex15_utf8_reader", tmp_path)


@pytest.mark.notebook
def test_ex15_the_standard_librarys_incremental_decoder_waits_where_it_must_not(tmp_path):
    """codecs' decoder is right at the end, but keeps a surrogate's first bytes waiting: the checks say which."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "import codecs\n"
        "class Utf8Reader:\n"
        "    def __init__(self):\n"
        "        self.decoder = codecs.getincrementaldecoder('utf-8')('replace')\n"
        "    def feed(self, data):\n"
        "        return self.decoder.decode(data)\n"
        "    def finish(self):\n"
        "        return self.decoder.decode(b'', final=True)\n",
        encoding="utf-8",
    )
    result = grade_notebook(notebook("ex15_utf8_reader"), solution=wrong, out_dir=tmp_path)
    failed = sorted(c["name"] for c in result["checks"] if not c["passed"])
    assert failed == ["a surrogate's first two bytes are not waited for", "you keep one unfinished character at most"]
