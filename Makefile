# GLM-5 GGUF on Blackwell (SM120) with vLLM: the user interface. `make help` lists targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-builtin-rules

# The controller runs on Python 3.11-3.13 (as ansible-core 2.19 does): the first of these found.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(or $(shell for p in python3 python3.13 python3.12 python3.11; do \
            $$p -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' \
            2>/dev/null && { echo $$p; break; }; done),python3)
endif
VENV        ?= .venv
PY          := $(VENV)/bin/python
# The runtime environment (vllm==0.23.0 + transformers + torch + triton, ~9 GB) lives outside the
# repo so every clone shares it; its name carries a hash of its requirements, so a pin change
# builds a new one instead of mutating the old. scripts/cached_venv.py builds it under a lock.
CACHE_DIR   ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/glm5-sm120
RUNTIME_REQ := requirements/runtime.in
RUNTIME_VENV ?= $(CACHE_DIR)/runtime-$(shell sha256sum $(RUNTIME_REQ) | cut -c1-12)
RUNTIME_PY  := $(RUNTIME_VENV)/bin/python
PYTEST_ARGS ?=

HOST      ?= localhost
INVENTORY ?= inventory/hosts.yml

.PHONY: help setup python-check test test-controller test-runtime lint format bench bench-merge bench-kernels bench-serve runtime lock merge clean probe

help: ## List targets
	@grep -hE '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n",$$1,$$2}'

