"""A policy applied together with its workload (one apply: namespace, policy, Deployment, created back to
back as ``kubectl apply -f dir/`` creates them) gets every pod configured, 20 times in a row, with the
leader narrowing the webhook's matchConditions to the policies (``--webhook-config``) and the policy
webhook registered, as the chart runs them: the conditions cover each policy before it is stored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import fiar_contract as contract
from devcluster import workloads
from devcluster.cluster import ControlPlane, Tier
from fiar_operator.core.policy import Policy, parse_policy
from fiar_operator.reconcile import webhookconfig
from fiar_operator.state import kube

from .conftest import SESSION_LABEL

pytestmark = pytest.mark.controlplane

ROUNDS = 20
REPLICAS = 3


def test_a_namespace_policy_and_deployment_in_one_apply_get_every_pod_configured(
    private_plane: Callable[[Tier], ControlPlane],
    start_operator: Callable[..., Any],
    make_kit: Callable[[ControlPlane, str], Any],
    unique: str,
) -> None:
    plane = private_plane(Tier.C)
    hook = f"fiar-one-{unique}"
    operator = start_operator(plane, unique, ("--standalone", "--webhook-config", hook))
    kit = make_kit(plane, unique)
    operator.register(hook, policy_webhook=True)
    kit.node(f"one-{kit.unique}", "trtllm")
    warm = plane.create_namespace(f"warm-{unique}", {SESSION_LABEL: operator.selector_value})
    kit.policy(f"warm-{unique}", warm)
    kit.wait(lambda: conditions(kit, hook), 30, "the leader narrowed the webhook's conditions")

    def configured_in_warm() -> bool:
        probe = workloads.pod(name="probe", namespace=None, labels={"app": "vllm"})
        answer = kit.kube.call("POST", f"/api/v1/namespaces/{warm}/pods", {"dryRun": "All"}, body=probe)
        return contract.LABEL_POD_POLICY in (answer["metadata"].get("labels") or {})

    kit.wait(configured_in_warm, 30, "the API server calls the webhook under the narrowed conditions")
    missed: list[str] = []
    late: list[str] = []
    for round_ in range(ROUNDS):
        namespace, policy = f"one-{kit.unique}-{round_}", f"one-{kit.unique}-{round_}"
        labels = {SESSION_LABEL: operator.selector_value, "team": f"t-{kit.unique}-{round_}"}
        kit.kube.call("POST", kube.NAMESPACES, body={"metadata": {"name": namespace, "labels": labels}})
        by_label = round_ % 2 == 1  # every other round selects the brand-new namespace by a label of its own
        selector = {"matchLabels": {"team": labels["team"]}} if by_label else {"matchLabels": {kube_name(): namespace}}
        body = workloads.policy(policy, podSelector={"matchLabels": {"app": "vllm"}}, namespaceSelector=selector)
        kit.kube.call("POST", kube.POLICIES, body=body)
        kit.policies.append(policy)
        if not covers(kit, hook, parse_policy(body)):  # as soon as the policy is stored, not later
            late.append(policy)
        deployment = workloads.vllm_deployment(REPLICAS, node_selector={f"pool-{kit.unique}": "gpu"}, spread=None)
        kit.kube.call("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=deployment)

        def created(namespace: str = namespace) -> list[dict[str, Any]] | None:
            pods = kit.pods(namespace)
            return pods if len(pods) >= REPLICAS else None

        pods = kit.wait(created, 60, f"{REPLICAS} pods in {namespace}")
        missed += [
            f"{namespace}/{p['metadata']['name']}"
            for p in pods
            if (p["metadata"].get("labels") or {}).get(contract.LABEL_POD_POLICY) != policy
        ]
    assert late == [], f"{len(late)} of {ROUNDS} policies stored before the conditions covered them"
    assert missed == [], f"{len(missed)} of {ROUNDS * REPLICAS} pods not configured"


def kube_name() -> str:
    return "kubernetes.io/metadata.name"


def conditions(kit: Any, hook: str) -> bool:
    config = kit.kube.call("GET", f"{kube.MUTATING_CONFIGS}/{hook}")
    return all(w.get("matchConditions") for w in config["webhooks"])


def covers(kit: Any, hook: str, policy: Policy) -> bool:
    """Whether the pod webhook's stored condition holds the policy's clause (or is the static one)."""
    config = kit.kube.call("GET", f"{kube.MUTATING_CONFIGS}/{hook}")
    pods = next(w for w in config["webhooks"] if w["name"] == webhookconfig.POD_HOOK)
    expression = (pods.get("matchConditions") or [{}])[0].get("expression", "")
    return expression == webhookconfig.STATIC or webhookconfig.policy_clause(policy) in expression
