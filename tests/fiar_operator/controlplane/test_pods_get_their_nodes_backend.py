"""End to end on the real control plane: every vLLM pod gets the backend its node verified."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.workloads import container, vllm_deployment

pytestmark = pytest.mark.controlplane

FIELD_PATH = f"metadata.annotations['{contract.ANNOTATION_POD_BACKEND}']"


def annotations(pod: dict[str, Any]) -> dict[str, str]:
    notes: dict[str, str] = pod["metadata"].get("annotations") or {}
    return notes


def env_entry(pod: dict[str, Any], container: int = 0) -> dict[str, Any] | None:
    env = pod["spec"]["containers"][container].get("env") or []
    return next((e for e in env if e["name"] == contract.ENV_VAR), None)


def test_deployment_pods_get_the_verdict_of_the_node_they_were_bound_to(
    operator: Any, kit: Any, namespace: str
) -> None:
    verdicts = {f"m-{kit.unique}": "mnnvl", f"t-{kit.unique}": "trtllm", f"n-{kit.unique}": "none"}
    for name, verdict in verdicts.items():
        kit.node(name, verdict)
    kit.policy(f"deploy-{kit.unique}", namespace)
    replicas = 9
    deployment = vllm_deployment(
        replicas,
        container(image="vllm/vllm-openai:latest"),
        container("sidecar", "busybox"),
        node_selector={f"pool-{kit.unique}": "gpu"},
    )
    reads_before = operator.counter("fiar_binding_pod_lookups_total", source="read")
    kit.kube.call("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=deployment)
    pods = kit.running(namespace, replicas, "app=vllm", timeout=90)
    placed = {}
    for pod in pods:
        node = pod["spec"]["nodeName"]
        notes = annotations(pod)
        assert not [k for k in notes if k.startswith("kopf.")], "kopf keeps no state on pods"
        assert notes[contract.ANNOTATION_POD_BACKEND] == ("auto" if verdicts[node] == "none" else verdicts[node])
        decision = json.loads(notes[contract.ANNOTATION_POD_DECISION])
        assert (decision["node"], decision["nodeVerdict"], decision["policy"]) == (
            node,
            verdicts[node],
            f"deploy-{kit.unique}",
        )
        assert decision["trigger"] == "binding"
        for index in (0, 1):
            entry = env_entry(pod, index)
            assert entry is not None and entry["valueFrom"]["fieldRef"]["fieldPath"] == FIELD_PATH
        placed[node] = placed.get(node, 0) + 1
    assert set(placed) == set(verdicts)
    assert operator.counter("fiar_decisions_total", trigger="binding") >= replicas
    # The replica that admitted the pods answers their bindings from memory: no read of any pod.
    assert operator.counter("fiar_binding_pod_lookups_total", source="read") == reads_before
