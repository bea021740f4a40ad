"""The top layer: what turns the lab's measurements into chapters a reader reads.

    chapter.py    helpers the notebooks share (show the library's source, record the headline)
    wording.py    words a computed sentence picks from its numbers (plural, a_an, of_all, either, spread)
    proofread.py  the check every executed chapter passes: prose that follows its numbers, no stderr, no dumps
    layout.py     what a chapter shows: its visible code within bounds, its plumbing folded, its one voice
    notebooks.py  python -m streamlab run-notebooks: every chapter executed with papermill
    warm_kernel.py  their kernels forked by the run's warm starter (streamlab.net.warm)
    plots.py      every chart the chapters draw; style.py its one style and the reading threshold
    connection_plots.py  chapter 14's chart: each stream's wait for a connection, and its answer
    replica_plots.py     chapter 13's chart: what a reader received while the server under it was killed
    early_plots.py, middle_plots.py, late_plots.py  the charts of chapters 1-5, 6-10 and 11-15 that plots.py
                  does not hold
    prose_early.py, prose_middle.py, prose_late.py  those chapters' tables in words and computed sentences
    figures.py    each figure a chapter shows, saved as PNG and SVG
    report.py     build/report.html: each chapter's headline and key figure
    pages.py      python -m streamlab book: build/book/, the chapters as web pages; contents.py its index
    glossary.py   the book's glossary, from the chapters' <dfn id>; checklist.py its production checklist
    path_picture.py  one picture of the path (browser to worker), a hop marked
    grading.py    the exercises' checks, and grading a class; student_copy.py the copy a class gets
    jupyter_lab.py  python -m streamlab lab: JupyterLab on a folder (as root, with the --allow-root it needs)
    bench.py      make bench: every benchmark in its own process, then the summary of targets
"""
