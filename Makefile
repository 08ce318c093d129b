# kvpd: `make demo` runs the local CPU deployment end to end; `make test` runs the whole suite.
# Both set up everything they need on a fresh machine (venvs, the CPU engine, the tiny model).

PYTHON ?= python3
VENV := .venv
KVPD := $(VENV)/bin/kvpd
ENGINE_VENV ?= $(CURDIR)/.venv-engine
MODEL_DIR := .kvpd/models/tiny
export KVPD_ENGINE_VENV := $(ENGINE_VENV)
# the engine's `vllm` must be on PATH for locally launched processes and for `kvpd bench`
export PATH := $(ENGINE_VENV)/bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test test-unit test-e2e lint docs venv engine model services system-deps aarch64 clean

$(VENV)/.stamp: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -U pip
	$(VENV)/bin/pip install -q -e '.[dev,proxy,bench]'
	touch $@

venv: $(VENV)/.stamp

engine: venv
	bash scripts/install-engine.sh

# memcache MetaService + mooncake_master on CPU, for rehearsals (`kvpd up --rehearse`) and tests
services:
	bash scripts/install-services.sh

# The aarch64 cross compiler, qemu and an emulated arm64 Python with NumPy: the native core is
# cross-built for aarch64 hosts and its tests run under emulation (scripts/install-aarch64.sh).
aarch64: venv
	bash scripts/install-aarch64.sh

model: engine
	@test -f $(MODEL_DIR)/config.json || $(KVPD) model tiny $(MODEL_DIR) --seed 0

# OS packages the end-to-end tests use (sshd and iproute2 for the test bed, libibverbs1 for
# Mooncake). Only as root with apt; elsewhere the tests that need them skip and say why.
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  for p in openssh-server openssh-client iproute2 procps libibverbs1 curl; do \
	    dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi; \
	fi

demo: model
	$(KVPD) plan local
	$(KVPD) up local --yes
	$(KVPD) bench local || { $(KVPD) down local; exit 1; }
	$(KVPD) down local

# The tests not marked e2e or ssh run in UNIT_WORKERS processes (pytest-xdist), a module per
# process at a time, so module fixtures stay whole: 6 min 53 s instead of 11 min 17 s on 2 cores.
# The e2e and SSH tests share one engine install, one local deployment and one test bed, and
# their engines already take both cores: they run in one process.
UNIT_WORKERS ?= 2
UNIT_PYTEST = $(VENV)/bin/pytest -q -n $(UNIT_WORKERS) --dist loadfile -m "not e2e and not ssh"

test-unit: venv
	$(UNIT_PYTEST)

test: venv system-deps model services aarch64
	$(VENV)/bin/ruff check kvpd tests benchmarks
	$(VENV)/bin/ruff format --check kvpd tests benchmarks
	$(VENV)/bin/mypy
	$(UNIT_PYTEST)
	$(VENV)/bin/pytest -q -m "e2e or ssh"

test-e2e: venv system-deps model services
	$(VENV)/bin/pytest -q -m "e2e or ssh"

# The documentation site (docs/, mkdocs.yml) into site/, failing on any broken link.
docs: venv
	$(VENV)/bin/mkdocs build --strict --quiet

lint: venv
	$(VENV)/bin/ruff check kvpd tests benchmarks
	$(VENV)/bin/ruff format --check kvpd tests benchmarks
	$(VENV)/bin/mypy

clean:
	rm -rf .kvpd build site *.egg-info
