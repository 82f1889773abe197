# Two commands work on a fresh machine: `make demo` and `make test`.
# Each creates .venv if missing and (re)installs the project when pyproject.toml changes.
# `make test` also runs the SGLang plugin's tests in .venv-sglang, a separate environment
# with the pinned sglang==0.5.23 (about 11 GB and 8 minutes the first time), reused while
# pyproject.toml (which holds the pin) is unchanged.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SGLANG_VENV  ?= .venv-sglang
SGLANG_BIN   := $(SGLANG_VENV)/bin
SGLANG_STAMP := $(SGLANG_VENV)/.installed

.PHONY: demo test test-core test-sglang install install-sglang lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(SGLANG_BIN)/python:
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_BIN)/python -m pip install --quiet --upgrade pip

$(SGLANG_STAMP): pyproject.toml | $(SGLANG_BIN)/python
	$(SGLANG_BIN)/python -m pip install --quiet -e '.[dev,sglang]'
	touch $(SGLANG_STAMP)

install-sglang: $(SGLANG_STAMP)

demo: $(STAMP)
	$(BIN)/topas demo

test: test-core test-sglang

test-core: $(STAMP)
	$(BIN)/python -m pytest

test-sglang: $(SGLANG_STAMP)
	$(SGLANG_BIN)/python -m pytest integration/sglang/tests

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python analysis/bench_simulator.py

clean:
	rm -rf $(VENV) $(SGLANG_VENV) build *.egg-info
