# The two commands a new user needs: `make demo` and `make test`.
# Both bootstrap .venv from a fresh clone on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/conveyor demo

test: $(STAMP)
	$(BIN)/ruff check conveyor tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
