# Set-up is part of every target: a fresh machine needs only python3 (and apt as root for SLURM and FUSE).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test tour test-fast lint bench bench-quick bench-long bench-peers gpu-check slurm-up slurm-down clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first: a looser spec would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(STAMP)

## make demo: train the reference recipe, SIGKILL it mid-run, resume, show bit-identical losses.
demo: $(STAMP)
	$(VENV)/bin/ckpt demo

## make test: the whole suite; starts a local SLURM cluster and installs FUSE and strace first when run as root with apt.
test: $(STAMP)
	@bash .ci/fuse-up-if-possible
	@bash .ci/strace-up-if-possible
	@bash .ci/slurm-up-if-possible
	$(PY) -m pytest $(PYTEST_ARGS)

## make tour: the whole chain on the local SLURM cluster (3 nodes) in a few minutes, narrated; ends with a picture.
tour: $(STAMP)
	@bash .ci/slurm-up-if-possible
	$(PY) -m ckpt_tool.recipes.tour --work tour-out

## make test-fast: only the tests that need no torchrun (seconds).
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not slurm" $(PYTEST_ARGS)

## make lint: ruff's checks and formatting (CI runs it before the tests).
lint: $(STAMP)
	$(VENV)/bin/ruff check ckpt_tool tests bench setup.py
	$(VENV)/bin/ruff format --check ckpt_tool tests bench setup.py

## make bench: measure the figures in BENCHMARKS.md (several minutes).
bench: $(STAMP)
	@bash .ci/strace-up-if-possible
	$(PY) bench/run_all.py

## make bench-quick: every figure at its smallest size (a smoke test of the benchmarks, ~8-13 min here; CI runs it).
bench-quick: $(STAMP)
	@bash .ci/strace-up-if-possible
	$(PY) bench/run_all.py --quick --output $(VENV)/bench-quick.md

## make bench-peers: the same training and faults under ckpt-tool, plain torchrun, NVIDIA's resiliency extension, torchft
## and Lightning (each peer pinned in its own venv under bench/peers/.venvs, installed first; the USR1 -> requeue trials on
## the local SLURM cluster, started here; ~35 min; not part of test or bench).
bench-peers: $(STAMP)
	bash bench/peers/install.sh
	@bash .ci/slurm-up-if-possible
	$(PY) bench/peers/run_peers.py --trials 5 --json $(VENV)/bench-peers.json

## make bench-long: the 200-trial power-cut campaign and the goodput simulation (about 45 min).
bench-long: $(STAMP)
	$(PY) bench/crash_campaign.py --trials 200
	$(PY) bench/goodput_sim.py

## make gpu-check: the GPU check (docs/gpu-check.md), <= 6 min on one GPU; without CUDA: "nothing measured", exit 0 (CI).
## On the GPU machine (no venv, no network): make gpu-check GPU_PY=python3 GPU_CHECK_ARGS="--out DIR".
GPU_PY ?= $(PY)
GPU_CHECK_ARGS ?= --out $(VENV)/gpu-check
gpu-check: $(if $(filter $(PY),$(GPU_PY)),$(STAMP))
	PYTHONPATH=. $(GPU_PY) bench/gpu_check.py $(GPU_CHECK_ARGS)

slurm-up:
	bash .ci/slurm-up

slurm-down:
	bash .ci/slurm-down

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
