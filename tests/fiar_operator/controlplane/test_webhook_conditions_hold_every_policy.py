"""Every policy the CRD accepts gives matchConditions the real API server compiles, and conditions it
cannot hold (past CEL's cost limit) are never left stale: the webhooks fall back to the static ones,
the operator says so in a Warning event and a metric, and narrows them again when it can."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for
from fiar_operator.core.policy import Policy, parse_policy
from fiar_operator.reconcile import webhookconfig
from fiar_operator.reconcile.webhooksync import WebhookSync, static_conditions
from fiar_operator.state import kube

pytestmark = pytest.mark.controlplane

ODD_VALUES = [
    "\U0001f600",  # outside the Basic Multilingual Plane: a surrogate pair in JSON, refused by CEL
    'quote " and \\ backslash',
    "control \x01 \n \t \x7f",
    "single ' quote",
    "\u2028 line separator \ufeff",
    "\ud800",  # a lone surrogate (the API server turns it into U+FFFD; the operator must not choke)
]


def _policy(name: str, values: list[str]) -> Policy:
    return parse_policy({"metadata": {"name": name}, "spec": {
        "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": values}],
                        "matchLabels": {"team": values[0]}},
        "namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": values}]}}})


def _conditions(client: kube.Kube, name: str) -> dict[str, Any]:
    doc = client.call("GET", f"{kube.MUTATING_CONFIGS}/{name}")
    return {hook["name"]: hook.get("matchConditions") for hook in doc["webhooks"]}


@pytest.fixture
def config(plane_a: ControlPlane, unique: str) -> Any:
    client = kube.Kube(plane_a.api_client())
    name = f"fiar-cel-{unique}"
    client.apply(kube.MUTATING_CONFIGS, webhookconfig.configuration(b"ca", url="https://127.0.0.1:1", name=name))
    yield client, name
    client.delete(kube.MUTATING_CONFIGS, name)


def test_conditions_compile_for_every_string_a_policy_can_hold(config: Any) -> None:
    client, name = config
    sync = WebhookSync(client, name)
    policies = [_policy(f"odd-{i}", [value]) for i, value in enumerate(ODD_VALUES)]
    assert sync.sync(policies, ["ml"])
    assert sync.fallback is None, sync.fallback
    stored = _conditions(client, name)[webhookconfig.POD_HOOK][0]["expression"]
    assert stored == webhookconfig.pod_condition(policies)
    assert "\\U0001f600" in stored


def _large_selector(i: int) -> dict[str, Any]:
    """The largest pod selector the CRD accepts: 16 expressions of 64 values of 63 characters."""
    return {"matchExpressions": [
        {"key": f"k{e}", "operator": "In", "values": [f"{i}-{e}-{v}-".ljust(63, "x") for v in range(64)]}
        for e in range(16)]}


def _large(i: int) -> Policy:
    return parse_policy({"metadata": {"name": f"large-{i}"}, "spec": {"podSelector": _large_selector(i)}})


@pytest.mark.parametrize(
    ("many", "why"),
    [([_policy(f"p{i}", [f"app-{i}"]) for i in range(400)], "refused"), ([_large(i) for i in range(5)], "characters")],
    ids=["400-small-policies", "5-large-policies"],
)
def test_conditions_past_the_limit_fall_back_to_the_static_ones_and_narrow_again(
    config: Any, many: list[Policy], why: str
) -> None:
    client, name = config
    sync = WebhookSync(client, name)
    small = [_policy("one", ["vllm"])]
    assert sync.sync(small, []) and sync.fallback is None
    assert sync.sync(many, [])
    assert sync.fallback is not None and why in sync.fallback.reason, sync.fallback
    assert _conditions(client, name) == static_conditions(), "never the stale narrowed conditions"
    assert [f.reason for f in sync.take_fallbacks()] == [sync.fallback.reason]
    assert sync.binding_namespaces is None
    assert not sync.sync(many, []), "the same refused conditions are not sent again"
    assert sync.sync(small, []) and sync.fallback is None
    assert _conditions(client, name)[webhookconfig.POD_HOOK][0]["expression"] == webhookconfig.pod_condition(small)


def test_the_operator_reports_the_fallback_in_an_event_and_a_metric(
    private_plane: Callable[[Tier], ControlPlane],
    start_operator: Callable[..., Any],
    make_kit: Callable[[ControlPlane, str], Any],
    unique: str,
) -> None:
    plane = private_plane(Tier.A)
    name = f"fiar-fallback-{unique}"
    operator = start_operator(plane, unique, ("--standalone", "--webhook-config", name))
    kit = make_kit(plane, unique)
    operator.register(name)
    namespace = plane.create_namespace(f"fb-{unique}")

    def metric() -> float:
        return operator.counter("fiar_webhook_conditions_follow_policies")

    wait_for(lambda: metric() == 1, 30, "the conditions follow the policies")
    for i in range(5):
        kit.policy(f"large-{i}-{unique}", namespace, podSelector=_large_selector(i))
    wait_for(lambda: metric() == 0, 30, "the static conditions stand in")
    wait_for(lambda: _conditions(kit.kube, name) == static_conditions(), 30, "the static conditions")
    events = kit.kube.call("GET", "/api/v1/namespaces/default/events")["items"]
    found = [e for e in events if e["reason"] == "MatchConditionsFallback" and e["involvedObject"]["name"] == name]
    assert len(found) == 1 and found[0]["type"] == "Warning", found
    for i in range(5):
        kit.kube.delete(kube.POLICIES, f"large-{i}-{unique}")
        kit.policies.remove(f"large-{i}-{unique}")
    wait_for(lambda: metric() == 1, 30, "the conditions follow the policies again")
    assert _conditions(kit.kube, name) != static_conditions()
