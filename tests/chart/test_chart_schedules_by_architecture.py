"""The chart puts fiar only on nodes of an architecture its images exist for (mixed fleets).

A GPU fleet mixes x86 hosts (H100, H200) with Grace ones (GB200, GH200: ``kubernetes.io/arch=arm64``).
Each image is one multi-architecture index, so one reference serves both; a node of any other
architecture must get no agent pod (an exec format error would crash-loop it) — ``kubectl fiar
status`` names it instead. The rendered affinity is evaluated here the way the scheduler does:
terms ORed, the expressions of a term ANDed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import fiar_contract as contract
from devcluster.binaries import helm, kubernetes_version, render, set_args

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fiar"

FLEET = {
    "h100-x86": {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.present": "true"},
    "gb200-grace": {"kubernetes.io/arch": "arm64", "nvidia.com/gpu.present": "true"},
    "power-gpu": {"kubernetes.io/arch": "ppc64le", "nvidia.com/gpu.present": "true"},
    "arm-cpu-only": {"kubernetes.io/arch": "arm64"},
}


def _matches(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    value = labels.get(expr["key"])
    op = expr["operator"]
    if op == "In":
        return value in expr["values"]
    if op == "NotIn":
        return value not in expr["values"]
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    raise AssertionError(f"operator {op} not evaluated by this test")


def schedulable(pod_spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """The pod's nodeSelector and required node affinity against one node's labels."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    node_affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return any(
        all(_matches(e, labels) for e in term.get("matchExpressions") or []) for term in required["nodeSelectorTerms"]
    )


def pod_specs(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    docs = render(CHART, values)
    out = {}
    for doc in docs:
        if doc["kind"] in ("DaemonSet", "Deployment"):
            out[doc["metadata"]["labels"]["app.kubernetes.io/component"]] = doc["spec"]["template"]["spec"]
    return out


def test_the_default_architectures_are_the_ones_the_images_are_built_for() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert tuple(values["architectures"]) == contract.IMAGE_ARCHITECTURES


def test_a_mixed_fleet_gets_an_agent_on_every_gpu_node_of_a_shipped_architecture_only(
    controlplane_binaries: Any,
) -> None:
    specs = pod_specs({})
    agent = [n for n, labels in FLEET.items() if schedulable(specs["agent"], labels)]
    operator = [n for n, labels in FLEET.items() if schedulable(specs["operator"], labels)]
    assert agent == ["h100-x86", "gb200-grace"]
    assert operator == ["h100-x86", "gb200-grace", "arm-cpu-only"]


def test_narrowed_architectures_leave_the_other_nodes_without_an_agent(controlplane_binaries: Any) -> None:
    specs = pod_specs({"architectures[0]": "arm64"})
    assert [n for n, labels in FLEET.items() if schedulable(specs["agent"], labels)] == ["gb200-grace"]
    assert [n for n, labels in FLEET.items() if schedulable(specs["operator"], labels)] == [
        "gb200-grace",
        "arm-cpu-only",
    ]


def test_an_admins_own_node_affinity_keeps_its_terms_and_gains_the_architecture(controlplane_binaries: Any) -> None:
    own = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]},
                ]
            }
        },
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    specs = pod_specs({"agent.affinity": own, "operator.affinity": own})
    for component in ("agent", "operator"):
        affinity = specs[component]["affinity"]
        assert "podAffinity" in affinity
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert [t["matchExpressions"][0]["values"] for t in terms] == [["a"], ["b"]]
        arch = {"key": "kubernetes.io/arch", "operator": "In", "values": list(contract.IMAGE_ARCHITECTURES)}
        assert all(t["matchExpressions"][1] == arch for t in terms)
    pool_b = {**FLEET["gb200-grace"], "pool": "b"}
    assert schedulable(specs["agent"], pool_b)
    assert not schedulable(specs["agent"], {**FLEET["power-gpu"], "pool": "b"})


def test_the_operator_keeps_spreading_its_replicas_by_default(controlplane_binaries: Any) -> None:
    affinity = pod_specs({})["operator"]["affinity"]
    term = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"


@pytest.mark.parametrize(
    "values",
    [{"architectures": []}, {"architectures[0]": "ARM64"}, {"architectures[0]": "arm64", "architectures[1]": "arm64"}],
    ids=["none", "not-a-goarch", "twice"],
)
def test_the_schema_rejects_architectures_that_cannot_name_a_node(
    controlplane_binaries: Any, values: dict[str, Any]
) -> None:
    proc = helm("template", "fiar", str(CHART), "--kube-version", kubernetes_version(), *set_args(values), check=False)
    assert proc.returncode != 0
    assert "architectures" in proc.stderr
