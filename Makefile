# Leasecast: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3.11
PORT ?= 8000
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run demo test lint typecheck unit integration bench install clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

var:
	mkdir -p var

## Serve the gateway and dashboard on 127.0.0.1:$(PORT) (SQLite, in-memory layer).
run: install var
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py bootstrap_dev --url http://127.0.0.1:$(PORT)
	$(BIN)/python -m gateway.serve -b 127.0.0.1 -p $(PORT)

## The whole system alive: gateway, a Spark feed, workers (one crashy, one slow),
## a publisher and a subscriber per policy. Ctrl-C stops everything.
demo: install var
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py bootstrap_dev --url http://127.0.0.1:$(PORT)
	$(BIN)/python -m gateway.demo --port $(PORT)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy gateway consumers dashboard bench spark_feed

unit: install
	$(BIN)/pytest tests/unit -q

integration: install
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
	$(BIN)/pytest -q

## Benchmarks against their baselines; results go to docs/benchmarks.md by hand.
bench: install
	$(BIN)/python -m bench.workqueue

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
