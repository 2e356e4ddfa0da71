# Two set-up commands, both safe on a fresh machine with Python 3.11 and make:
#   make run   - the main job on the embedded default (today: the log demo)
#   make test  - the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m epochlog demo --data-dir data/demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench.log_bench

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis
