# GLM-5 GGUF on Blackwell (SM120) with vLLM: the user interface. `make help` lists targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-builtin-rules

PYTHON      ?= python3.11
VENV        := .venv
PY          := $(VENV)/bin/python
# The runtime environment (vllm==0.23.0 + transformers + torch + triton, ~9 GB) lives outside the
# repo so every clone shares it; its name carries a hash of its requirements, so a pin change
# builds a new one instead of mutating the old.
CACHE_DIR   ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/glm5-sm120
RUNTIME_REQ := requirements/runtime.in
RUNTIME_VENV ?= $(CACHE_DIR)/runtime-$(shell sha256sum $(RUNTIME_REQ) | cut -c1-12)
RUNTIME_PY  := $(RUNTIME_VENV)/bin/python
PYTEST_ARGS ?=

HOST      ?= localhost
INVENTORY ?= inventory/hosts.yml

.PHONY: help test test-controller test-runtime lint format bench bench-merge bench-kernels runtime lock merge clean probe

help: ## List targets
	@grep -hE '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n",$$1,$$2}'

$(VENV)/.installed: requirements/controller.txt
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "error: the controller needs Python 3.11"'
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements/controller.txt
	touch $@

$(RUNTIME_VENV)/.installed:
	rm -rf $(RUNTIME_VENV)
	$(PYTHON) -m venv $(RUNTIME_VENV)
	$(RUNTIME_VENV)/bin/pip install -q --disable-pip-version-check -r $(RUNTIME_REQ)
	$(RUNTIME_VENV)/bin/pip check
	touch $@

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
	$(PY) benchmarks/bench_merge.py $(BENCH_MERGE_ARGS)

probe: | $(RUNTIME_VENV)/.installed ## Every vLLM attention backend's verdict on GLM-5 on SM120 (fp16)
	PYTHONPATH=backend/src $(RUNTIME_PY) scripts/probe_backends.py --capability 12.0 --dtype float16 \
	  --head-size 576 --sparse --kv-cache-dtype auto --block-size 64 $(PROBE_ARGS)

lock: ## Re-resolve requirements/controller.txt from controller.in
	rm -rf /tmp/glm5-lock && $(PYTHON) -m venv /tmp/glm5-lock
	/tmp/glm5-lock/bin/pip install -q -r requirements/controller.in
	{ echo "# Generated from controller.in by: pip freeze (Python 3.11). Regenerate: make lock"; \
	  /tmp/glm5-lock/bin/pip freeze; } > requirements/controller.txt

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

# Sparse MLA / indexer kernel benchmark (needs a CUDA GPU; on a CPU-only box it prints a skip
# message and succeeds). Results and method: benchmarks/RESULTS.md.
BENCH_KERNELS_ARGS ?=
bench-kernels: | $(RUNTIME_VENV)/.installed ## Time the Triton sparse MLA + indexer kernels (GPU host)
	$(RUNTIME_PY) benchmarks/bench_kernels.py $(BENCH_KERNELS_ARGS)

# --- Deployment (playbooks/, issue 7) ---------------------------------------------------------
# The real inventory is the untracked inventory/hosts.yml; without it the example is used. A HOST
# that is not in the inventory is reached as a bare name/IP (`-i "HOST,"`); localhost is local.
DEPLOY_INVENTORY = $(if $(wildcard $(INVENTORY)),$(INVENTORY),inventory/hosts.example.yml)
ANSIBLE_TARGET   = -i $(DEPLOY_INVENTORY) -i "$(HOST)," -l "$(HOST)" \
                   $(if $(filter localhost,$(HOST)),-e ansible_connection=local -e ansible_python_interpreter=/usr/bin/python3)
ANSIBLE_ARGS    ?=
.PHONY: deploy verify-patches smoke system-deps

deploy: $(VENV)/.installed ## Provision a host end to end: make deploy HOST=gpu01 [CHECK=1] [ANSIBLE_ARGS=...]
	@[ -n "$(HOST)" ] || { echo "error: set HOST= (inventory name, hostname or IP)" >&2; exit 2; }
	$(VENV)/bin/ansible-playbook $(ANSIBLE_TARGET) playbooks/site.yml $(if $(CHECK),--check --diff) $(ANSIBLE_ARGS)

verify-patches: $(VENV)/.installed ## Re-verify pins, vLLM patches and the service on HOST (changes nothing)
	@[ -n "$(HOST)" ] || { echo "error: set HOST=" >&2; exit 2; }
	$(VENV)/bin/ansible-playbook $(ANSIBLE_TARGET) playbooks/verify.yml $(ANSIBLE_ARGS)

smoke: $(VENV)/.installed ## Smoke-test the endpoint on HOST from the host itself (scripts/smoke_test.py)
	@[ -n "$(HOST)" ] || { echo "error: set HOST=" >&2; exit 2; }
	$(VENV)/bin/ansible-playbook $(ANSIBLE_TARGET) playbooks/smoke.yml $(ANSIBLE_ARGS)

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
.PHONY: cluster-status cluster-logs cluster-restart
cluster-status: $(VENV)/.installed ## Ray unit on every cluster host, alive nodes, vLLM on the head
	GLM5_INVENTORY=$(INVENTORY) $(VENV)/bin/fab -c fabfile_cluster status

cluster-logs: $(VENV)/.installed ## Journal of the Ray unit on every cluster host: make cluster-logs [LINES=200]
	GLM5_INVENTORY=$(INVENTORY) $(VENV)/bin/fab -c fabfile_cluster logs --lines $(or $(LINES),100)

cluster-restart: $(VENV)/.installed ## Restart the cluster in order: vLLM down, Ray head, workers, vLLM up
	GLM5_INVENTORY=$(INVENTORY) $(VENV)/bin/fab -c fabfile_cluster restart
