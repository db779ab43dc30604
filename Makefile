# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install lint test test-fast test-portable test-stack demo study bench clean stack-up stack-down chaos gpu-check

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,stack]'
	touch $(STAMP)

install: $(STAMP)

# The guards: ruff (config in pyproject) and the import contracts (layers, no cycles; [tool.importlinter])
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# Two pytest-xdist workers: the unit tests in any order; the integration tests a module per worker at a time
# (--dist loadfile keeps a module's shared cluster or stack on one worker; stacks take per-worker port blocks);
# then the tests marked isolated, in a process of their own.
# TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))

test: lint
	$(PY) -m pytest -q -m "not integration" $(XDIST)
	$(PY) -m pytest -q -m "integration and not isolated" $(XDIST) $(if $(XDIST),--dist loadfile)
	$(PY) -m pytest -q -m isolated

# The goldens and other numerics tests (marker `numerics`, tests/conftest.py) under this CPU's other kernel paths:
# native with 2 threads, ATen's default kernels (oneDNN SSE4.1, MKL SSE4.2) with 1, and AVX2 on an AVX-512 CPU.
# A tolerance that holds only on the recording machine's kernels fails here (docs/performance.md#make-test-portable).
test-portable: $(STAMP)
	PY=$(PY) TEST_WORKERS=$(TEST_WORKERS) .ci/test-portable

# Only the end-to-end test on the real local stack (PostgreSQL, SeaweedFS, MLflow server, Ray head).
test-stack: $(STAMP)
	$(PY) -m pytest -q tests/test_stack_e2e.py

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not integration" $(XDIST)

demo: $(STAMP)
	$(PY) -m jobs.demo

# The CPU mini-study (docs/learning.md): numbers that mean something, unlike the 3-step cells of demo.
study: $(STAMP)
	$(PY) -m jobs.grid jobs/specs/mini.yaml

# Chaos (docs/reliability.md): the smoke grid on a fresh local stack while its processes are killed at random
# (seeded), compared with an undisturbed run; e.g. make chaos CHAOS_ARGS="--interval 30 --seed 1"
CHAOS_ARGS ?= --interval 20 --seed 0
chaos: $(STAMP)
	$(PY) benchmarks/chaos.py $(CHAOS_ARGS)

# GPU check (docs/performance.md#gpu-acceptance), at most about 8 minutes on one H100: benchmarks/gpu_check.sh runs
# the acceptance run (every framework x head, NCCL cell, inference, DINOv2, GPU-hours), the side-by-side with the
# official loops (OFFICIAL_ROOT=DIR), the loader against the step and eager vs compiled. Results in
# benchmarks/results/gpu_acceptance/. GPU_CHECK_ARGS go to the acceptance run; on CPU use gpu_acceptance.py directly.
GPU_CHECK_ARGS ?=
OFFICIAL_ROOT ?=
gpu-check: $(STAMP)
	PY=$(PY) OFFICIAL_ROOT=$(OFFICIAL_ROOT) benchmarks/gpu_check.sh $(GPU_CHECK_ARGS)

# The local stack (PostgreSQL, SeaweedFS S3, MLflow server, Ray head on 127.0.0.1): semiseg_platform/devstack/
stack-up: $(STAMP)
	$(VENV)/bin/npsemiseg stack up

stack-down: $(STAMP)
	$(VENV)/bin/npsemiseg stack down

clean:
	rm -rf $(VENV) build *.egg-info
