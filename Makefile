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

# Django 6 runs on Python 3.12+: the Django-facing tests run there too, on
# the current release (6.0: `rm -r .venv-django6; make test-django6 DJANGO6='django>=6.0,<6.1'`).
PYTHON_DJANGO6 ?= python3.12
DJANGO6 ?= django>=6.1,<6.2
VENV6 := .venv-django6
DJANGO6_TESTS := tests/unit/test_store_tasks.py tests/unit/test_task_worker.py \
	tests/unit/test_producer_remote.py tests/integration/test_task_worker.py \
	tests/integration/test_producer.py tests/integration/test_django_app.py \
	tests/integration/test_operations.py tests/integration/test_workqueue.py \
	tests/integration/test_host_project.py

.PHONY: screenshots run demo reset test test-django6 django6-env lint typecheck unit integration bench install dev clean browser balancer

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

# The Python client (clients/python/, distribution `leasecast`) goes in the same
# pip call: the gateway depends on it and pip cannot take a relative path there.
$(RUN_STAMP): pyproject.toml clients/python/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ./clients/python -e .
	touch $(RUN_STAMP)

# The Spark sink (clients/spark/, distribution `leasecast-spark`, import name
# `spark_feed`) is the gateway's `spark` extra, given in the same pip call.
$(SPARK_STAMP): $(RUN_STAMP) clients/spark/pyproject.toml
	$(BIN)/pip install --quiet -e ./clients/spark -e '.[spark]'
	touch $(SPARK_STAMP)

$(DEV_STAMP): $(RUN_STAMP) clients/spark/pyproject.toml
	$(BIN)/pip install --quiet -e ./clients/spark -e '.[dev]'
	touch $(DEV_STAMP) $(SPARK_STAMP)

## What running needs (the runtime); `make dev` adds the test and benchmark tools.
install: $(RUN_STAMP)
dev: $(DEV_STAMP)

var:
	mkdir -p var

## Serve the gateway and dashboard on 127.0.0.1:$(PORT) (SQLite, in-memory layer);
## prints the login and the `export LEASECAST_URL=... ADMIN_TOKEN=...` line.
run: install var
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py bootstrap_dev --url http://127.0.0.1:$(PORT)
	$(BIN)/python -m gateway.serve -b 127.0.0.1 -p $(PORT)

## The whole system alive: gateway, a Spark feed, workers (one crashy, one slow),
## a publisher and a subscriber per policy. Ctrl-C stops everything. Its own database
## (var/demo.sqlite3) and credentials (var/demo-credentials.txt): never make run's.
demo: $(SPARK_STAMP) var
	$(BIN)/python -m gateway.demo --port $(PORT)

## Forget the development state: make run's and make demo's databases, credentials,
## logs and Spark checkpoints (all of var/). The next make run starts afresh.
reset:
	rm -rf var

## Refresh docs/dashboard*.png: the demo on a free port, photographed in Chromium, stopped.
screenshots: $(DEV_STAMP) var browser
	$(BIN)/python -m dashboard.screenshots

lint: dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: dev
	$(BIN)/mypy gateway consumers dashboard bench clients/spark/src/spark_feed clients/python/src/leasecast

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

## Debian's haproxy for the load-balancer tests (tests/integration/test_balancer.py),
## when we may install it (root); without it those tests skip and say why.
balancer:
	@if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing Debian's haproxy for the load-balancer tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null) \
	    || echo "Could not install haproxy: the load-balancer tests will be skipped"; \
	else echo "No haproxy and not root: the load-balancer tests will be skipped"; fi

## Lint, type-check, then every test suite on Django 5.2, then the Django-facing
## tests on Django 6. Lint and type-check run beside the Django 6 environment's
## install (mypy keeps one core busy, pip mostly waits). The suite runs on
## $(TEST_WORKERS) parallel workers (pytest-xdist; most tests wait on servers),
## each test module on one worker (its PostgreSQL tests on another), the longest
## first (tests/conftest.py); the tests marked `serial` (they restart the
## machine's PostgreSQL and Redis, or need a quiet machine) run alone afterwards.
## Each run prints its ten slowest tests.
TEST_WORKERS ?= 4
# The tests cache compiled modules (__pycache__/, ignored by git) even where the
# environment asks Python not to (PYTHONDONTWRITEBYTECODE): the suite starts
# hundreds of gateways, workers and commands, and each would otherwise compile
# the project's modules afresh (about 0.1 s of CPU a start; pytest's rewritten
# test modules too, in every parallel worker).
test unit integration test-django6: export PYTHONDONTWRITEBYTECODE =
test: browser balancer
	$(MAKE) --no-print-directory -j2 --output-sync=target lint typecheck django6-env
	$(BIN)/pytest -q --durations=10 -n $(TEST_WORKERS) --dist loadgroup -m "not serial"
	$(BIN)/pytest -q --durations=10 -m serial
	$(MAKE) --no-print-directory test-django6

$(VENV6)/.installed: pyproject.toml clients/python/pyproject.toml
	$(PYTHON_DJANGO6) -m venv $(VENV6)
	$(VENV6)/bin/pip install --quiet --upgrade pip
	$(VENV6)/bin/pip install --quiet -e ./clients/python -e '.[test]' '$(DJANGO6)'
	touch $@

# The first Python 3.12 or later: $(PYTHON_DJANGO6) if it runs, else a pyenv-installed one.
FIND_PYTHON_DJANGO6 = for p in $(PYTHON_DJANGO6) $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 2>/dev/null); do \
	  $$p -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1 && echo $$p && break; done

## The Django 6 environment ($(VENV6)), when there is a Python 3.12 or later.
django6-env:
	@py=$$($(FIND_PYTHON_DJANGO6)); \
	if [ -n "$$py" ]; then $(MAKE) --no-print-directory $(VENV6)/.installed PYTHON_DJANGO6=$$py; fi

## The Django-facing and tasks tests on Django 6 (skipped, and said, without Python 3.12+:
## $(PYTHON_DJANGO6) if it runs, else a pyenv-installed 3.12 or later): on
## $(TEST_WORKERS) workers as in `make test`, then the tests marked `serial` alone
## (none at present: pytest's exit code 5, "no tests ran", is not a failure there).
test-django6: django6-env
	@if [ -f $(VENV6)/.installed ]; then \
	  $(VENV6)/bin/python -c 'import django; print("Django", django.get_version())' && \
	  $(VENV6)/bin/pytest -q -p no:cacheprovider --durations=10 -n $(TEST_WORKERS) --dist loadgroup -m "not serial" $(DJANGO6_TESTS) && \
	  { $(VENV6)/bin/pytest -q -p no:cacheprovider --durations=10 -m serial $(DJANGO6_TESTS); \
	    rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]; }; \
	else echo "Skipping the Django 6 tests: no Python 3.12 or later on this machine"; fi

## The headline comparisons against NATS JetStream, RabbitMQ, pgqueuer, NATS core,
## Mosquitto and websockets (3 rounds, on a quiet machine): the JSON goes to
## bench/results/, the tables into docs/benchmarks.md between its markers.
bench: dev
	$(BIN)/python -m bench.headline --json bench/results/headline.json --write-docs docs/benchmarks.md

clean:
	rm -rf $(VENV) $(VENV6) var .pytest_cache .mypy_cache .ruff_cache
