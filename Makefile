PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two stamps: `make run` needs the runtime only; `make test` adds the test stack (pyspark, clients).
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test

.PHONY: run cluster superset test docs fuzz chaos bench lint clean

# pip shows what it fetches and installs (no -q): the first install takes a minute or more.
$(RUNTIME): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "Installing flightstore's runtime into $(VENV) (pyarrow, DuckDB, RocksDB, ADBC: ~400 MB; once)"
	$(PY) -m pip install --disable-pip-version-check -e .
	touch $(RUNTIME)

$(TESTING): $(RUNTIME)
	@echo "Installing the test stack into $(VENV) (PySpark, pandas, polars, SQLAlchemy; once)"
	$(PY) -m pip install --disable-pip-version-check -e '.[test,sqlalchemy]'
	touch $(TESTING)

run: $(RUNTIME)
	$(PY) -m flightstore serve --data-dir ./data --host 127.0.0.1 --port 8815

# Superset against the server `make run` started: its own cached venv, then the URL and login.
SUPERSET_HOME ?= ./superset-home
superset: $(RUNTIME)
	$(PY) -m flightstore_sqlalchemy.superset_launch --flightstore grpc://127.0.0.1:8815 --home $(SUPERSET_HOME)

cluster: $(RUNTIME)
	$(PY) -m flightstore cluster --servers 3 --data-dir ./cluster-data

# Several workers (pytest-xdist): much of the suite waits on server processes, ZooKeeper sessions
# and Spark; a test file stays on one worker (--dist loadfile: its module fixtures are built once,
# and tests that build on each other's state in them run in order).
# The Debian packages the tests need (ZooKeeper, Prometheus, Chromium, tmux) are installed first,
# in one apt-get, when missing; the slowest tests are listed at the end of the run. A crashed worker
# ends the run (--max-worker-restart=0): xdist's file scheduler hung after replacing one.
# The other clients' cached virtualenvs (Superset, Harlequin, flightsql-dbapi, DuckDB's iceberg reader:
# tests/client_venvs.py) are built here, once, before the suite: they are installs, kept in
# $(VENV)/clients/ for later runs; built during the suite they took the cores from the tests.
TEST_WORKERS ?= 4
test: $(TESTING)
	$(PY) -m tests.system_packages
	$(PY) -m tests.client_venvs
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --max-worker-restart=0 --durations=30

# The documentation site (README.md as its front page, docs/*.md) into site/; --strict: a broken
# link or anchor, or any other warning, fails the build. tests/test_docs.py runs every code block.
DOCS := $(VENV)/.installed-docs
$(DOCS): $(RUNTIME)
	$(PY) -m pip install --disable-pip-version-check -e '.[docs]'
	touch $(DOCS)

docs: $(DOCS)
	$(VENV)/bin/mkdocs build --strict

# A long randomized fuzz run (`make test` runs a short deterministic one); FUZZ_EXAMPLES per test.
FUZZ_EXAMPLES ?= 5000
fuzz: $(TESTING)
	FLIGHTSTORE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -ra -p no:cacheprovider -o timeout=0 tests/fuzz

# A long Jepsen-style run of replication and failover (`make test` runs three seeds of 30 s):
# CHAOS_SECONDS of faults per seed; history and verdict of each seed under CHAOS_DIR.
CHAOS_SECONDS ?= 600
CHAOS_SEEDS ?= 101,102
CHAOS_DIR ?= ./chaos-runs
chaos: $(TESTING)
	CHAOS_SECONDS=$(CHAOS_SECONDS) CHAOS_SEEDS=$(CHAOS_SEEDS) $(PY) -m pytest -q -ra -s -p no:cacheprovider \
		-o timeout=0 --basetemp=$(CHAOS_DIR) tests/cluster/test_jepsen.py

bench: $(TESTING)
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) -m bench

lint: $(TESTING)
	$(PY) -m pip install -q 'ruff==0.17.6' && $(VENV)/bin/ruff check flightstore flightstore_sqlalchemy connectors tests bench

clean:
	rm -rf $(VENV) data cluster-data superset-home chaos-runs site
