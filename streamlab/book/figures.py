"""Every figure a chapter shows, also saved as PNG and SVG under ``build/figures/NN_name/``.

A teacher wants the chapters' charts on slides without screenshotting a
notebook. One call in a chapter's first code cell, ``save_figures(results_path)``,
hooks IPython's display of matplotlib figures: whenever the notebook shows a
figure, the PNG it shows is written as it is (no second rendering) and an SVG
beside it, named ``NN-what-it-shows`` from the figure's title (its order in
the chapter, then the title slugified). The cells stay as a reader would
write them: draw, and the figure is shown and kept.

The title also goes into the displayed PNG's metadata as its ``alt`` text
(``{"image/png": {"alt": ...}}`` in the notebook), which nbconvert writes
into the ``<img>`` of ``python -m streamlab book``'s pages: a screen reader
says what the chart shows, not nbconvert's "No description has been
provided for this image".

The folder is the chapter's own: ``figures/<stem>/`` beside the ``results/``
folder ``run-notebooks`` records into (so a test's run writes into its own
temporary folder), or, opened by hand in Jupyter, ``build/figures/<notebook>/``.
Nothing is written outside that folder.
"""

from __future__ import annotations

import base64
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

BUILD = Path(__file__).resolve().parents[2] / "build"
FORMATS = ("png", "svg")


def slug(text: str, limit: int = 60) -> str:
    """A file name for a title: lower case ASCII words joined by dashes."""
    ascii_ = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    words = re.sub(r"[^a-z0-9]+", "-", ascii_.lower()).strip("-")
    return (words[:limit].rstrip("-") or "figure")


def title_of(fig: Any) -> str:
    """What a figure shows, in words: its label if given, else its suptitle, else its panels' titles."""
    label = fig.get_label()
    if label:
        return label
    if fig._suptitle is not None and fig._suptitle.get_text():
        return fig._suptitle.get_text()
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    return " + ".join(titles[:2]) if titles else "figure"


def alt_text(fig: Any) -> str | None:
    """What a figure's image says to a reader who cannot see it: its title on one line, or None without one."""
    title = " ".join(title_of(fig).split())
    return None if title == "figure" and not fig.get_label() else title


def notebook_name() -> str | None:
    """The running notebook's name where Jupyter or VS Code says it, else None."""
    session = os.environ.get("JPY_SESSION_NAME")
    if session:
        return Path(session).stem
    try:
        from IPython import get_ipython

        path = (get_ipython().user_ns or {}).get("__vsc_ipynb_file__")  # type: ignore[union-attr]
        return Path(path).stem if path else None
    except Exception:  # noqa: BLE001 - not in IPython
        return None


def folder_for(results_path: str | Path | None, chapter: str | None = None) -> Path:
    """``figures/<chapter>/`` beside the results folder when there is one, else under build/."""
    if results_path:
        path = Path(results_path).resolve()
        return path.parent.parent / "figures" / path.stem
    return BUILD / "figures" / (chapter or notebook_name() or "scratch")


class FigureSaver:
    """Writes each figure the notebook displays into one folder, once per figure, in the order shown."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.shown = 0  # figures named so far: the next one's order in the chapter
        self.saved: list[Path] = []

    def clear(self) -> None:
        """Forget the figures of an earlier run of this chapter, so the folder is this run's."""
        if self.folder.is_dir():
            for old in self.folder.iterdir():
                if old.suffix.lstrip(".") in FORMATS:
                    old.unlink()

    def name(self, fig: Any) -> str:
        """The figure's file name, given the first time it is shown and kept on the figure itself.

        Not a table keyed by ``id(fig)``: a closed figure's id is reused by the
        next one, which would then overwrite the first's files.
        """
        name = getattr(fig, "_streamlab_figure_name", None)
        if name is None or not name.startswith(f"{self.folder}:"):
            self.shown += 1
            name = f"{self.folder}:{self.shown:02d}-{slug(title_of(fig))}"
            fig._streamlab_figure_name = name
        return name.rsplit(":", 1)[1]

    def save(self, fig: Any, png: bytes | str | None = None) -> Path:
        """Write ``fig`` as PNG (``png``: the bytes already rendered for display) and SVG; return the PNG's path."""
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = self.folder / self.name(fig)
        if isinstance(png, str):  # IPython may hand the PNG over base64-encoded
            png = base64.b64decode(png)
        if png:
            stem.with_suffix(".png").write_bytes(png)
        else:
            fig.savefig(stem.with_suffix(".png"), bbox_inches="tight")
        # The display has just laid the figure out; laying it out again for the SVG would double the time a
        # chapter spends here, so a figure with a layout engine is written as it stands (nothing spills out).
        engine = fig.get_layout_engine()
        if engine is not None:
            fig.set_layout_engine("none")
        try:
            fig.savefig(stem.with_suffix(".svg"), bbox_inches=None if engine is not None else "tight")
        finally:
            if engine is not None:
                fig.set_layout_engine(engine)
        path = stem.with_suffix(".png")
        if path not in self.saved:
            self.saved.append(path)
        return path


_active: FigureSaver | None = None


def autosave() -> None:
    """Start saving at a chapter's first chart when its first cell did not call ``save_figures``.

    ``streamlab.book.plots`` calls this whenever it draws: a chapter (a new one, a
    student's copy) that never asked still gets its figures saved, into the
    folder its ``results_path`` parameter names. Outside IPython, or once
    saving has started, it does nothing.
    """
    if _active is not None:
        return
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and "results_path" in (shell.user_ns or {}):
        save_figures(shell.user_ns["results_path"])


def save_figures(results_path: str | Path | None = None, chapter: str | None = None) -> FigureSaver | None:
    """Save every figure this notebook shows from now on into the chapter's folder (see the module's docstring).

    Outside IPython it does nothing and returns None. Calling it again (a
    re-run of the first cell) moves the hook to the new folder, not twice.
    """
    global _active
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None:
        return None
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    plt.close(plt.figure())  # loads the notebook's backend, which registers its own PNG formatter first
    saver = FigureSaver(folder_for(results_path, chapter))
    saver.clear()
    formatter = shell.display_formatter.formatters["image/png"]
    try:
        shown = formatter.lookup_by_type(Figure)
    except KeyError:
        shown = None
    original = getattr(shown, "__wrapped__", shown)

    def show_and_save(fig: Any) -> Any:
        shown = original(fig) if original is not None else None
        # A formatter may answer (data, metadata): the retina one does, with the image's width and height.
        png, metadata = shown if isinstance(shown, tuple) else (shown, None)
        try:
            _active.save(fig, png)  # type: ignore[union-attr]
        except Exception as err:  # noqa: BLE001 - a figure not saved must never break the chapter
            print(f"streamlab: figure not saved: {err}")
        alt = alt_text(fig)
        if png is None or alt is None:
            return shown
        return png, {**(metadata or {}), "alt": alt}  # IPython files it as the output's {"image/png": {...}}

    show_and_save.__wrapped__ = original  # type: ignore[attr-defined]
    formatter.for_type(Figure, show_and_save)
    _active = saver
    return saver
