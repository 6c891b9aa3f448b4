# Two entry points a newcomer needs: `make demo` (the main job) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint typecheck unit integration bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The editable install is redone only when what it reads changed since the stamp (pyproject.toml, setup.py,
# the compiled sealer's, chain hasher's and column passes' sources), so a second `make demo` starts at once; `make clean` forces it.
STAMP := $(VENV)/.installed

$(STAMP): $(BIN)/python pyproject.toml setup.py latticed/privacy/_seal_build.py latticed/crdt/_chain_build.py latticed/crdt/_columns_build.py latticed/crdt/_columns.c
	$(BIN)/pip install -q -e '.[dev,spark]'
	touch $@

venv: $(STAMP)

demo: venv
	$(BIN)/python -m latticed.demo.walkthrough

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy

test: venv lint typecheck
	$(BIN)/pytest

bench: venv
	$(BIN)/python bench/bench_crdt.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
