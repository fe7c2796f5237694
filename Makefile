# One entry point for people and CI. Every target creates or reuses .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench soak clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/compensator run

# The system packages first (deploy/install-system-packages.sh installs what is missing when it may,
# else says which command does); the tests that need one still missing fail, each naming it.
test: $(STAMP)
	@bash deploy/install-system-packages.sh || true
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy raft_store queues delay compensator spark_reconcile bench ledger api handlers outbox services submission

bench: $(STAMP)
	$(PY) -m bench.raft --concurrency 1 --seconds 10 --json
	$(PY) -m bench.raft --concurrency 16 --seconds 10 --json
	$(PY) -m bench.raft --concurrency 256 --seconds 10 --json
	$(PY) -m bench.raft --failover --json

soak: $(STAMP)
	SIM_SEEDS=$${SIM_SEEDS:-2000} SIM_BUDGET_S=$${SIM_BUDGET_S:-3600} $(PY) -m pytest -q tests/raft_store/test_simulation.py
	QUEUE_SIM_BUDGET_S=$${QUEUE_SIM_BUDGET_S:-3600} $(PY) -m pytest -q -s tests/queues/test_queue_simulation.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
