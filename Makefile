# Two entry points, both self-installing into .venv:  make demo  |  make test
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HASH   := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-$(HASH)
DEMO   := $(VENV)/.demo-$(HASH)

.PHONY: demo test lint typecheck unit slow bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,mindspore]'
	rm -f $(VENV)/.installed-*
	touch $@

$(DEMO): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[bot]'
	rm -f $(VENV)/.demo-*
	touch $@

demo: $(DEMO)
	$(BIN)/msmon demo

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

slow: $(STAMP)
	$(BIN)/pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python bench/bench_monitor.py

clean:
	rm -rf $(VENV) demo-out tb_logs msmon_logs .pytest_cache .mypy_cache .ruff_cache
