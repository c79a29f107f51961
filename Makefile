# Two entry points, both self-installing into .venv:  make demo  |  make test
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HASH   := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-$(HASH)
DEMO   := $(VENV)/.demo-$(HASH)
comma  := ,

.PHONY: demo test services lint typecheck unit slow bench lock clean

# $(call venv,DIR,STAMP-PREFIX,PIP-ARGS...): a venv DIR, then `pip install -q` of each PIP-ARGS in turn (one install
# per argument, so an argument may install MindSpore first and msmon over it), its stamp $@ redone when its inputs change
define venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(foreach args,$(3),$(1)/bin/python -m pip install -q $(subst ;, ,$(args))
	)rm -f $(1)/$(2)-*
	touch $@
endef

$(STAMP): pyproject.toml
	$(call venv,$(VENV),.installed,-e;'.[dev$(comma)mindspore]')

# MindSpore 2.7.0, the oldest msmon supports, in a venv of its own, installed as a cluster has it: MindSpore first,
# then msmon over it (which must leave it in place); make unit runs the MindSpore tests on it too
MS27       := .venv-ms27
MS27_STAMP := $(MS27)/.installed-$(HASH)
# (the callback, host reads, loss scale, resume, rewind, the custom loop; the six damaged-checkpoint variants of
# the msrun rewind test are rewind's logic, not MindSpore's API: on 2.10 only, which saves about 4 minutes)
MS27_TESTS := tests/notifier/mindspore tests/e2e/test_custom_loop_example.py tests/project/test_install.py \
              -k "not damaged_checkpoint_on_one_rank"
$(MS27_STAMP): pyproject.toml
	$(call venv,$(MS27),.installed,'mindspore==2.7.0';'numpy==1.26.4' -e;'.[mindspore$(comma)test]')

# MindFormers' own Trainer in the tests (tests/mindformers, run from the suite as subprocesses in these venvs): one
# venv per release, msmon in it with `-e .` and no extra, under constraints that keep the MindSpore, numpy and
# pyarrow MindFormers runs on. 2.1.0 goes in --no-deps: it declares mindspore~=2.11 and hyper-parallel, neither on
# PyPI; its other dependencies are in its requirements file.
MF      := tests/mindformers
MF21    := .venv-mf21/.installed-$(HASH)
MF19    := .venv-mf19/.installed-$(HASH)
$(MF21): pyproject.toml $(MF)/requirements-mf21.txt $(MF)/constraints-mf21.txt
	$(call venv,.venv-mf21,.installed,-r;$(MF)/requirements-mf21.txt;-c;$(MF)/constraints-mf21.txt \
	  --no-deps;mindformers==2.1.0 -e;.;-c;$(MF)/constraints-mf21.txt)

$(MF19): pyproject.toml $(MF)/requirements-mf19.txt $(MF)/constraints-mf19.txt
	$(call venv,.venv-mf19,.installed,-r;$(MF)/requirements-mf19.txt;-c;$(MF)/constraints-mf19.txt \
	  -e;.;-c;$(MF)/constraints-mf19.txt)

$(DEMO): pyproject.toml
	$(call venv,$(VENV),.demo,-e;'.[bot$(comma)mindspore]')

demo: $(DEMO)
	$(BIN)/msmon demo

test: services lint typecheck unit

services:
	@bash tools/test-services.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite on every core (pytest-xdist; each module on one worker, so a module's fixture such as Synapse starts
# once: --dist loadscope, as loadgroup does not group under pytest 9.2), then the timing tests alone in a process
# of their own on an otherwise idle machine
unit: $(STAMP) $(MS27_STAMP) $(MF21) $(MF19)
	$(BIN)/pytest -q -m "not timing" -n auto --dist loadscope
	$(MS27)/bin/pytest -q -m "mindspore and not timing" -n auto --dist loadscope $(MS27_TESTS)
	$(BIN)/pytest -q -m timing

slow: $(STAMP)
	$(BIN)/pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python bench/bench_monitor.py

# The image's lock files (requirements/*.lock.txt, with hashes) from pyproject.toml; needs uv and PyPI
lock:
	tools/lock.sh

clean:
	rm -rf $(VENV) $(MS27) .venv-mf21 .venv-mf19 demo-out tb_logs msmon_logs .pytest_cache .mypy_cache .ruff_cache
