# Two set-up commands, both safe on a fresh machine with Python 3.11, Java 17 (for Spark) and make:
#   make run   - a tour of the mission in about a minute: `epochlog up --tour` runs a local 3-node
#                cluster (configs/local-3.toml, data in data/local) with its Kafka face, writes through
#                the SDK, runs simulated brokers through a master failover, tails __metadata with a
#                Kafka consumer, exports to Delta and checks an audit answer against the live one,
#                then stops it cleanly (docs/local-cluster.md); the next `make run` resumes that data
#   make test  - the whole test suite
# The first run of either makes .venv and installs the dependencies (a few minutes; it says so), at the
# versions in constraints.txt: the set the suite last passed with (`make lock` moves it to the newest
# releases pyproject.toml allows; then run `make test` and commit both, scripts/lock_deps.py).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv bench clean log-demo lock

$(STAMP): pyproject.toml constraints.txt
	@echo "installing Epochlog and its dependencies into $(VENV) (first run only: a few minutes)..."
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)
	@echo "installed into $(VENV)"

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m epochlog up --config configs/local-3.toml --data-dir data/local --tour

# The segmented log's crash-and-recover demo (what `make run` ran before the node existed).
log-demo: $(STAMP)
	$(PY) -m epochlog demo --data-dir data/demo

# Two workers, each test file on one of them: alone, the suite kept the 2 cores of the machine it was
# made for only half busy (it waits on real processes, disks and timeouts). A run in which a worker
# dies still ends (tests/support/schedule.py).
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(PY) -m bench.log_bench
	$(PY) -m bench.views_bench

lock: $(STAMP)
	$(PY) scripts/lock_deps.py

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis
