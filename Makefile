# jbkv — two commands: `make demo` (the main job on the embedded model) and `make test`
# (`make test-fast`: the inner loop, every test not marked slow).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JOBS   ?= 2  # pytest workers (pytest-xdist); each test file runs in one worker
SRC    := jbkv_cli tests benchmarks scripts

# Compiled bytecode is kept under the venv, never beside the sources, and is written even where
# PYTHONDONTWRITEBYTECODE is set: every interpreter the suite starts (workers, jbkv processes,
# torchrun ranks) otherwise compiles jbkv and rewrites the test files again (14 CPU-s of a
# worker's 31 s collection here). docs/testing.md
export PYTHONPYCACHEPREFIX ?= $(abspath $(VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE

# The CI regression gate: a small matrix on the embedded model against a committed baseline.
GATE_DIR  ?= runs/ci-gate
GATE_ARGS := --prompts prompts/tiny-ci.txt --seeds 0,1 --bits 2,4 --quantizers rtn,quarot \
             --corrections none,taylor --no-lpips --no-plots
BASELINE  := baselines/tiny-ci.json

.PHONY: setup demo test test-fast lint format gate baseline bench gpu-check tiny-weights browser clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# one rank per core: the embedded model's small tensors gain little from a second thread
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc-per-node $(JOBS) -m jbkv_cli quantize-eval

test: lint $(STAMP) browser
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile
	$(MAKE) --no-print-directory gate

# Every test not marked slow (no installed-jbkv suites, torchrun, fault injection or signals;
# docs/testing.md), for the inner loop; `make test` runs everything and is what CI runs.
test-fast: lint $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n $(JOBS) --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)

format: $(STAMP)
	$(BIN)/ruff format $(SRC)
	$(BIN)/ruff check --fix $(SRC)

gate: $(STAMP)
	rm -rf $(GATE_DIR)
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc-per-node $(JOBS) -m jbkv_cli \
		quantize-eval $(GATE_ARGS) --out $(GATE_DIR)
	$(BIN)/jbkv report $(GATE_DIR)/tiny --baseline $(BASELINE)

baseline: $(STAMP)
	rm -rf $(GATE_DIR)
	$(BIN)/jbkv quantize-eval $(GATE_ARGS) --out $(GATE_DIR) --json $(BASELINE)

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py
	$(BIN)/python benchmarks/fidelity.py
	$(BIN)/python benchmarks/tiny_generate.py
	$(BIN)/python benchmarks/tiny_quality.py
	$(BIN)/python benchmarks/methods.py
	$(BIN)/python benchmarks/pruning.py
	$(BIN)/python benchmarks/metrics_writes.py

# One prepared script for a lent GPU (docs/plan.md): the cuda-marked tests, attention kernels at
# every model's shapes, one full-size run per model against its plan. DRY=1: the same on a CPU
# under fake CUDA (shapes and host syncs, no timings).
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py $(if $(DRY),--dry,)

# Debian's chromium for the HTML report's browser test; a no-op when present. Where apt-get is
# missing or fails, the test is skipped (and says why) instead of failing the build.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  { command -v apt-get >/dev/null 2>&1 && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
	    >/dev/null; } || echo "browser: chromium not installed; the browser test will be skipped"; }

tiny-weights: $(STAMP)
	$(BIN)/python -m jbkv_cli.models.tiny.train --out jbkv_cli/models/tiny/weights/tiny.safetensors --seed 0
	$(BIN)/python -m jbkv_cli.models.tiny.train --out jbkv_cli/models/tiny/weights/tiny-long.safetensors --seed 0 --stages 3 --init jbkv_cli/models/tiny/weights/tiny.safetensors

clean:
	rm -rf $(VENV) build *.egg-info runs
