"""Policy options seen through the real API server and scheduler: explicit env, Audit, priority,
VerifiedNodesOnly, and pods created with spec.nodeName."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fiar_contract as contract

pytestmark = pytest.mark.controlplane


def notes(pod: dict[str, Any]) -> dict[str, str]:
    value: dict[str, str] = pod["metadata"].get("annotations") or {}
    return value


def env(pod: dict[str, Any], container: int = 0) -> list[dict[str, Any]]:
    value: list[dict[str, Any]] = pod["spec"]["containers"][container].get("env") or []
    return value


def test_explicit_env_is_respected_and_other_containers_still_get_the_variable(kit: Any, namespace: str) -> None:
    kit.node(f"t-{kit.unique}", "trtllm")
    kit.policy(f"explicit-{kit.unique}", namespace)
    own = {"name": contract.ENV_VAR, "value": "mnnvl"}
    kit.pod(namespace, "mixed", {"name": "vllm", "image": "v", "env": [own]}, {"name": "worker", "image": "v"})
    (pod,) = kit.running(namespace, 1)
    assert env(pod, 0) == [own]
    field_path = f"metadata.annotations['{contract.ANNOTATION_POD_BACKEND}']"
    assert env(pod, 1)[0]["valueFrom"]["fieldRef"]["fieldPath"] == field_path
    assert notes(pod)[contract.ANNOTATION_POD_BACKEND] == "trtllm"


def test_audit_records_the_decision_and_changes_no_env(kit: Any, namespace: str) -> None:
    kit.node(f"m-{kit.unique}", "mnnvl")
    kit.policy(f"audit-{kit.unique}", namespace, mode="Audit")
    kit.pod(namespace, "audited")
    (pod,) = kit.running(namespace, 1)
    assert env(pod) == []
    assert pod["metadata"]["labels"][contract.LABEL_POD_POLICY] == f"audit-{kit.unique}"
    assert notes(pod)[contract.ANNOTATION_POD_BACKEND] == "mnnvl"
    assert json.loads(notes(pod)[contract.ANNOTATION_POD_DECISION])["reason"] == "Verified"


def test_overlapping_policies_resolve_by_priority(kit: Any, namespace: str) -> None:
    kit.node(f"m-{kit.unique}", "mnnvl", **{contract.LABEL_TRTLLM: "pass"})
    kit.policy(f"low-{kit.unique}", namespace, priority=1, backends=["mnnvl"])
    kit.policy(f"high-{kit.unique}", namespace, priority=10, backends=["trtllm"])
    kit.pod(namespace, "contested")
    (pod,) = kit.running(namespace, 1)
    assert pod["metadata"]["labels"][contract.LABEL_POD_POLICY] == f"high-{kit.unique}"
    assert notes(pod)[contract.ANNOTATION_POD_BACKEND] == "trtllm"


def test_verified_nodes_only_keeps_pods_off_nodes_without_an_allowed_backend(kit: Any, namespace: str) -> None:
    none_node = kit.node(f"n-{kit.unique}", "none")
    unprobed = kit.node(f"u-{kit.unique}", None)
    good = kit.node(f"t-{kit.unique}", "trtllm")
    kit.policy(f"verified-{kit.unique}", namespace, placement="VerifiedNodesOnly")
    for i in range(4):
        kit.pod(namespace, f"placed-{i}")
    pods = kit.running(namespace, 4)
    assert {p["spec"]["nodeName"] for p in pods} == {good}
    assert all(notes(p)[contract.ANNOTATION_POD_BACKEND] == "trtllm" for p in pods)
    assert none_node != good != unprobed


def test_pod_created_on_a_named_node_is_decided_at_creation(kit: Any, namespace: str) -> None:
    node = kit.node(f"t-{kit.unique}", "trtllm")
    kit.policy(f"named-{kit.unique}", namespace)
    created = kit.pod(namespace, "pinned", nodeName=node)
    assert notes(created)[contract.ANNOTATION_POD_BACKEND] == "trtllm"
    assert json.loads(notes(created)[contract.ANNOTATION_POD_DECISION])["trigger"] == "create"
    (pod,) = kit.running(namespace, 1)
    assert notes(pod)[contract.ANNOTATION_POD_BACKEND] == "trtllm"


def test_dry_run_create_returns_the_mutation_and_creates_nothing(kit: Any, namespace: str) -> None:
    kit.policy(f"dry-{kit.unique}", namespace)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "dry", "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "vllm", "image": "v"}]},
    }
    answer = kit.kube.call("POST", f"/api/v1/namespaces/{namespace}/pods", {"dryRun": "All"}, body=body)
    assert env(answer)[0]["name"] == contract.ENV_VAR
    assert kit.pods(namespace, "app=vllm") == []
