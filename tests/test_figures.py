"""A chapter's figures are saved as it runs: executed by papermill, as run-notebooks executes a chapter.

Two small notebooks: one that calls ``save_figures(results_path)`` in its first
cell, and one that never does (a new chapter) and still gets the figures it draws
with ``streamlab.book.plots`` saved. Shown by ``plt.show()`` in the middle of a cell
or at a cell's end, each figure lands once, in order, as PNG and SVG, in
``figures/<chapter>/`` beside the run's ``results/``, and nowhere else. And every
chapter of the book draws through ``streamlab.book.plots`` (nothing by hand), so its
figures share one style and are saved.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import re

import nbformat
import pytest

from streamlab.book.notebooks import chapters, execute

# Drawing by hand in a chapter: what streamlab.book.plots is for (one style, readable at the notebook's width).
BY_HAND = re.compile(r"\.(plot|bar|barh|scatter|hist|step|hlines|vlines|axhline|axvline|annotate|set_xlabel|set_ylabel|"
                     r"set_title|tight_layout)\(|figsize=")

CELLS = [
    "import matplotlib.pyplot as plt\nfrom streamlab.book import plots\n{setup}",
    'plots.ttft_chart({"/complete": (3.9, 3.9), "/stream (SSE)": (0.24, 4.07)}, title="First text and end")\nplt.show()\nprint("after the figure")',
    'plots.gap_ecdf({"/stream": [0.1, 0.12, 0.3]}, title="Gaps, shown at the end of the cell");',
    'fig, ax = plt.subplots()\nax.plot([1, 2])\nax.set_title("Drawn with plt alone")\nax.set_xlabel("x (s)")\nax.set_ylabel("y (s)")\nplt.show()',
    'from streamlab.book.chapter import record\nrecord(results_path, "99 figures: done")',
]


def chapter(folder: Path, name: str, setup: str) -> Path:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                            "language_info": {"name": "python"}})
    parameters = nbformat.v4.new_code_cell("results_path = None")
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, *(nbformat.v4.new_code_cell(c.replace("{setup}", setup)) for c in CELLS)]
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, str(path))
    return path


@pytest.mark.parametrize("notebook", chapters(), ids=lambda p: p.stem)
def test_every_chapter_draws_through_plots_and_saves_what_it_shows(notebook):
    cells = [c for c in nbformat.read(str(notebook), as_version=4).cells if c.cell_type == "code"]
    code = "\n".join(c.source for c in cells)
    by_hand = [line.strip() for line in code.splitlines() if BY_HAND.search(line)]
    assert by_hand == [], f"{notebook.name} draws by hand; move it into streamlab/book/plots.py"
    # Saved from the first cell's save_figures call, or else from the first streamlab.book.plots chart (figures.autosave).
    draws_with_plots = re.search(r"streamlab\.book\.plots|from streamlab\.book import .*\bplots\b", code)
    assert "save_figures(results_path)" in code or draws_with_plots, f"{notebook.name}: its figures would not be saved"


@pytest.mark.notebook
@pytest.mark.parametrize("setup", ["from streamlab.book.figures import save_figures\nsave_figures(results_path)", ""],
                         ids=["save_figures in the first cell", "a chapter that never asked"])
def test_every_figure_shown_is_saved_once_in_order(tmp_path, setup):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    out = tmp_path / "run"
    stale = out / "figures" / "99_figures" / "07-from-an-earlier-run.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    assert execute(chapter(notebooks, "99_figures", setup), out_dir=out, timeout=300)["headline"] == "99 figures: done"
    saved = sorted(p.name for p in (out / "figures" / "99_figures").iterdir())
    expected = ["01-first-text-and-end", "02-gaps-shown-at-the-end-of-the-cell", "03-drawn-with-plt-alone"]
    # Without the call, saving starts at the first plots chart: the plt-only figure after it is saved too.
    assert saved == sorted(f"{n}.{ext}" for n in expected for ext in ("png", "svg"))
    png = (out / "figures" / "99_figures" / "01-first-text-and-end.png").read_bytes()
    executed = json.loads((out / "notebooks" / "99_figures.ipynb").read_text(encoding="utf-8"))
    shown = [o["data"]["image/png"] for c in executed["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(shown) == 3
    assert base64.b64decode(shown[0]) == png  # the very PNG the notebook shows, not a second rendering
    assert sorted(p.name for p in notebooks.iterdir()) == ["99_figures.ipynb"]  # nothing written beside the chapter


def test_a_figure_shown_carries_its_title_as_alt_text(tmp_path, monkeypatch):
    """What the hook hands IPython for a figure: the PNG as drawn, and the title as its alt text (one line).

    A stand-in shell with IPython's own display formatter, so no kernel and no history file is needed;
    the executed notebook files what comes back as the output's metadata, and the book's pages read it.
    """
    import types

    import IPython
    import matplotlib

    matplotlib.use("Agg")
    from IPython.core.formatters import DisplayFormatter
    from IPython.core.pylabtools import print_figure, retina_figure
    from matplotlib.figure import Figure

    from streamlab.book import figures, plots

    import matplotlib.pyplot as plt

    shell = types.SimpleNamespace(display_formatter=DisplayFormatter(), user_ns={},
                                  events=types.SimpleNamespace(register=lambda *a: None))
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.setattr(figures, "_active", None)
    monkeypatch.setattr(plt, "_REPL_DISPLAYHOOK", plt._REPL_DISPLAYHOOK)  # pyplot hooks our stand-in: undone after
    png = shell.display_formatter.formatters["image/png"]
    for drawn in (lambda fig: print_figure(fig, "png"), retina_figure):  # retina answers (data, metadata)
        png.for_type(Figure, drawn)
        saver = figures.save_figures(tmp_path / "results" / "99_figures.json")
        ax = plots.ttft_chart({"/complete": (3.9, 3.9), "/stream": (0.2, 4.0)}, title="First text\nand the end")
        data, metadata = shell.display_formatter.format(ax.figure)
        assert metadata["image/png"]["alt"] == "First text and the end"
        shown = data["image/png"]  # bytes here; a kernel sends them base64-encoded
        assert (base64.b64decode(shown) if isinstance(shown, str) else shown) == saver.saved[0].read_bytes()
        plt.close(ax.figure)
    assert metadata["image/png"]["width"] > 0  # the retina formatter's own metadata is kept
    untitled = Figure()
    untitled.add_subplot().plot([1, 2])
    assert "alt" not in shell.display_formatter.format(untitled)[1].get("image/png", {})  # no title: none made up
