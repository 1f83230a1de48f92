"""The operator watches what fiar manages (the pods it labelled, the GPU nodes) and finds the pods a
policy selects that its webhook never saw by selector-narrowed LISTs: on the real control plane each
case reaches the state it reached when every pod and node was watched."""

from __future__ import annotations

from typing import Any

import pytest

import fiar_contract as contract
from devcluster import workloads
from fiar_operator.state import kube

pytestmark = pytest.mark.controlplane


def counted(kit: Any, policy: str, key: str, value: int) -> Any:
    def check() -> dict[str, Any] | None:
        status = kit.get_policy(policy).get("status") or {}
        return status if (status.get("pods") or {}).get(key) == value else None

    return check


def relabel_pod(kit: Any, namespace: str, name: str, labels: dict[str, str | None]) -> None:
    kit.kube.call(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}",
        body={"metadata": {"labels": labels}},
        content_type="application/merge-patch+json",
    )


def test_a_pod_created_while_the_webhook_was_deregistered_is_found_and_reported(
    operator: Any, kit: Any, namespace: str
) -> None:
    kit.node(f"w-{kit.unique}", "trtllm")
    policy = f"unseen-{kit.unique}"
    kit.policy(policy, namespace)
    kit.pod(namespace, "managed")
    hook = f"fiar-test-{operator.selector_value}"
    operator.unregister(hook)
    try:

        def deregistered() -> bool:
            probe = workloads.pod(
                name="probe", namespace=None, labels={"app": "vllm"}, nodeSelector={f"pool-{kit.unique}": "gpu"}
            )
            answer = kit.kube.call("POST", f"/api/v1/namespaces/{namespace}/pods", {"dryRun": "All"}, body=probe)
            return contract.LABEL_POD_POLICY not in (answer["metadata"].get("labels") or {})

        kit.wait(deregistered, 30, "the API server no longer calls the webhook")
        kit.pod(namespace, "unseen")
    finally:
        operator.register(hook)
        operator.wait_active(namespace)
    kit.running(namespace, 2)
    kit.wait(counted(kit, policy, "unconfigured", 1), 30, "the unseen pod counted unconfigured")
    kit.wait(counted(kit, policy, "decided", 1), 30, "the managed pod decided")
    (event,) = kit.wait(
        lambda: [e for e in kit.events(namespace, "unseen") if e["reason"] == "NotConfigured"], 30, "NotConfigured"
    )
    assert event["type"] == "Warning"
    assert operator.counter("fiar_index_objects", index="pods") >= 1


def test_pods_relabelled_into_and_out_of_a_selector_and_a_changed_selector_are_followed(
    operator: Any, kit: Any, namespace: str
) -> None:
    kit.node(f"r-{kit.unique}", "trtllm")
    kit.pod(namespace, "web", labels={"app": "web"})  # no policy yet: the webhook leaves it unlabelled
    kit.pod(namespace, "early")
    kit.running(namespace, 2)
    policy = f"relabel-{kit.unique}"
    kit.policy(policy, namespace)
    kit.wait(counted(kit, policy, "unconfigured", 1), 30, "the early pod unconfigured")
    relabel_pod(kit, namespace, "web", {"app": "vllm"})
    kit.wait(counted(kit, policy, "unconfigured", 2), 30, "a pod relabelled into the selector")
    relabel_pod(kit, namespace, "early", {"app": "web"})
    kit.wait(counted(kit, policy, "unconfigured", 1), 30, "a pod relabelled out of the selector")

    kit.pod(namespace, "served")  # the webhook configures it under the policy
    kit.wait(counted(kit, policy, "decided", 1), 30, "the new pod decided")
    relabel_pod(kit, namespace, "served", {"app": "web"})
    kit.wait(counted(kit, policy, "decided", 0), 30, "a managed pod out of the selector is no longer counted")

    spec = {"podSelector": {"matchLabels": {"app": "web"}}}
    current = kit.get_policy(policy)
    current["spec"] = {**current["spec"], **spec}
    kit.kube.call("PUT", f"{kube.POLICIES}/{policy}", body=current)
    kit.wait(counted(kit, policy, "decided", 1), 30, "the served pod selected again")
    kit.wait(counted(kit, policy, "unconfigured", 1), 30, "the changed selector's unconfigured pods")
    assert kit.get_policy(policy)["status"]["observedGeneration"] == 2
    assert operator.counter("fiar_index_objects", index="pods") >= 1


def test_gpu_nodes_enter_and_leave_the_index_with_their_label(operator: Any, kit: Any, namespace: str) -> None:
    policy = f"nodes-{kit.unique}"
    kit.policy(policy, namespace)
    plain = f"cpu-{kit.unique}"
    kit.plane.add_node(plain, labels={contract.LABEL_BACKEND: "trtllm", f"pool-{kit.unique}": "cpu"})

    def trtllm() -> int:
        return int(kit.get_policy(policy)["status"]["nodes"]["trtllm"])

    before = trtllm()
    kit.relabel(plain, {"nvidia.com/gpu.present": "true"})
    kit.wait(lambda: trtllm() == before + 1, 30, "a node labelled as a GPU node is indexed")
    kit.relabel(plain, {"nvidia.com/gpu.present": None})
    kit.wait(lambda: trtllm() == before, 30, "a node unlabelled leaves the index")


def test_a_policy_over_every_pod_of_every_namespace_is_scanned_in_pages(
    operator: Any, kit: Any, namespace: str
) -> None:
    kit.node(f"e-{kit.unique}", "trtllm")
    for i in range(3):
        kit.pod(namespace, f"before-{i}", labels={"x": str(i)})
    kit.running(namespace, 3)
    policy = f"everything-{kit.unique}"
    scans = operator.counter("fiar_unconfigured_scans_total", complete="true")
    kit.policy(policy, namespace, podSelector={}, namespaceSelector={})
    status = kit.wait(
        lambda: (s := kit.get_policy(policy).get("status") or {}).get("pods", {}).get("unconfigured", 0) >= 3 and s,
        30,
        "every unlabelled pod the empty selectors take",
    )
    assert status["pods"]["unconfigured"] >= 3
    assert operator.counter("fiar_unconfigured_scans_total", complete="true") > scans
    kit.kube.delete(kube.POLICIES, policy)
