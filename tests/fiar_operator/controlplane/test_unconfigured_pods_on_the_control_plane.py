"""Pods a policy selects that the pod webhook never configured (created before the policy) are
reported on the real control plane until they are recreated."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.workloads import explicit_backend as explicit


@pytest.mark.controlplane
def test_pods_created_before_their_policy_are_reported_until_recreated(operator: Any, kit: Any, namespace: str) -> None:
    kit.node(f"u-{kit.unique}", "trtllm")
    kit.pod(namespace, "early")
    kit.pod(namespace, "explicit", explicit())
    kit.pod(namespace, "web", labels={"app": "web"})
    kit.running(namespace, 3)
    name = f"unconfigured-{kit.unique}"
    kit.policy(name, namespace)

    def counted(value: int) -> Any:
        def check() -> dict[str, Any] | None:
            status = kit.get_policy(name).get("status") or {}
            return status if (status.get("pods") or {}).get("unconfigured") == value else None

        return check

    status = kit.wait(counted(1), 30, "one unconfigured pod in the policy status")
    condition = {c["type"]: c for c in status["conditions"]}["UnconfiguredPods"]
    assert condition["status"] == "True" and condition["reason"] == "PodsNotConfigured"
    (event,) = kit.wait(
        lambda: [e for e in kit.events(namespace, "early") if e["reason"] == "NotConfigured"], 30, "NotConfigured"
    )
    assert event["type"] == "Warning" and f"policy {name} selects this pod" in event["message"]
    assert "rollout restart" in event["message"]
    assert not [e for e in kit.events(namespace, "explicit") if e["reason"] == "NotConfigured"]

    # recreated: the webhook configures the new pod, the report clears
    kit.kube.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/early", {"gracePeriodSeconds": 0})
    kit.pod(namespace, "early-again")
    status = kit.wait(counted(0), 30, "the report cleared")
    condition = {c["type"]: c for c in status["conditions"]}["UnconfiguredPods"]
    assert condition["status"] == "False" and condition["reason"] == "AllPodsConfigured"
    kit.wait(lambda: kit.get_policy(name)["status"]["pods"]["decided"] == 1, 30, "the new pod decided")