# A wrong Python is one line that says what to install, before anything is created.
python-check:
	@$(PYTHON) -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null || \
	  { echo "error: the controller needs Python 3.11, 3.12 or 3.13 ($(PYTHON) is $$(command -v $(PYTHON) >/dev/null && $(PYTHON) -V 2>&1 | head -1 || echo not installed)): apt-get install python3 python3-venv, or make PYTHON=python3.12" >&2; exit 2; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || \
	  { echo "error: $(PYTHON) has no venv/ensurepip module: apt-get install python3-venv (or python$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv)" >&2; exit 2; }

# The check runs only when an env is (re)built: an existing .venv keeps working whatever python3 is.
$(VENV)/.installed: requirements/controller.txt
	@$(MAKE) --no-print-directory python-check
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements/controller.txt
	touch $@

setup: $(VENV)/.installed ## Create the controller env .venv (first command on a new machine)
	@echo "controller env ready: $(VENV) ($$($(PY) -V)); next: cp inventory/hosts.example.yml inventory/hosts.yml, edit it, then make deploy HOST=<name> (make help lists the rest)"

$(RUNTIME_VENV)/.installed:
	@$(MAKE) --no-print-directory python-check
	$(PYTHON) scripts/cached_venv.py --python $(PYTHON) --requirements $(RUNTIME_REQ) $(RUNTIME_VENV)

runtime: | $(RUNTIME_VENV)/.installed ## Build the cached vLLM 0.23.0 runtime env (~9 GB, ~8 min once)
	@echo "$(RUNTIME_VENV)"

test: test-controller test-runtime ## Run the whole test suite (CPU only; GPU tests are skipped)

test-controller: $(VENV)/.installed
	$(VENV)/bin/pytest -m "not runtime" $(PYTEST_ARGS)

test-runtime: | $(RUNTIME_VENV)/.installed
	$(RUNTIME_PY) -m pytest -m "runtime" $(PYTEST_ARGS)

lint: $(VENV)/.installed ## Lint Python (ruff), YAML (yamllint) and Ansible (ansible-lint)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/yamllint -s .
	if [ -d playbooks/roles ]; then $(VENV)/bin/ansible-lint; fi

format: $(VENV)/.installed ## Reformat Python with ruff
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

merge: $(VENV)/.installed ## Merge split GGUF shards: make merge SHARD=x-00001-of-00010.gguf OUT=x.gguf
	@[ -n "$(SHARD)" ] && [ -n "$(OUT)" ] || { echo "error: set SHARD= (any shard) and OUT= (merged file)" >&2; exit 2; }
	$(PY) scripts/gguf_merge.py $(MERGE_ARGS) "$(SHARD)" "$(OUT)"

bench: bench-merge bench-kernels ## Run the benchmarks (merge here; kernels need a CUDA GPU)

bench-merge: $(VENV)/.installed ## Merge vs cat vs llama-gguf-split (~20 GB free in /tmp, ~10 min)
	PYTHONPATH=scripts:tests $(PY) benchmarks/bench_merge.py $(BENCH_MERGE_ARGS)

probe: | $(RUNTIME_VENV)/.installed ## Every vLLM attention backend's verdict on GLM-5 on SM120 (fp16)
	PYTHONPATH=backend/src $(RUNTIME_PY) scripts/probe_backends.py --capability 12.0 --dtype float16 \
	  --head-size 576 --sparse --kv-cache-dtype auto --block-size 64 $(PROBE_ARGS)

lock: $(VENV)/.installed ## Re-resolve requirements/controller.txt from controller.in, for Python 3.11-3.13
	$(PY) scripts/controller_lock.py

clean: ## Remove the controller venv and caches inside the repo
	rm -rf $(VENV) .pytest_cache .ruff_cache

# --- vLLM patch series (patches/vllm-0.23.0, scripts/vllm_patches.py) ---
.PHONY: verify-patches-local patch-tool
RUNTIME_SITE = $(shell $(RUNTIME_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

verify-patches-local: patch-tool | $(RUNTIME_VENV)/.installed ## Verify the vLLM patch series on the local runtime env
	$(RUNTIME_PY) scripts/vllm_patches.py verify --site-packages "$(RUNTIME_SITE)"

# GNU patch applies the series; minimal Debian images lack it (installed when running as root).
patch-tool:
	@command -v patch >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  apt-get install -y -qq patch >/dev/null; } || \
	  { echo "error: GNU patch is missing: apt-get install patch" >&2; exit 2; }

test-runtime: patch-tool

# Sparse MLA / indexer kernel benchmark (needs a CUDA GPU; on a machine without one it says so
# and succeeds, without building the 9 GB runtime env). Results and method: benchmarks/RESULTS.md.
BENCH_KERNELS_ARGS ?=
bench-kernels: ## Time the Triton sparse MLA + indexer kernels (GPU host)
	@if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then \
	  echo "bench-kernels: skipped: no CUDA GPU here (nvidia-smi -L lists none); the runtime env was not built"; exit 0; fi; \
	  $(MAKE) --no-print-directory runtime >/dev/null && \
	  PYTHONPATH=tests:scripts:backend/src $(RUNTIME_PY) benchmarks/bench_kernels.py $(BENCH_KERNELS_ARGS)

# Serving benchmark at GLM-5's real layer geometry (needs a CUDA GPU and a Python whose vLLM has
# the patch series and the plugin: a deployed host's venv, or tests/e2e staging's /tmp/site).
BENCH_SERVE_PY ?= /opt/glm5/venv/bin/python
BENCH_SERVE_ARGS ?=
bench-serve: ## Serving benchmark, GLM-5 geometry, Q4_K_M/IQ4_XS/UD-IQ2_M (GPU host; BENCH_SERVE_PY=)
	@if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then \
	  echo "bench-serve: skipped: no CUDA GPU here (nvidia-smi -L lists none)"; exit 0; fi; \
	  PYTHONPATH=scripts:tests:backend/src $(BENCH_SERVE_PY) benchmarks/bench_serve.py $(BENCH_SERVE_ARGS)

# --- Deployment (playbooks/, issue 7) ---------------------------------------------------------
# scripts/ansible_targets.py turns HOST into ansible-playbook's inventory options: an inventory
# group targets its members, an inventory host itself, localhost this machine (local connection),
# any other name is reached as a bare hostname/IP. Example inventories are never used.
# INVENTORY= names another inventory file (it must exist). Extra variables: VARS=file.yml (YAML
# or JSON, make passes it quoted; preflight warns about names no role knows).
# CHECK=1 (or yes/true) is --check --diff; 0, no, false or empty is a real run.
TARGETS   = $(PY) scripts/ansible_targets.py --host "$(HOST)" \
            $(if $(filter file,$(origin INVENTORY)),,--inventory "$(INVENTORY)") --
CHECK_ON  = $(filter 1 yes true,$(CHECK))
VARS_ARGS = $(if $(VARS),-e @"$$(realpath -- "$(VARS)")" -e preflight_vars_file="$$(realpath -- "$(VARS)")")
ANSIBLE_ARGS    ?=
.PHONY: deploy verify-patches smoke system-deps deploy-args

deploy-args:
	@[ -z "$(CHECK)" ] || [ -n "$(CHECK_ON)" ] || [ -n "$(filter 0 no false,$(CHECK))" ] || \
	  { echo "error: CHECK=$(CHECK): use CHECK=1 (check mode) or CHECK=0 (real run)" >&2; exit 2; }
	@[ -z "$(VARS)" ] || [ -f "$(VARS)" ] || { echo "error: VARS=$(VARS): no such file" >&2; exit 2; }

deploy: $(VENV)/.installed deploy-args ## Provision a host end to end: make deploy HOST=gpu01 [CHECK=1] [VARS=overrides.yml]
	$(TARGETS) $(VENV)/bin/ansible-playbook playbooks/site.yml $(if $(CHECK_ON),--check --diff) $(VARS_ARGS) $(ANSIBLE_ARGS)

verify-patches: $(VENV)/.installed deploy-args ## Re-verify pins, vLLM patches and the service on HOST (changes nothing)
	$(TARGETS) $(VENV)/bin/ansible-playbook playbooks/verify.yml $(VARS_ARGS) $(ANSIBLE_ARGS)

smoke: $(VENV)/.installed deploy-args ## Smoke-test the endpoint on HOST from the host itself [CHECK=1]
	$(TARGETS) $(VENV)/bin/ansible-playbook playbooks/smoke.yml $(if $(CHECK_ON),--check --diff) $(VARS_ARGS) $(ANSIBLE_ARGS)

# nspawn test hosts (tests/support/nspawn_targets.py): systemd-nspawn, debootstrap for their base
# tree, dpkg-deb/apt-ftparchive/gpg for the stand-in NVIDIA repository, ssh both ways.
SYSTEM_DEPS_BIN := sshd:openssh-server ssh:openssh-client systemd-analyze:systemd \
  systemd-nspawn:systemd-container debootstrap:debootstrap dpkg-deb:dpkg-dev \
  apt-ftparchive:apt-utils gpg:gpg
system-deps: ## Debian packages the deployment tests need (sshd, systemd-nspawn, debootstrap, ...); root only
	@missing=$$(for p in $(SYSTEM_DEPS_BIN); do command -v $${p%%:*} >/dev/null || echo $${p#*:}; done); \
	if [ -n "$$missing" ]; then \
	  [ "$$(id -u)" = 0 ] || { echo "error: run as root to install:" $$missing >&2; exit 2; }; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  timeout 600 apt-get install -y -q --no-install-recommends $$missing || \
	  { timeout 600 apt-get update -q && timeout 600 apt-get install -y -q --no-install-recommends $$missing; }; \
	fi

# --- Multi-host serving (vLLM over Ray; issue 9) --------------------------------------------
# The fabfiles read inventory/hosts.yml, or INVENTORY= when given (never an example inventory).
FAB = $(if $(filter file,$(origin INVENTORY)),,GLM5_INVENTORY="$(INVENTORY)") $(VENV)/bin/fab
.PHONY: status cluster-status cluster-logs cluster-restart
status: $(VENV)/.installed ## GPU, driver, service, patches and /health of every host (HOST= for one)
	$(FAB) $(if $(filter command line environment,$(origin HOST)),-H "$(HOST)") status

cluster-status: $(VENV)/.installed ## Ray unit on every cluster host, alive nodes, vLLM on the head
	$(FAB) -c fabfile_cluster status

cluster-logs: $(VENV)/.installed ## Journal of the Ray unit on every cluster host: make cluster-logs [LINES=200]
	$(FAB) -c fabfile_cluster logs --lines $(or $(LINES),100)

cluster-restart: $(VENV)/.installed ## Restart the cluster in order: vLLM down, Ray head, workers, vLLM up
	$(FAB) -c fabfile_cluster restart
