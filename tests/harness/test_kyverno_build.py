"""Kyverno, the peer of bench/kyverno_peer.py, is pinned like the control plane and never built by default."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from devcluster import build

KYVERNO = next(t for t in build.TOOLS if t.name == "kyverno")
WRAPPER = build.MODULES_DIR / "kyverno"


def test_the_wrapper_pins_one_kyverno_release_by_version_and_checksum() -> None:
    gomod = (WRAPPER / "go.mod").read_text()
    assert re.fullmatch(r"v1\.19\.\d+", KYVERNO.version())
    assert "tool github.com/kyverno/kyverno/cmd/kyverno" in gomod
    gosum = (WRAPPER / "go.sum").read_text()
    assert f"github.com/kyverno/kyverno {KYVERNO.version()} h1:" in gosum


def test_the_wrapper_repeats_the_replace_kyverno_needs() -> None:
    # A dependency's replace directives do not apply to the module that requires it.
    gomod = (WRAPPER / "go.mod").read_text()
    assert re.search(
        r"^replace k8s\.io/pod-security-admission => github\.com/kyverno/pod-security-admission ", gomod, re.M
    )


def test_kyverno_is_built_only_when_named() -> None:
    assert "kyverno" not in {t.name for t in build.selected()}
    assert "kyverno" not in {t.name for t in build.selected(realnode=True)}
    assert [t.name for t in build.selected(["kyverno"])] == ["kyverno"]


def test_its_binary_lives_in_the_versioned_cache_outside_the_repository() -> None:
    path = build.binary_path("kyverno")
    assert path.parent.name == f"kyverno-{KYVERNO.version()}"
    assert not path.resolve().is_relative_to(build.MODULES_DIR.parents[1])


def test_a_built_binary_carries_the_pinned_module_version() -> None:
    path = build.binary_path("kyverno")
    if not path.is_file():
        pytest.skip("Kyverno is not built here (python -m devcluster build kyverno)")
    info = subprocess.run(["go", "version", "-m", str(path)], capture_output=True, text=True, check=True).stdout
    assert re.search(rf"^\s+(mod|dep)\s+github\.com/kyverno/kyverno\s+{re.escape(KYVERNO.version())}\s", info, re.M)


def test_the_benchmark_policies_parse_and_select_what_they_are_given() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import kyverno_peer
    finally:
        sys.path.pop(0)
    docs = kyverno_peer.policies({"app": "vllm"}, ["team-a"])
    env, binding = (d["spec"]["rules"][0] for d in docs)
    assert env["match"]["any"][0]["resources"]["selector"] == {"matchLabels": {"app": "vllm"}}
    assert env["match"]["any"][0]["resources"]["namespaces"] == ["team-a"]
    assert binding["match"]["any"][0]["resources"] == {"kinds": ["Pod/binding"], "namespaces": ["team-a"]}
    assert all(d["spec"]["failurePolicy"] == "Ignore" and d["spec"]["webhookTimeoutSeconds"] == 1 for d in docs)


def test_the_config_map_lets_kyverno_see_bindings() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import kyverno_peer
    finally:
        sys.path.pop(0)
    chart = {
        "resourceFilters": ["[Event,*,*]", "[Binding,*,*]", "[Pod/binding,*,*]", "[Pod,{{ x }},y]"],
        "webhooks": {"namespaceSelector": {"matchExpressions": []}},
        "excludeGroups": ["system:nodes"],
    }
    data = kyverno_peer.config_data(chart)
    assert data["resourceFilters"] == "[Event,*,*]"
    assert "kyverno" in data["webhooks"]
    assert data["excludeGroups"] == "system:nodes"
