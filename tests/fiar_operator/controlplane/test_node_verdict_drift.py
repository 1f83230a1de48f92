"""When a node's verdict changes, its running pods whose backend is no longer verified are
re-annotated, get a Warning event, and are counted stale in the policy status."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fiar_contract as contract

pytestmark = pytest.mark.controlplane


def backend(kit: Any, namespace: str, name: str) -> str | None:
    pod = kit.kube.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    value: str | None = (pod["metadata"].get("annotations") or {}).get(contract.ANNOTATION_POD_BACKEND)
    return value


def test_relabelled_node_reannotates_its_pods_and_emits_events(operator: Any, kit: Any, namespace: str) -> None:
    node = kit.node(f"d-{kit.unique}", "mnnvl")
    policy = f"drift-{kit.unique}"
    kit.policy(policy, namespace)
    kit.pod(namespace, "a")
    kit.pod(namespace, "b")
    kit.running(namespace, 2)
    assert backend(kit, namespace, "a") == backend(kit, namespace, "b") == "mnnvl"

    kit.relabel(node, {contract.LABEL_BACKEND: "trtllm"})
    for name in ("a", "b"):
        kit.wait(lambda name=name: backend(kit, namespace, name) == "trtllm", 30, f"pod {name} re-annotated")
    pod = kit.kube.call("GET", f"/api/v1/namespaces/{namespace}/pods/a")
    decision = json.loads(pod["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])
    assert decision["trigger"] == "reconcile" and decision["previous"] == "mnnvl"
    assert decision["nodeVerdict"] == "trtllm" and decision["reason"] == "Verified"

    def warned() -> list[dict[str, Any]]:
        return [e for e in kit.events(namespace, "a") if e["reason"] == "NodeVerdictChanged"]

    (event,) = kit.wait(warned, 30, "NodeVerdictChanged event")
    assert event["type"] == "Warning" and "mnnvl -> trtllm" in event["message"]
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]

    def stale() -> Any:
        return (kit.get_policy(policy).get("status") or {}).get("pods", {}).get("stale") == 2

    kit.wait(stale, 30, "two stale pods in the policy status")
    status = kit.get_policy(policy)["status"]
    assert status["pods"]["decided"] == 2
    assert operator.counter("fiar_pods_reannotated_total", reason="NodeVerdictChanged") >= 2

    kit.relabel(node, {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_TRTLLM: "pass"})
    kit.wait(lambda: kit.get_policy(policy)["status"]["nodes"]["mnnvl"] >= 1, 30, "node counted as mnnvl")
    assert backend(kit, namespace, "a") == "trtllm", "a backend that is still verified is left alone"
