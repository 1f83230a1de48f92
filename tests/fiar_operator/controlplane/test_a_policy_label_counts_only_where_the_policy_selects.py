"""A tenant can write any label on its own pods, fiar's ``fiar.io/policy`` too: a pod in team a's
namespace labelled with team b's policy is neither decided under that policy at binding, nor
counted in its status, nor re-annotated by its reconciler."""

from __future__ import annotations

from typing import Any

import pytest

import fiar_contract as contract
from devcluster.waiting import wait_for

pytestmark = pytest.mark.controlplane


def test_a_pod_labelled_with_another_teams_policy_is_not_managed_by_it(
    operator: Any, kit: Any, namespace: str, unique: str
) -> None:
    team_b = operator.plane.create_namespace(f"team-b-{unique}", {"fiar-operator-test": operator.selector_value})
    operator.wait_active(team_b)
    kit.node(f"m-{unique}", "mnnvl")
    policy = f"team-b-{unique}"
    kit.policy(policy, team_b)  # selects app=vllm in team b's namespace only
    forged = kit.pod(namespace, "forged", labels={"app": "vllm", contract.LABEL_POD_POLICY: policy})
    own = kit.pod(team_b, "own")
    pods = {p["metadata"]["name"]: p for p in kit.running(namespace, 1) + kit.running(team_b, 1)}
    assert (pods["own"]["metadata"].get("annotations") or {}).get(contract.ANNOTATION_POD_BACKEND) == "mnnvl"
    notes = pods["forged"]["metadata"].get("annotations") or {}
    assert contract.ANNOTATION_POD_DECISION not in notes, "decided under another namespace's policy"
    assert forged["metadata"]["labels"][contract.LABEL_POD_POLICY] == policy and own

    def counted() -> dict[str, Any] | None:
        pods_status = (kit.get_policy(policy).get("status") or {}).get("pods") or {}
        return pods_status if pods_status.get("decided") == 1 else None

    status = wait_for(counted, 30, "team b's policy counts its own pod")
    assert status["decided"] + status["fallback"] + status["pending"] == 1, status
