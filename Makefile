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

.PHONY: run test venv verl-venv data lint system-deps ui faults bench-allocation bench-contrast clean-venv lock specs results trl-example help

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

venv: $(STAMP)  ## create .venv from the pinned set (torch first, then the lock, then bfcl-eval without pins)

# requirements/install.sh says why the stages come in this order; it prints a line per stage and a
# heartbeat while one runs.
$(STAMP): requirements/lock.txt requirements/no-deps.txt requirements/install.sh requirements/stages.sh pyproject.toml
	@echo "==> creating $(VENV) (first use; a few minutes) — log: $(VENV)/install.log"
	@requirements/install.sh $(PYTHON) $(VENV) $(TORCH)
	@touch $(STAMP)

# verl pins an older transformers than ours: its adapter's tests run in an environment of its own.
VERL_VENV := .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed
verl-venv: $(VERL_STAMP)  ## create .venv-verl: verl 0.9.1 with its own pins, and trace-rl without its dependencies

$(VERL_STAMP): requirements/verl-lock.txt requirements/install-verl.sh requirements/stages.sh pyproject.toml
	@echo "==> creating $(VERL_VENV) (verl's own environment; a few minutes) — log: $(VERL_VENV)/install.log"
	@requirements/install-verl.sh $(PYTHON) $(VERL_VENV) $(TORCH)
	@touch $(VERL_STAMP)

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check .

# data/ is DVC-tracked: on a fresh clone without a DVC remote it is regenerated (byte-for-byte
# deterministic) and verified against the hash recorded in data.dvc.
data/MANIFEST.json: data.dvc | $(STAMP)
	$(BIN)/python -m trace_core.data.generate --out data --verify

data: data/MANIFEST.json  ## regenerate data/ and verify it against data.dvc

# The browser test drives the MLflow UI with Debian's chromium and chromium-driver: installed here
# through apt-get when missing and this user may (root), else a clear failure naming the command;
# TRACE_RL_SKIP_BROWSER=1 skips that one test instead (pytest's summary then lists the skip).
BROWSER_PKGS := chromium chromium-driver
system-deps:  ## what the tests need from the system: chromium + chromium-driver (apt-get, as root)
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
	  echo "==> system deps: chromium and chromedriver present"; \
	elif [ "$${TRACE_RL_SKIP_BROWSER:-0}" = 1 ]; then \
	  echo "==> system deps: chromium missing; TRACE_RL_SKIP_BROWSER=1, so the MLflow UI browser test is skipped"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "==> system deps: installing $(BROWSER_PKGS) with apt-get (log: /tmp/trace-rl-apt.log)"; \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(BROWSER_PKGS) || \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(BROWSER_PKGS); }; \
	  } > /tmp/trace-rl-apt.log 2>&1 || { tail -20 /tmp/trace-rl-apt.log; \
	    echo "apt-get could not install $(BROWSER_PKGS); run it by hand or set TRACE_RL_SKIP_BROWSER=1"; exit 1; }; \
	  echo "==> system deps: $$(chromium --version 2>/dev/null | head -1)"; \
	else \
	  echo "The MLflow UI browser test needs chromium and chromium-driver. Install them with:"; \
	  echo "    sudo apt-get install -y $(BROWSER_PKGS)"; \
	  echo "or skip that one test with TRACE_RL_SKIP_BROWSER=1 make test"; exit 1; \
	fi

# Two pytest-xdist workers, a test file each at a time (its module fixtures built once): most of the
# suite waits on one thread (process starts, imports, servers, one-thread tiny models), so two
# workers overlap it on two cores. The files go out in the order tests/conftest.py gives them
# (heaviest first), not xdist's (most tests first). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest --timeout=900 \
	$(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: system-deps $(STAMP) $(VERL_STAMP) data/MANIFEST.json  ## system deps, ruff, then every test (the command CI runs)
	$(BIN)/ruff check .
	$(PYTEST) tests

run: $(STAMP)  ## the main job: the Kubeflow pipeline on this machine (kfp.local); a second run reuses what is up to date
	$(BIN)/python -m pipelines run --local

faults: $(STAMP) data/MANIFEST.json  ## the fault-injection suite alone (sandbox, data, tracking, engine, loop), with its figures
	$(PYTEST) -m faults tests

ui: $(STAMP)  ## serve the MLflow UI on the main job's runs (prints the last comparison's URL)
	$(BIN)/python -m pipelines ui

bench-allocation: $(STAMP)  ## allocators vs the DP / brute force
	$(BIN)/python -m bench.allocation

bench-contrast: $(STAMP)  ## effective ratios of every method on the simulator
	$(BIN)/python -m bench.contrast

trl-example: $(STAMP)  ## TRACE beside GRPO, both inside TRL's GRPOTrainer with multi-turn tool rollouts, on the testbed's fitted QA policy, a few steps on the CPU (examples/trl_trace.py)
	$(BIN)/python examples/trl_trace.py

results: $(STAMP)  ## rebuild docs/results.md from the committed bench/results records
	$(BIN)/python -m bench.report

specs: $(STAMP)  ## recompile the components into components/specs/ (the DAG is built from them; a test checks they are current)
	$(BIN)/python -m components.specs

lock: $(STAMP)  ## resolve requirements/base.in (beside $(TORCH)) into requirements/lock.txt; installs nothing
	$(BIN)/python requirements/lock.py --torch $(TORCH)

clean-venv:  ## remove the virtual environments
	rm -rf $(VENV) $(VERL_VENV)
