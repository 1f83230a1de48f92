"""The leader narrows its webhook configuration to the policies (matchConditions), so the API server
never sends it a pod no policy can select, while a pod that reads fiar's annotations without a
policy still gets vLLM's default; and the conditions, evaluated by the real API server, select
exactly what the policies' selectors select."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for
from fiar_operator.core.pods import FIELD_PATH
from fiar_operator.reconcile import webhookconfig
from fiar_operator.state import kube

pytestmark = pytest.mark.controlplane


def conditions(client: kube.Kube, name: str) -> dict[str, Any]:
    doc = client.call("GET", f"{kube.MUTATING_CONFIGS}/{name}")
    return {hook["name"]: hook.get("matchConditions") for hook in doc["webhooks"]}


def test_pods_no_policy_can_select_never_reach_the_webhooks(
    private_plane: Callable[[Tier], ControlPlane],
    start_operator: Callable[..., Any],
    make_kit: Callable[[ControlPlane, str], Any],
    unique: str,
) -> None:
    plane = private_plane(Tier.A)
    name = f"fiar-follow-{unique}"
    operator = start_operator(plane, unique, ("--standalone", "--webhook-config", name))
    kit = make_kit(plane, unique)
    operator.register(name)
    namespace = plane.create_namespace(f"follow-{unique}", {"fiar-operator-test": unique})
    other = plane.create_namespace(f"other-{unique}", {"fiar-operator-test": unique})
    kit.policy(f"follow-{unique}", namespace)  # app=vllm in `namespace` only

    wanted = f"request.namespace in {webhookconfig._list([namespace])}"
    wait_for(
        lambda: (conditions(kit.kube, name).get(webhookconfig.BINDING_HOOK) or [{}])[0].get("expression") == wanted,
        30,
        "the binding webhook narrowed to the policy's namespace",
    )

    def calls() -> float:
        return operator.counter("fiar_admission_requests_total", webhook="pods")

    def dry_run(ns: str, labels: dict[str, str], env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "dry-", "labels": labels},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai", "env": env or []}]},
        }
        created: dict[str, Any] = kit.kube.call("POST", f"/api/v1/namespaces/{ns}/pods", {"dryRun": "All"}, body=body)
        return created

    def skipped() -> bool:  # the API server has picked up the conditions
        before = calls()
        dry_run(namespace, {"app": "web"})
        return calls() == before

    def selected() -> bool:  # the API server calls the webhook for a pod the policy selects
        labels = dry_run(namespace, {"app": "vllm"})["metadata"]["labels"]
        return bool(labels.get(contract.LABEL_POD_POLICY) == f"follow-{unique}")

    wait_for(selected, 30, "the API server calls the webhook for a selected pod")
    wait_for(skipped, 30, "the API server skips a pod the policy does not select")
    before = calls()
    assert dry_run(other, {"app": "vllm"})["metadata"].get("labels") == {"app": "vllm"}, "namespace not selected"
    assert calls() == before

    assert selected()
    reads = [{"name": contract.ENV_VAR, "valueFrom": {"fieldRef": {"fieldPath": FIELD_PATH}}}]
    defaulted = dry_run(other, {"app": "web"}, reads)
    assert defaulted["metadata"]["annotations"][contract.ANNOTATION_POD_BACKEND] == "auto", "never an empty value"
    assert calls() == before + 2


def selector(raw: dict[str, Any]) -> Any:
    from fiar_operator.core.selectors import parse_label_selector

    return parse_label_selector(raw, "test")


def test_namespace_terms_on_other_labels_never_narrow_the_condition() -> None:
    by_team = selector({"matchLabels": {"team": "ml"}})
    assert webhookconfig.namespace_cel(by_team) == "true" and webhookconfig.names_only(by_team) is None
    named = selector(
        {"matchExpressions": [{"key": webhookconfig.NAME_LABEL, "operator": "In", "values": ["a", "b"]}]}
        | {"matchLabels": {"team": "ml"}}
    )
    assert webhookconfig.namespace_cel(named) == 'request.namespace in ["a", "b"]'
    assert webhookconfig.names_only(named) == ("a", "b")
    nowhere = selector({"matchExpressions": [{"key": webhookconfig.NAME_LABEL, "operator": "DoesNotExist"}]})
    assert webhookconfig.namespace_cel(nowhere) == "false"


def test_a_binding_passes_everywhere_once_a_policy_selects_namespaces_by_label() -> None:
    from fiar_operator.core.policy import parse_policy

    def policy(name: str, namespaces: dict[str, Any]) -> Any:
        spec = {"podSelector": {}, "namespaceSelector": namespaces}
        return parse_policy({"metadata": {"name": name}, "spec": spec})

    named = policy("a", {"matchLabels": {webhookconfig.NAME_LABEL: "ml"}})
    assert webhookconfig.binding_condition([named], ["old"]) == 'request.namespace in ["ml", "old"]'
    assert webhookconfig.binding_condition([named, policy("b", {"matchLabels": {"team": "x"}})], []) == "true"
    assert webhookconfig.binding_condition([], []) == "request.namespace in []"
