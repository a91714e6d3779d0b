PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two stamps: `make run` needs the runtime only; `make test` adds the test stack (pyspark, clients).
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test

.PHONY: run cluster test fuzz bench lint clean

$(RUNTIME): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(RUNTIME)

$(TESTING): $(RUNTIME)
	$(PY) -m pip install -q -e '.[test,sqlalchemy]'
	touch $(TESTING)

run: $(RUNTIME)
	$(PY) -m flightstore serve --data-dir ./data --host 127.0.0.1 --port 8815

cluster: $(RUNTIME)
	$(PY) -m flightstore cluster --servers 3 --data-dir ./cluster-data

test: $(TESTING)
	$(PY) -m pytest -q -ra

# A long randomized fuzz run (`make test` runs a short deterministic one); FUZZ_EXAMPLES per test.
FUZZ_EXAMPLES ?= 5000
fuzz: $(TESTING)
	FLIGHTSTORE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -ra -p no:cacheprovider -o timeout=0 tests/fuzz

bench: $(TESTING)
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) -m bench

lint: $(TESTING)
	$(PY) -m pip install -q 'ruff==0.17.6' && $(VENV)/bin/ruff check flightstore flightstore_sqlalchemy connectors tests bench

clean:
	rm -rf $(VENV) data cluster-data
