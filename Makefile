# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3 -c constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,torch,examples,cluster]'
	touch $(STAMP)

# A short comparison of Pollux, Tiresias and Optimus+Oracle on the built-in profiles and demo workload.
demo: $(STAMP)
	$(VENV)/bin/pollux simulate --policy pollux --policy tiresias --policy optimus --plots out/demo-plots

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/goodput.py --data ../shared/data/pollux-osdi21/traces --json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
