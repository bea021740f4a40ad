"""The package as a user installs it: a wheel that carries its data, and a library that runs without the checkout.

An editable install reads the repository, so a missing piece of package data
(the prompts, the page) only shows once someone runs ``pip install .``. Here
the wheel is built, installed (not editable) into a folder of its own, and a
fresh interpreter that cannot see the repository loads the model and runs
chapter 1's first experiment from it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Both tests here in one worker, one build.
pytestmark = pytest.mark.xdist_group("wheel")
# What a wheel is made of. setuptools builds in its source tree (build/, *.egg-info), and build/ is the book's:
# the wheel is built from a copy of these in a folder of its own, never in the checkout.
SOURCES = ("pyproject.toml", "README.md", "streamlab", "data")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, source / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        capture_output=True, text=True, cwd=out,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("streamlab-*.whl")
    return built


def test_the_wheel_carries_the_prompts_and_the_page(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        prompts = json.loads(archive.read("streamlab/data/prompts.json"))
    assert prompts == json.loads((REPO / "data" / "prompts.json").read_text(encoding="utf-8"))
    assert {"streamlab/static/index.html", "streamlab/static/app.js", "streamlab/static/style.css"} <= names
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "benchmarks/"))]


@pytest.mark.model
def test_an_installed_wheel_loads_the_model_and_runs_chapter_1s_first_experiment(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    script = """
import streamlab
from streamlab.model.loading import load_model
from streamlab.lab.results.records import load_prompts
from streamlab.model.detokenizer import Detokenizer, NaiveDetokenizer, detokenize, broken_pieces
lm = load_model()
sentence = "Con v\u1eb9t \U0001f99c n\u00f3i: m\u00f4 h\u00ecnh sinh v\u0103n b\u1ea3n t\u1eebng token m\u1ed9t \U0001fae0"
ids = lm.tokenizer(sentence, add_special_tokens=False)["input_ids"]
naive = detokenize(NaiveDetokenizer(lm.tokenizer), ids)
incremental = detokenize(Detokenizer(lm.tokenizer), ids)
print(streamlab.__file__)
print(len(load_prompts()), broken_pieces(naive), broken_pieces(incremental), "".join(incremental) == sentence)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    where, figures = done.stdout.strip().splitlines()[-2:]
    assert Path(where).resolve().is_relative_to(target.resolve()), where  # the installed copy, not the checkout
    count, naive_broken, incremental_broken, equal = figures.split()
    assert int(count) == 20
    assert int(naive_broken) > 0 and int(incremental_broken) == 0 and equal == "True"
