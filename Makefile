# The README's two set-up commands: `make run` (install + a real small training run) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-cluster test-slow lint install install-test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'

# Main job: a real training run on the embedded defaults (small ResNet, digits, 1 shard, 2 workers).
run: install
	$(BIN)/cmdare train

test: install-test
	$(BIN)/ruff check src tests bench examples
	$(BIN)/python -m pytest -q -m "not slow and not cluster" --durations=15

# Multi-node clusters, Ray's autoscaler and long end-to-end fault runs on real Ray (.ci/run runs them too).
test-cluster: install-test
	$(BIN)/python -m pytest -q -m "cluster and not slow" --durations=15

# Tests that compare wall times of real runs (timing-sensitive on a shared machine): run apart.
test-slow: install-test
	$(BIN)/python -m pytest -q -m slow

lint: install-test
	$(BIN)/ruff check src tests bench examples
