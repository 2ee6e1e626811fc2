# orcasim: `make run` and `make test` work on a fresh clone with only Python 3.11.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is pinned here only because this pin is a small CPU build on our machines;
# pyproject keeps `torch>=2.3` open so users keep their own CUDA build.
TORCH_PIN ?= torch==2.13.0
SCENARIO ?= scenarios/quickstart.yaml

.PHONY: setup run test test-deep mutate mutate-list mutate-all lint check bench bench-cluster bench-capacity bench-instructions calibrate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[dev,calibrate,cluster]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/orcasim run $(SCENARIO) --force

# One pytest worker a core, at most four (each holds its own imports, ~0.3 GB): on CI's two
# cores the suite takes about half its time in one process.
PYTEST_WORKERS := -n auto --maxprocesses=4 --dist worksteal

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS)

# Property tests with fresh random examples and ten times CI's budget: a bug hunt, not a gate.
test-deep: $(STAMP)
	HYPOTHESIS_PROFILE=explore ORCASIM_TEST_DEPTH=10 $(BIN)/python -m pytest -q $(PYTEST_WORKERS) -m "not slow"

# Mutation testing (quality/README.md), one scope of quality/scopes.toml at a time
# (`make mutate SCOPE=cost`; `make mutate-list` names them); every scope in turn is
# `make mutate-all` (hours on two cores).
SCOPE ?= core
mutate: $(STAMP)
	$(BIN)/python quality/mutate.py $(SCOPE)

mutate-list: $(STAMP)
	$(BIN)/python quality/mutate.py --list

mutate-all: $(STAMP)
	for scope in $$($(BIN)/python quality/mutate.py --list | cut -d' ' -f1); do \
		$(BIN)/python quality/mutate.py $$scope || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

check: $(STAMP)
	$(BIN)/orcasim check

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py --force

bench-cluster: $(STAMP)
	$(BIN)/python benchmarks/cluster.py --force

bench-capacity: $(STAMP)
	$(BIN)/python benchmarks/capacity.py --force

bench-instructions: $(STAMP)  # needs valgrind: instructions per simulated request (about 0.1% noise)
	$(BIN)/python benchmarks/instructions.py

# Profile the tiny model on this CPU, fit, and replay a real serving run against the simulation.
calibrate: $(STAMP)
	$(BIN)/python -m calibrate profile --model tiny --device cpu --grid default --out calibrate/profiles/cpu-tiny.csv --force
	$(BIN)/python -m calibrate fit calibrate/profiles/cpu-tiny.csv --out calibrate/cost_models/cpu-tiny.yaml --force
	$(BIN)/python -m calibrate replay scenarios/calibrated/cpu_tiny.yaml --model tiny --device cpu --load 0.55 --force

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
