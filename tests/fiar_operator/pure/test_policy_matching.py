"""Which policy manages a pod: selectors, priority, name order; and how a policy object is read."""

from __future__ import annotations

from typing import Any

import pytest

from fiar_operator.core.errors import PolicyError
from fiar_operator.core.policy import Policy, covers_namespace, parse_policy, select_policy
from fiar_operator.core.selectors import LabelSelector, Requirement, parse_label_selector


def policy(
    name: str, priority: int = 0, pods: dict[str, Any] | None = None, namespaces: dict[str, Any] | None = None
) -> Policy:
    return parse_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "podSelector": pods if pods is not None else {"matchLabels": {"app": "vllm"}},
                "namespaceSelector": namespaces or {},
                "priority": priority,
            },
        }
    )


def test_highest_priority_wins_among_matching_policies() -> None:
    chosen = select_policy([policy("a", 1), policy("b", 5), policy("c", 3)], {}, {"app": "vllm"})
    assert chosen is not None and chosen.name == "b"


def test_equal_priorities_resolve_by_name_order() -> None:
    chosen = select_policy([policy("zeta", 2), policy("alpha", 2), policy("mid", 2)], {}, {"app": "vllm"})
    assert chosen is not None and chosen.name == "alpha"


def test_policies_that_do_not_match_are_never_chosen() -> None:
    policies = [policy("high", 100, pods={"matchLabels": {"app": "other"}}), policy("low", -5)]
    chosen = select_policy(policies, {}, {"app": "vllm"})
    assert chosen is not None and chosen.name == "low"
    assert select_policy(policies, {}, {"app": "web"}) is None


def test_namespace_selector_limits_a_policy_to_matching_namespaces() -> None:
    scoped = policy("scoped", namespaces={"matchLabels": {"team": "ml"}})
    assert select_policy([scoped], {"team": "ml"}, {"app": "vllm"}) is scoped
    assert select_policy([scoped], {"team": "web"}, {"app": "vllm"}) is None
    assert covers_namespace([scoped], {"team": "ml"}) and not covers_namespace([scoped], {})


@pytest.mark.parametrize(
    ("expr", "labels", "expected"),
    [
        ({"key": "tier", "operator": "In", "values": ["a", "b"]}, {"tier": "b"}, True),
        ({"key": "tier", "operator": "In", "values": ["a"]}, {}, False),
        ({"key": "tier", "operator": "NotIn", "values": ["a"]}, {}, True),
        ({"key": "tier", "operator": "NotIn", "values": ["a"]}, {"tier": "a"}, False),
        ({"key": "tier", "operator": "Exists"}, {"tier": ""}, True),
        ({"key": "tier", "operator": "DoesNotExist"}, {"tier": "x"}, False),
    ],
    ids=["in", "in-absent", "notin-absent", "notin-present", "exists", "doesnotexist"],
)
def test_match_expressions_follow_kubernetes_semantics(
    expr: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    assert parse_label_selector({"matchExpressions": [expr]}, "s").matches(labels) is expected


def test_empty_selector_selects_everything() -> None:
    assert parse_label_selector({}, "s").matches({"any": "thing"})
    assert parse_label_selector(None, "s") == LabelSelector()


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "needs at least one value"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "takes no values"),
        ({"matchExpressions": [{"key": "a", "operator": "Near"}]}, "is not one of"),
        ({"matchLabels": ["a"]}, "must map label keys"),
        ("app=vllm", "must be a LabelSelector object"),
    ],
)
def test_malformed_selectors_are_rejected_with_the_field_named(selector: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_label_selector(selector, "spec.podSelector")


def test_defaults_match_the_design() -> None:
    read = parse_policy({"metadata": {"name": "p", "generation": 3}, "spec": {"podSelector": {}}})
    assert read.containers == ("*",)
    assert read.backends == ("mnnvl", "trtllm")
    assert (read.fallback, read.placement, read.mode, read.priority) == ("auto", "Anywhere", "Enforce", 0)
    assert read.respect_explicit_env and read.multi_node == "Auto" and read.generation == 3
    assert read.pod_selector == LabelSelector() and read.namespace_selector == LabelSelector()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "podSelector is required"),
        ({"podSelector": {}, "backends": []}, "at least one"),
        ({"podSelector": {}, "backends": ["mnnvl", "mnnvl"]}, "distinct"),
        ({"podSelector": {}, "backends": ["nccl"]}, "distinct values"),
        ({"podSelector": {}, "fallbackBackend": "TRTLLM"}, "fallbackBackend"),
        ({"podSelector": {}, "mode": "Dry"}, "spec.mode"),
        ({"podSelector": {}, "containers": []}, "containers"),
        ({"podSelector": {}, "priority": "high"}, "priority"),
    ],
)
def test_bad_specs_raise_policy_errors_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy({"metadata": {"name": "bad"}, "spec": spec})


def test_requirement_gt_and_lt_compare_integers() -> None:
    assert Requirement("gpus", "Gt", ("4",)).matches({"gpus": "8"})
    assert not Requirement("gpus", "Lt", ("4",)).matches({"gpus": "8"})
    assert not Requirement("gpus", "Gt", ("4",)).matches({"gpus": "many"})
