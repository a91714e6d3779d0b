PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run cluster test bench lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m flightstore serve --data-dir ./data --host 127.0.0.1 --port 8815

cluster: $(STAMP)
	$(PY) -m flightstore cluster --servers 3 --data-dir ./cluster-data

test: $(STAMP)
	$(PY) -m pytest -q -ra

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) -m bench

lint: $(STAMP)
	$(PY) -m pip install -q ruff && $(VENV)/bin/ruff check flightstore connectors tests bench

clean:
	rm -rf $(VENV) data cluster-data
