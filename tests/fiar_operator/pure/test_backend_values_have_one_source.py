"""Backend values come from fiar_contract; the node facts, the placement rule, the multi-pod rule and
the CRD and chart schemas follow it."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import fiar_contract as contract
from fiar_operator.core import decide, nodefacts
from fiar_operator.core.affinity import merge_node_alternatives
from fiar_operator.core.nodefacts import NodeFacts, group_break, node_facts, verified_alternatives
from fiar_operator.core.policy import DEFAULT, DEFAULT_BACKENDS, parse_policy
from fiar_operator.core.selectors import node_constraint
from fiar_operator.reconcile import rules as reconcile

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "operator" / "fiar_operator" / "crds" / "fiallreducepolicies.yaml"
CHART = ROOT / "charts" / "fiar"


def fleet() -> dict[str, dict[str, str]]:
    """Every label set the agent can write (a verdict names a backend only when its test passed), and
    some it never writes (an unknown verdict, no labels)."""
    nodes: dict[str, dict[str, str]] = {"unprobed": {}, "garbage": {contract.LABEL_BACKEND: "nvls"}}
    results = [None, *contract.TEST_RESULTS]
    for verdict in contract.BACKEND_VERDICTS:
        for combo in itertools.product(results, repeat=len(contract.BACKENDS)):
            labels = {contract.LABEL_BACKEND: verdict}
            labels.update(
                {contract.result_label(b): r for b, r in zip(contract.BACKENDS, combo, strict=True) if r is not None}
            )
            if verdict in contract.BACKENDS and labels.get(contract.result_label(verdict)) != "pass":
                continue
            nodes["-".join([verdict, *(r or "absent" for r in combo)])] = labels
    return nodes


def allowed_lists() -> list[list[str]]:
    return [
        list(order)
        for size in range(1, len(contract.BACKENDS) + 1)
        for order in itertools.permutations(contract.BACKENDS, size)
    ]


@pytest.mark.parametrize("backends", allowed_lists(), ids=",".join)
def test_the_placement_rule_admits_exactly_the_nodes_that_verify_an_allowed_backend(backends: list[str]) -> None:
    policy = parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}, "backends": backends}})
    affinity = merge_node_alternatives(None, verified_alternatives(policy.backends))
    assert merge_node_alternatives(affinity, verified_alternatives(policy.backends)) == affinity
    constraint = node_constraint({"affinity": affinity})
    nodes = fleet()
    admitted = {name for name, labels in nodes.items() if constraint.admits(labels)}
    verifying = {name for name, labels in nodes.items() if decide.verified_for(policy, node_facts(name, labels))}
    assert admitted == verifying
    assert verifying  # every allowed list has nodes that verify it


def test_a_verdict_verifies_itself_and_the_less_preferred_backends_whose_test_passed() -> None:
    first, *rest = contract.BACKENDS
    passed = {contract.result_label(b): "pass" for b in contract.BACKENDS}
    assert node_facts("n", {contract.LABEL_BACKEND: first, **passed}).verified == frozenset(contract.BACKENDS)
    assert node_facts("n", {contract.LABEL_BACKEND: rest[-1], **passed}).verified == {rest[-1]}
    assert node_facts("n", {contract.LABEL_BACKEND: contract.NO_BACKEND, **passed}).verified == frozenset()
    assert node_facts("n", {contract.LABEL_BACKEND: "MNNVL", **passed}).verdict is None


def test_policy_status_counts_every_verdict_and_reads_an_unknown_one_as_unprobed() -> None:
    policy = parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}}})
    nodes = {v: {contract.LABEL_BACKEND: v, contract.result_label(contract.BACKENDS[-1]): "pass"} for v in
             contract.BACKEND_VERDICTS} | {"odd": {contract.LABEL_BACKEND: "nvls"}, "new": {}}  # fmt: skip
    counts = reconcile.policy_status(policy, nodes, [], None, "2026-01-01T00:00:00Z")["nodes"]
    assert counts == {**dict.fromkeys(contract.BACKEND_VERDICTS, 1), "unprobed": 2, "verified": len(contract.BACKENDS)}


def test_policy_status_counts_a_verdict_the_contract_gains_later_without_a_key_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A new verdict value reaches the status code through the contract alone; it used to raise KeyError.
    monkeypatch.setattr(contract, "BACKEND_VERDICTS", (*contract.BACKEND_VERDICTS, "nvls"))
    policy = parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}}})
    nodes = {"a": {contract.LABEL_BACKEND: "nvls"}, "b": {contract.LABEL_BACKEND: "none"}}
    counts = reconcile.policy_status(policy, nodes, [], None, "2026-01-01T00:00:00Z")["nodes"]
    assert counts["nvls"] == 1 and counts["none"] == 1 and counts["verified"] == 0


def facts(name: str, verdict: str, clique: str | None) -> NodeFacts:
    labels = {contract.LABEL_BACKEND: verdict, **({contract.LABEL_CLIQUE: clique} if clique else {})}
    return node_facts(name, labels)


def test_the_multi_pod_rule_needs_the_multi_node_backend_in_one_clique() -> None:
    multi = nodefacts.MULTI_NODE_BACKEND
    assert group_break([]) is None
    assert group_break([("node a", facts("a", multi, "u.1")), ("node b", facts("b", multi, "u.1"))]) is None
    assert group_break([("node a", facts("a", multi, "u.1")), ("node b", facts("b", multi, "u.2"))]) == (
        "its nodes span NVLink cliques u.1 (a), u.2 (b)"
    )
    assert group_break([("node a", facts("a", multi, None))]) == "node a is in no NVLink clique"
    assert group_break([("node a", facts("a", "none", "u.1"))]) == "node a has verdict none"
    assert group_break([("node a", node_facts("a", {}))]) == "node a has verdict unprobed"


def test_the_operators_named_backends_are_contract_backends() -> None:
    assert nodefacts.MULTI_NODE_BACKEND in contract.BACKENDS
    assert nodefacts.RUNS_UNVERIFIED in contract.BACKENDS
    assert DEFAULT_BACKENDS == contract.BACKENDS


def test_the_crd_lists_the_contracts_values() -> None:
    crd = yaml.safe_load(CRD.read_text())
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    spec = schema["spec"]["properties"]
    assert spec["backends"]["items"]["enum"] == list(contract.BACKENDS)
    assert spec["backends"]["default"] == list(contract.BACKENDS)
    assert spec["backends"]["maxItems"] == len(contract.BACKENDS)
    assert spec["fallbackBackend"]["enum"] == list(contract.ENV_VALUES)
    counted = [*contract.BACKEND_VERDICTS, "unprobed", "verified"]
    assert list(schema["status"]["properties"]["nodes"]["properties"]) == counted
    columns = {c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert {f".status.nodes.{v}" for v in contract.BACKEND_VERDICTS} <= columns
    rules = " ".join(r["rule"] for r in schema["spec"]["x-kubernetes-validations"])
    assert f"'{nodefacts.MULTI_NODE_BACKEND}' in self.backends" in rules


def test_the_charts_values_schema_and_default_policy_list_the_contracts_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    spec: dict[str, Any] = schema["properties"]["defaultPolicy"]["properties"]["spec"]["properties"]
    assert spec["backends"]["items"]["enum"] == list(contract.BACKENDS)
    assert spec["fallbackBackend"]["enum"] == list(contract.ENV_VALUES)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["defaultPolicy"]["spec"]["backends"] == list(contract.BACKENDS)


SPEC_FIELDS = {
    "containers": "containers",
    "backends": "backends",
    "fallbackBackend": "fallback",
    "placement": "placement",
    "respectExplicitEnv": "respect_explicit_env",
    "mode": "mode",
    "priority": "priority",
    "multiNode": "multi_node",
    "groupKeyLabel": "group_key_label",
    "fusionControl": "fusion_control",
    "respectExplicitFusion": "respect_explicit_fusion",
    "multicastGuard": "multicast_guard",
    "imexChannel": "imex_channel",
    "imexChannelClaims": "imex_claims",
}


def test_the_crds_defaults_are_the_policy_dataclasss_defaults() -> None:
    spec = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    crd_defaults = {key: prop["default"] for key, prop in spec["properties"].items() if "default" in prop}
    assert set(crd_defaults) - {"namespaceSelector"} == set(SPEC_FIELDS)
    for key, name in SPEC_FIELDS.items():
        value = getattr(DEFAULT, name)
        assert crd_defaults[key] == (list(value) if isinstance(value, tuple) else value), key
    read = parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}}})
    assert dataclasses.replace(read, name="") == DEFAULT
