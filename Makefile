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

.PHONY: demo test test-core test-sglang install install-sglang lint bench audit live-bench clean

# venv_rules(DIR, EXTRAS): create DIR, install the project with EXTRAS, stamp DIR/.installed
define venv_rules
$(1)/bin/python:
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip

$(1)/.installed: pyproject.toml | $(1)/bin/python
	$(1)/bin/python -m pip install --quiet -e '.[$(2)]'
	touch $(1)/.installed
endef

SGLANG_EXTRAS := dev,sglang,router
$(eval $(call venv_rules,$(VENV),dev))
$(eval $(call venv_rules,$(SGLANG_VENV),$(SGLANG_EXTRAS)))

install: $(STAMP)

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

# which committed study runs today's code still gives (about 25 minutes on 2 cores)
audit: $(STAMP)
	$(BIN)/python analysis/audit_results.py --jobs 2 --out docs/results/audit

# the real SGLang server on the CPU with the fake model (integration/sglang/live_bench.py)
live-bench: $(SGLANG_STAMP)
	PYTHON=$(SGLANG_BIN)/python integration/sglang/run_live_bench.sh

clean:
	rm -rf $(VENV) $(SGLANG_VENV) build *.egg-info
