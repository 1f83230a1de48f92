"""The backend a pod gets from its node's labels and its policy (single pods and multi-pod groups)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fiar_contract as contract
from fiar_operator.core.decide import MAX_DECISION_LENGTH, GroupPlan, decide, node_facts, parse_decision
from fiar_operator.core.policy import Policy, parse_policy
from fiar_operator.core.selectors import node_constraint


def policy(**spec: Any) -> Policy:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}, **spec}})


def node(verdict: str | None, trtllm: str | None = None, clique: str | None = None) -> dict[str, str]:
    labels = {}
    if verdict is not None:
        labels[contract.LABEL_BACKEND] = verdict
    if trtllm is not None:
        labels[contract.LABEL_TRTLLM] = trtllm
    if clique is not None:
        labels[contract.LABEL_CLIQUE] = clique
    return labels


@pytest.mark.parametrize(
    ("labels", "backends", "expected"),
    [
        (node("mnnvl"), ["mnnvl", "trtllm"], ("mnnvl", "Verified")),
        (node("trtllm"), ["mnnvl", "trtllm"], ("trtllm", "Verified")),
        (node("none"), ["mnnvl", "trtllm"], ("auto", "NotVerified")),
        (node(None), ["mnnvl", "trtllm"], ("auto", "NotProbed")),
        (node("MNNVL"), ["mnnvl", "trtllm"], ("auto", "NotProbed")),
        (node("mnnvl"), ["trtllm"], ("auto", "NotVerified")),
        (node("mnnvl", trtllm="pass"), ["trtllm"], ("trtllm", "Verified")),
        (node("mnnvl", trtllm="pass"), ["trtllm", "mnnvl"], ("trtllm", "Verified")),
        (node("trtllm"), ["mnnvl"], ("trtllm", "NotVerified")),
        (node("none", trtllm="pass"), ["mnnvl", "trtllm"], ("trtllm", "NotVerified")),
    ],
    ids=[
        "mnnvl",
        "trtllm",
        "none",
        "unprobed",
        "bad-case",
        "mnnvl-only-not-trtllm",
        "mnnvl-and-trtllm-pass",
        "preference-order",
        "trtllm-node-mnnvl-policy-gets-trtllm-that-runs",
        "none-with-trtllm-pass-gets-trtllm-that-runs",
    ],
)
def test_pod_gets_first_allowed_backend_its_node_verified(
    labels: dict[str, str], backends: list[str], expected: tuple[str, str]
) -> None:
    decision = decide(policy(backends=backends), "gpu-1", labels)
    assert (decision.backend, decision.reason) == expected


def test_unknown_node_gets_the_fallback() -> None:
    decision = decide(policy(fallbackBackend="trtllm"), "ghost", None)
    assert (decision.backend, decision.reason, decision.node_verdict) == ("trtllm", "NodeUnknown", None)


def test_decision_annotation_names_node_verdict_policy_and_reason() -> None:
    decision = decide(policy(), "gpu-1", node("trtllm"), time="2026-01-01T00:00:00Z")
    doc = json.loads(decision.to_json())
    assert doc == {
        "backend": "trtllm",
        "fusion": "on",
        "guard": True,
        "node": "gpu-1",
        "nodeVerdict": "trtllm",
        "policy": "p",
        "reason": "Verified",
        "trigger": "binding",
        "time": "2026-01-01T00:00:00Z",
    }
    assert parse_decision(decision.to_json()) == doc
    assert parse_decision("not json") is None and parse_decision("[1]") is None


@pytest.mark.parametrize(
    "raw",
    ["[" * 50_000, '{"a":[' * 600, json.dumps({"pad": "x" * MAX_DECISION_LENGTH})],
    ids=["nested-50k", "nested-under-the-length-cap", "valid-but-too-long"],
)
def test_hostile_or_oversized_decision_annotation_reads_as_no_decision(raw: str) -> None:
    assert parse_decision(raw) is None


def test_clique_label_is_read() -> None:
    assert node_facts("n", node("mnnvl", clique="uuid.1")).clique == "uuid.1"
    assert node_facts("n", node("mnnvl")).clique is None


def group(pinned: bool = False, spec: dict[str, Any] | None = None, imex: bool = True) -> GroupPlan:
    return GroupPlan(multi=True, key="g1", pinned=pinned, constraint=node_constraint(spec or {}), imex=imex)


def test_group_never_gets_trtllm_across_pods() -> None:
    decision = decide(policy(backends=["trtllm"]), "a", node("trtllm"), group(pinned=True), {})
    assert (decision.backend, decision.reason) == ("auto", "MultiNodeNeedsMnnvl")
    decision = decide(policy(), "a", node("trtllm"), group(pinned=True), {})
    assert (decision.backend, decision.reason) == ("auto", "MultiNodeNoSharedClique")


def test_pinned_group_gets_mnnvl_on_a_clique_node() -> None:
    decision = decide(policy(), "a", node("mnnvl", clique="c.1"), group(pinned=True), {})
    assert (decision.backend, decision.reason, decision.group) == ("mnnvl", "Verified", "g1")


def test_pinned_group_on_node_without_clique_falls_back() -> None:
    decision = decide(policy(), "a", node("mnnvl"), group(pinned=True), {})
    assert decision.reason == "MultiNodeNoSharedClique"


def test_unpinned_group_gets_mnnvl_only_if_every_candidate_node_shares_one_clique() -> None:
    spec = {"nodeSelector": {"pool": "gb200"}}
    one_clique = {
        "a": {**node("mnnvl", clique="c.1"), "pool": "gb200"},
        "b": {**node("mnnvl", clique="c.1"), "pool": "gb200"},
        "other": {**node("none"), "pool": "cpu"},
    }
    decision = decide(policy(), "a", one_clique["a"], group(spec=spec), one_clique)
    assert decision.backend == "mnnvl"
    two_cliques = {**one_clique, "c": {**node("mnnvl", clique="c.2"), "pool": "gb200"}}
    decision = decide(policy(), "a", two_cliques["a"], group(spec=spec), two_cliques)
    assert (decision.backend, decision.reason) == ("auto", "MultiNodeNoSharedClique")
    unverified = {**one_clique, "d": {**node("trtllm", clique="c.1"), "pool": "gb200"}}
    assert decide(policy(), "a", unverified["a"], group(spec=spec), unverified).backend == "auto"
