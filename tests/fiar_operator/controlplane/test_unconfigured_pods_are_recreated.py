"""The opt-in remedy (``--recreate-unconfigured``): controller-owned pods created while the operator
was down are evicted through the Eviction API and come back configured; a PodDisruptionBudget holds
them back while it forbids it; a bare pod is never evicted; each eviction has its event and its
count in the policy status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.cluster import ControlPlane, Tier
from devcluster.workloads import vllm_deployment

pytestmark = pytest.mark.controlplane


def test_controller_owned_pods_created_while_down_are_evicted_and_come_back_configured(
    private_plane: Callable[[Tier], ControlPlane],
    start_operator: Callable[..., Any],
    make_kit: Callable[[ControlPlane, str], Any],
    unique: str,
) -> None:
    plane = private_plane(Tier.C)
    kit = make_kit(plane, unique)
    namespace = plane.create_namespace(f"recreate-{unique}", {"fiar-operator-test": unique})
    kit.node(f"gpu-{unique}", "trtllm")
    # Created before any operator runs: nothing configures them.
    pool = {f"pool-{unique}": "gpu"}
    free = vllm_deployment(2, node_selector=pool, spread=None, labels={"app": "vllm", "guard": "no"})
    kit.kube.call("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=free)
    guard = {"app": "vllm", "guard": "yes"}
    guarded = vllm_deployment(1, node_selector=pool, spread=None, name="guarded", labels=guard)
    kit.kube.call("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=guarded)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"guard": "yes"}}},
    }
    kit.kube.call("POST", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", body=pdb)
    kit.pod(namespace, "bare")
    kit.running(namespace, 4, timeout=90)

    operator = start_operator(plane, unique, ("--standalone", "--recreate-unconfigured"))
    operator.register("fiar-recreate")
    operator.wait_active(namespace)
    policy = f"recreate-{unique}"
    kit.policy(policy, namespace)

    def configured() -> list[dict[str, Any]] | None:
        pods = [p for p in kit.pods(namespace) if not p["metadata"].get("deletionTimestamp")]
        ours = [p for p in pods if (p["metadata"].get("labels") or {}).get(contract.LABEL_POD_POLICY) == policy]
        return ours if len(ours) >= 2 else None

    kit.wait(configured, 90, "the Deployment's pods recreated through the webhook")
    kit.wait(
        lambda: (kit.get_policy(policy).get("status") or {}).get("pods", {}).get("recreated") == 2,
        30,
        "two recreated in the status",
    )
    kit.wait(  # the evicted ones drop out at the next scan
        lambda: kit.get_policy(policy)["status"]["pods"]["unconfigured"] == 2,
        30,
        "the bare pod and the one its budget protects still unconfigured",
    )
    recreated = kit.wait(
        lambda: kit.kube.call(
            "GET", f"/api/v1/namespaces/{namespace}/events", {"fieldSelector": "reason=RecreatedForPolicy"}
        )["items"],
        30,
        "RecreatedForPolicy events",
    )
    assert sorted(e["involvedObject"]["name"].split("-")[0] for e in recreated) == ["vllm", "vllm"], "never bare"
    names = {p["metadata"]["name"] for p in kit.pods(namespace)}
    assert "bare" in names, "a bare pod is never evicted"
    assert any(n.startswith("guarded-") for n in names)
    guarded_pods = kit.pods(namespace, "guard=yes")
    assert all(contract.LABEL_POD_POLICY not in (p["metadata"].get("labels") or {}) for p in guarded_pods)
    assert operator.counter("fiar_unconfigured_scans_total") >= 1
