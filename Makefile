# fiar developer entry points. `make demo` and `make test` are the two Quickstart commands.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)/tools

.PHONY: venv controlplane realnode-deps browser-deps realnode images agent-image demo up down test lint typecheck check clean

# Debian packages of tier D (a real kubelet node, and images built without Docker).
REALNODE_DEBS := containerd runc containernetworking-plugins iptables buildah mmdebstrap qemu-user-static arch-test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

controlplane: venv  ## build etcd, kube-apiserver, controller-manager, scheduler, kubectl, kwok, helm (cached)
	$(PY) -m devcluster build

realnode-deps:  ## install tier D's Debian packages when root with apt-get (else its tests skip, saying why)
	@missing=$$(for p in $(REALNODE_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing $$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing \
	    || echo "realnode-deps: apt-get failed; tier-D tests will skip (or fail where FIAR_REQUIRE_REALNODE is set)"; \
	else echo "realnode-deps: not root or no apt-get; tier-D tests will skip (missing: $$missing)"; fi

# The headless browser that renders `kubectl fiar report --html` in its test (tests/kubectl_fiar).
BROWSER_DEBS := chromium

browser-deps:  ## install headless Chromium when root with apt-get (else the HTML page test skips, saying why)
	@missing=$$(for p in $(BROWSER_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing $$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing \
	    || echo "browser-deps: apt-get failed; the HTML page test will skip (or fail where FIAR_REQUIRE_REALNODE is set)"; \
	else echo "browser-deps: not root or no apt-get; the HTML page test will skip (missing: $$missing)"; fi

realnode: controlplane realnode-deps  ## tier D: the kubelet and the images (operator, agent-sim, vLLM stand-in, pause), cached
	$(PY) -m devcluster build --realnode

images: venv realnode-deps  ## the images: operator and agent-sim for amd64 and arm64 (one OCI index each), stand-in, pause (cached)
	$(PY) -m devcluster build --images

agent-image: venv realnode-deps  ## the real (CUDA) agent image for this host's arch, multi-GB; never part of test/CI
	$(PY) -m devcluster build --agent-image

demo: controlplane  ## the local demo: control plane, agents on fake GPU nodes, operator, vLLM pods
	$(PY) -m devcluster demo

up: controlplane  ## only the local control plane
	$(PY) -m devcluster up

down: venv
	$(PY) -m devcluster down

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check operator node_agent kubectl_fiar tools fiar_contract.py fiar_kube

typecheck: venv
	$(VENV)/bin/mypy

test: controlplane realnode browser-deps  ## the whole suite: lint, types, unit tests and tests against the real control plane
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
