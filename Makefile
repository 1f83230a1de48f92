# fiar developer entry points. `make demo` and `make test` are the two Quickstart commands.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)/tools

.PHONY: venv controlplane demo up down test lint typecheck check clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

controlplane: venv  ## build etcd, kube-apiserver, controller-manager, scheduler, kubectl, kwok, helm (cached)
	$(PY) -m devcluster build

demo: controlplane  ## the local demo: control plane, agents on fake GPU nodes, operator, vLLM pods
	$(PY) -m devcluster demo

up: controlplane  ## only the local control plane
	$(PY) -m devcluster up

down: venv
	$(PY) -m devcluster down

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check operator node_agent tools fiar_contract.py

typecheck: venv
	$(VENV)/bin/mypy

test: controlplane  ## the whole suite: lint, types, unit tests and tests against the real control plane
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
