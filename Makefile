# jbkv — two commands: `make demo` (the main job on the embedded model) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint format bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/jbkv attention-demo --cached 512 --current 128

test: $(STAMP)
	$(BIN)/ruff check jbkv_cli tests benchmarks scripts
	$(BIN)/ruff format --check jbkv_cli tests benchmarks scripts
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check jbkv_cli tests benchmarks scripts

format: $(STAMP)
	$(BIN)/ruff format jbkv_cli tests benchmarks
	$(BIN)/ruff check --fix jbkv_cli tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py

clean:
	rm -rf $(VENV) build *.egg-info
