# Two entry points a newcomer needs: `make demo` (the main job) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint typecheck unit integration bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,spark]'

demo: venv
	$(BIN)/python -m latticed.demo

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
