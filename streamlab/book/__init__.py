"""The top layer: what turns the lab's measurements into chapters a reader reads.

    chapter.py    helpers the notebooks share (show the library's source, record the headline)
    wording.py    words a computed sentence picks from its numbers (plural, a_an, of_all, either, spread)
    proofread.py  the check every executed chapter passes: prose that follows its numbers, no stderr, no dumps
    notebooks.py  python -m streamlab run-notebooks: every chapter executed with papermill
    plots.py      every chart the chapters draw; style.py its one style and the reading threshold
    connection_plots.py  chapter 14's chart: each stream's wait for a connection, and its answer
    replica_plots.py     chapter 13's chart: what a reader received while the server under it was killed
    figures.py    each figure a chapter shows, saved as PNG and SVG
    report.py     build/report.html: each chapter's headline and key figure
    grading.py    the exercises' checks, and grading a class; student_copy.py the copy a class gets
    jupyter_lab.py  python -m streamlab lab: JupyterLab on a folder (as root, with the --allow-root it needs)
    bench.py      make bench: every benchmark in its own process, then the summary of targets
"""
