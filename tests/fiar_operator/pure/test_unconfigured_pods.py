"""Pods a policy selects that the pod webhook never configured (created before the policy, or while
the webhook was unavailable) run with vLLM's default and are reported, never silently counted as managed."""

from __future__ import annotations

from typing import Any

import fiar_contract as contract
from devcluster.workloads import explicit_backend as explicit
from fiar_operator.core.pods import FIELD_PATH, PodRecord, pod_record
from fiar_operator.core.policy import Policy, parse_policy
from fiar_operator.reconcile.rules import policy_status, unconfigured_by

NOW = "2026-05-01T12:00:00Z"
NS = {"kubernetes.io/metadata.name": "ml"}


def policy(name: str = "vllm", **spec: Any) -> Policy:
    spec.setdefault("podSelector", {"matchLabels": {"app": "vllm"}})
    return parse_policy({"metadata": {"name": name, "generation": 1}, "spec": spec})


def pod(
    name: str = "p",
    labels: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    namespace: str = "ml",
    phase: str = "Running",
) -> PodRecord:
    return pod_record(
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "labels": labels or {"app": "vllm"},
            },
            "spec": {"containers": containers or [{"name": "vllm", "image": "vllm/vllm-openai"}]},
            "status": {"phase": phase},
        }
    )


def test_a_selected_pod_without_the_policy_label_is_unconfigured() -> None:
    found = unconfigured_by(pod(), [policy()], NS)
    assert found is not None and found.name == "vllm"


def test_a_pod_the_webhook_configured_is_not_unconfigured() -> None:
    assert unconfigured_by(pod(labels={"app": "vllm", contract.LABEL_POD_POLICY: "vllm"}), [policy()], NS) is None


def test_a_pod_no_policy_selects_is_not_unconfigured() -> None:
    assert unconfigured_by(pod(labels={"app": "web"}), [policy()], NS) is None


def test_explicit_env_is_respected_unless_the_policy_overrides_it() -> None:
    record = pod(containers=[explicit()])
    assert unconfigured_by(record, [policy()], NS) is None
    overriding = unconfigured_by(record, [policy(respectExplicitEnv=False)], NS)
    assert overriding is not None


def test_the_injected_entry_is_not_an_explicit_setting() -> None:
    injected = {"name": contract.ENV_VAR, "valueFrom": {"fieldRef": {"fieldPath": FIELD_PATH}}}
    record = pod(containers=[{"name": "vllm", "env": [injected]}])
    assert record.containers == (("vllm", False),)
    assert unconfigured_by(record, [policy()], NS) is not None


def test_containers_the_policy_does_not_select_leave_the_pod_alone() -> None:
    record = pod(containers=[{"name": "sidecar"}])
    assert unconfigured_by(record, [policy(containers=["vllm*"])], NS) is None
    assert unconfigured_by(
        pod(containers=[{"name": "sidecar"}, {"name": "vllm-0"}]), [policy(containers=["vllm*"])], NS
    )


def test_finished_pods_and_ignored_or_unknown_namespaces_are_left_out() -> None:
    assert unconfigured_by(pod(phase="Succeeded"), [policy()], NS) is None
    assert unconfigured_by(pod(), [policy()], {**NS, contract.NAMESPACE_IGNORE_LABEL: "true"}) is None
    assert unconfigured_by(pod(), [policy()], None) is None


def test_the_highest_priority_policy_reports_the_pod() -> None:
    found = unconfigured_by(pod(), [policy("low"), policy("high", priority=5)], NS)
    assert found is not None and found.name == "high"


def test_status_counts_unconfigured_pods_with_a_condition_that_says_what_to_do() -> None:
    status = policy_status(policy(), {}, [], None, NOW, unconfigured=["ml/a", "ml/b", "ml/c", "ml/d"])
    assert status["pods"]["unconfigured"] == 4
    condition = {c["type"]: c for c in status["conditions"]}["UnconfiguredPods"]
    assert condition["status"] == "True" and condition["reason"] == "PodsNotConfigured"
    assert condition["message"].startswith("4 pods this policy selects (ml/a, ml/b, ml/c, ...) were created")
    assert "recreated" in condition["message"]
    cleared = policy_status(policy(), {}, [], status, "2026-05-01T13:00:00Z")
    condition = {c["type"]: c for c in cleared["conditions"]}["UnconfiguredPods"]
    assert condition["status"] == "False" and condition["lastTransitionTime"] == "2026-05-01T13:00:00Z"
