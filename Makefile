# Leasecast: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3.11
PORT ?= 8000
VENV := .venv
BIN := $(VENV)/bin
# One stamp per set of packages: `make run` installs the runtime only (no
# Spark, Playwright or benchmark baselines); the other targets add theirs.
RUN_STAMP := $(VENV)/.installed-run
SPARK_STAMP := $(VENV)/.installed-spark
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run demo test lint typecheck unit integration bench install dev clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(RUN_STAMP)

$(SPARK_STAMP): $(RUN_STAMP)
	$(BIN)/pip install --quiet -e '.[spark]'
	touch $(SPARK_STAMP)

$(DEV_STAMP): $(RUN_STAMP)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(DEV_STAMP) $(SPARK_STAMP)

## What running needs (the runtime); `make dev` adds the test and benchmark tools.
install: $(RUN_STAMP)
dev: $(DEV_STAMP)

var:
	mkdir -p var

## Serve the gateway and dashboard on 127.0.0.1:$(PORT) (SQLite, in-memory layer).
run: install var
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py bootstrap_dev --url http://127.0.0.1:$(PORT)
	$(BIN)/python -m gateway.serve -b 127.0.0.1 -p $(PORT)

## The whole system alive: gateway, a Spark feed, workers (one crashy, one slow),
## a publisher and a subscriber per policy. Ctrl-C stops everything.
demo: $(SPARK_STAMP) var
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py bootstrap_dev --url http://127.0.0.1:$(PORT)
	$(BIN)/python -m gateway.demo --port $(PORT)

lint: dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: dev
	$(BIN)/mypy gateway consumers dashboard bench spark_feed

unit: dev
	$(BIN)/pytest tests/unit -q

integration: dev
	$(BIN)/pytest tests/integration -q

## Debian's Chromium for the browser tests, when we may install it (root);
## without it the browser tests skip and say why. Never `playwright install`.
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing Debian's chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "Could not install chromium: the browser tests will be skipped"; \
	else echo "No chromium and not root: the browser tests will be skipped"; fi

## Lint, type-check, then every test suite.
test: lint typecheck browser
	$(BIN)/pytest -q --durations=10

## Benchmarks against their baselines; results go to docs/benchmarks.md by hand.
bench: dev
	$(BIN)/python -m bench.workqueue

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
