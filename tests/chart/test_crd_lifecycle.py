"""The FiAllreducePolicy CRD across releases, with the real helm binary and API server.

The chart ships the CRD in its crds/ folder: no release owns it, so uninstalling keeps every policy
and a later install under another release name and namespace works. The operator keeps the CRD at
its own version (``--install-crd``, which the chart passes under ``crds.manage``), so a ``helm
upgrade`` whose operator carries a new schema updates the CRD.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import fiar_contract as contract
from devcluster.binaries import helm
from devcluster.cluster import Component, ControlPlane, Tier, free_port
from devcluster.waiting import wait_for
from fiar_operator import crd
from fiar_operator.core.errors import ApiError, ConfigurationError
from fiar_operator.state import kube

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fiar"
CRD_NAME = f"{contract.PLURAL}.{contract.GROUP}"
BIN = Path(sys.executable).parent


def _spec_properties(doc: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return props


def _established(client: kube.Kube) -> bool:
    doc = client.call("GET", f"{kube.CRDS}/{CRD_NAME}")
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in doc["status"]["conditions"])


def test_install_under_another_release_name_after_uninstall_keeps_the_policies(private_plane: Any) -> None:
    plane: ControlPlane = private_plane(Tier.A)
    client = kube.Kube(plane.api_client())
    helm("install", "gpu-ai", str(CHART), "--namespace", "ai-infra", "--create-namespace",
         kubeconfig=plane.kubeconfig)
    wait_for(lambda: _established(client), 30, "CRD Established")
    policy = {"apiVersion": f"{contract.GROUP}/{contract.VERSION}", "kind": contract.KIND,
              "metadata": {"name": "keep-me"}, "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}}}
    client.call("POST", kube.POLICIES, body=policy)
    helm("uninstall", "gpu-ai", "--namespace", "ai-infra", "--wait", kubeconfig=plane.kubeconfig)

    # The README's command, under another release name and namespace.
    helm("install", "fiar", str(CHART), "--namespace", "fiar-system", "--create-namespace",
         kubeconfig=plane.kubeconfig)
    assert client.call("GET", f"{kube.POLICIES}/keep-me")["spec"]["backends"] == ["mnnvl", "trtllm"]
    annotations = client.call("GET", f"{kube.CRDS}/{CRD_NAME}")["metadata"].get("annotations") or {}
    assert "meta.helm.sh/release-name" not in annotations, "no release owns the CRD"
    helm("uninstall", "fiar", "--namespace", "fiar-system", "--wait", kubeconfig=plane.kubeconfig)
    assert client.call("GET", f"{kube.POLICIES}/keep-me")


def test_helm_upgrade_brings_the_crd_to_the_new_operators_schema(private_plane: Any, tmp_path: Path) -> None:
    plane: ControlPlane = private_plane(Tier.A)
    client = kube.Kube(plane.api_client())
    # The previous release: its CRD lacks a property that this version's CRD has.
    old_chart = tmp_path / "fiar-old"
    shutil.copytree(CHART, old_chart, symlinks=False)
    old_crd = crd.definition()
    del _spec_properties(old_crd)["groupKeyLabel"]
    (old_chart / "crds" / crd.FILE).write_text(yaml.safe_dump(old_crd))
    helm("install", "fiar", str(old_chart), "--namespace", "fiar-system", "--create-namespace",
         kubeconfig=plane.kubeconfig)
    wait_for(lambda: _established(client), 30, "CRD Established")
    assert "groupKeyLabel" not in _spec_properties(client.call("GET", f"{kube.CRDS}/{CRD_NAME}"))

    helm("upgrade", "fiar", str(CHART), "--namespace", "fiar-system", kubeconfig=plane.kubeconfig)
    manifest = helm("get", "manifest", "fiar", "--namespace", "fiar-system", kubeconfig=plane.kubeconfig).stdout
    deployment = next(d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--install-crd" in args

    # The new operator pod starts (here: a local process with the chart's arguments and the token of
    # the chart's operator account, whose RBAC allows patching this one CRD).
    kubeconfig = plane.write_kubeconfig(tmp_path / "operator.kubeconfig", "fiar-operator",
                                        token=plane.service_account_token("fiar-system", "fiar-operator"))
    assert plane.ca is not None
    cert, key = plane.ca.issue("fiar-operator", hosts=("127.0.0.1",)).write(tmp_path, "serving")
    metrics = free_port()
    local = [a for a in args if not a.startswith(("--webhook-", "--tls-", "--metrics-"))]
    operator = Component("operator", [str(BIN / "fiar-operator"), *local, "--kubeconfig", str(kubeconfig),
                                      "--webhook-host", "127.0.0.1", "--webhook-port", str(free_port()),
                                      "--tls-cert", str(cert), "--tls-key", str(key),
                                      "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics)],
                         tmp_path / "operator.log", f"http://127.0.0.1:{metrics}/readyz")
    try:
        operator.start()
        wait_for(lambda: "groupKeyLabel" in _spec_properties(client.call("GET", f"{kube.CRDS}/{CRD_NAME}")),
                 60, "the operator applying its CRD")
        operator.wait_ready(60)
    except BaseException:
        print("--- operator log ---\n" + operator.tail())
        raise
    finally:
        operator.stop()
    stored = client.call("GET", f"{kube.CRDS}/{CRD_NAME}")
    assert _spec_properties(stored) == _spec_properties(crd.definition())


def test_operator_account_may_update_but_not_create_the_crd(private_plane: Any, tmp_path: Path) -> None:
    """Patch on one CRD name is all the chart grants: without the CRD (``--skip-crds``) the operator
    stops with a message saying how to install it, and it may touch no other CRD."""
    plane: ControlPlane = private_plane(Tier.A)
    helm("install", "fiar", str(CHART), "--namespace", "fiar-system", "--create-namespace", "--skip-crds",
         kubeconfig=plane.kubeconfig)
    kubeconfig = plane.write_kubeconfig(tmp_path / "operator.kubeconfig", "fiar-operator",
                                        token=plane.service_account_token("fiar-system", "fiar-operator"))
    operator = kube.Kube(kube.configuration(str(kubeconfig)))
    with pytest.raises(ConfigurationError, match="is not installed and this account may not create it"):
        crd.apply(operator)
    kube.Kube(plane.api_client()).server_side_apply(kube.CRDS, crd.definition(), "admin")
    assert crd.apply(operator)["metadata"]["name"] == CRD_NAME
    other = {**crd.definition(), "metadata": {"name": "others.fiar.io"}}
    with pytest.raises(ApiError) as denied:
        operator.server_side_apply(kube.CRDS, other, crd.FIELD_MANAGER)
    assert denied.value.status == 403
