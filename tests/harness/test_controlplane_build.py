"""The control-plane binaries are built from the pinned modules and report the pinned versions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devcluster import build


def _version_of(tool: str) -> str:
    return next(t for t in build.TOOLS if t.name == tool).version()


@pytest.mark.parametrize("binary", ["kube-apiserver", "kube-controller-manager", "kube-scheduler"])
def test_kubernetes_binaries_report_the_pinned_version(controlplane_binaries: dict[str, Path], binary: str) -> None:
    out = subprocess.run([str(controlplane_binaries[binary]), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"Kubernetes {_version_of('k8s')}"


def test_kubectl_reports_the_pinned_client_version(controlplane_binaries: dict[str, Path]) -> None:
    out = subprocess.run([str(controlplane_binaries["kubectl"]), "version", "--client"], capture_output=True,
                         text=True, check=True)
    assert f"Client Version: {_version_of('k8s')}" in out.stdout


def test_etcd_reports_the_version_paired_with_kubernetes(controlplane_binaries: dict[str, Path]) -> None:
    out = subprocess.run([str(controlplane_binaries["etcd"]), "--version"], capture_output=True, text=True, check=True)
    assert f"etcd Version: {_version_of('etcd').lstrip('v')}" in out.stdout
    k8s_gomod = (build.MODULES_DIR / "k8s" / "go.sum").read_text()
    assert f"go.etcd.io/etcd/client/v3 {_version_of('etcd')}" in k8s_gomod


def test_helm_reports_the_pinned_version(controlplane_binaries: dict[str, Path]) -> None:
    out = subprocess.run([str(controlplane_binaries["helm"]), "version", "--short"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.startswith(_version_of("helm"))


def test_binaries_live_in_a_versioned_cache_outside_the_repository(controlplane_binaries: dict[str, Path]) -> None:
    repo = build.MODULES_DIR.parents[1]
    for name, path in controlplane_binaries.items():
        assert path.is_file(), name
        assert not path.resolve().is_relative_to(repo), f"{name} built inside the repository"
        assert path.parent.name.endswith(tuple(t.version() for t in build.TOOLS))


def test_a_missing_go_toolchain_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(build.BuildError, match=r"missing required tool\(s\): go, git"):
        build.require_tools()
