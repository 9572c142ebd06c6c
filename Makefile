# The two commands a fresh machine needs: `make run` and `make test`.
# Each creates .venv with the system python3 when missing and installs the
# package with its dev extra whenever pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run sim test lint imports typecheck unit chaos bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/nomad-runner-controller dev

sim: run

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The layering contracts in pyproject.toml ([tool.importlinter]).
imports: $(STAMP)
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint imports typecheck unit

# More chaos seeds than CI runs: make chaos SEEDS=200
SEEDS ?= 50
chaos: $(STAMP)
	$(BIN)/pytest tests/chaos -q --chaos-seeds=$(SEEDS)

# Benchmarks: JSON per benchmark in bench/results/, a table on stdout.
bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
