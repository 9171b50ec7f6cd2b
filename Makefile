# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo demo-sim test lint bench bench-cluster bench-service bench-decisions clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3 -c constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,torch,examples,cluster,tensorboard,hpo]'
	touch $(STAMP)

# The live demo: the service on an embedded 4-node Ray cluster runs five real training jobs.
demo: $(STAMP)
	$(PY) -m pollux.cluster.demo --state-dir out/demo-state

# The simulator's comparison of Pollux, Tiresias and Optimus+Oracle (the demo before the live service).
demo-sim: $(STAMP)
	$(VENV)/bin/pollux simulate --policy pollux --policy tiresias --policy optimus --plots out/demo-plots

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Two pytest-xdist workers, one per core of the 2-core CI machine: the live tests mostly wait on their
# services' clocks, so the pair overlaps them (TEST_WORKERS=0 runs the suite in one process). Work
# stealing: each worker takes half the files in order, and one that runs dry takes from the other.
TEST_WORKERS ?= 2

test: $(STAMP) lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15

bench: $(STAMP)
	$(PY) benchmarks/goodput.py --data ../shared/data/pollux-osdi21/traces --json

bench-cluster: $(STAMP)
	$(PY) benchmarks/cluster.py --json

# The live service under load: 200 jobs submitted and cancelled in a burst (issue 10).
bench-service: $(STAMP)
	$(PY) benchmarks/service_load.py --json

bench-decisions: $(STAMP)
	$(PY) benchmarks/agent_decisions.py --json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
