# Two set-up commands, both safe on a fresh machine with Python 3.11 and make:
#   make run   - the main job on the embedded default: `epochlog up` runs a local 3-node cluster
#                (configs/local-3.toml, data in data/local) for 20 s under a demo load through the
#                SDK, then stops it cleanly; the next `make run` resumes from that data
#   make test  - the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv bench clean log-demo

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m epochlog up --config configs/local-3.toml --data-dir data/local --seconds 20 --demo-load

# The segmented log's crash-and-recover demo (what `make run` ran before the node existed).
log-demo: $(STAMP)
	$(PY) -m epochlog demo --data-dir data/demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench.log_bench
	$(PY) -m bench.views_bench

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis
