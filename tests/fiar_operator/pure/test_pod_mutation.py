"""The pod CREATE mutation: env injection, explicit env, Audit, placement, groups, reinvocation."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.workloads import pod
from fiar_operator.admission.mutation import default_backend_ops, plan_pod_create
from fiar_operator.core import patches
from fiar_operator.core.decide import node_facts, verified_for
from fiar_operator.core.pods import FIELD_PATH
from fiar_operator.core.policy import LWS_GROUP_KEY, LWS_SIZE, Policy
from fiar_operator.core.selectors import node_constraint

from .builders import policy

BACKEND_KEY = contract.ANNOTATION_POD_BACKEND


def mutated(source: dict[str, Any], chosen: Policy, nodes: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    sent = copy.deepcopy(source)
    plan = plan_pod_create(source, chosen, nodes or {})
    assert source == sent, "planning changed the pod under review"
    result: dict[str, Any] = patches.apply(copy.deepcopy(source), plan.ops)
    assert result == plan.pod
    assert_no_op_is_overwritten(plan.ops)
    return result


def assert_no_op_is_overwritten(ops: list[patches.Op]) -> None:
    """No op changes a path that a later op sets whole (the API server would apply both)."""
    for i, op in enumerate(ops):
        for later in ops[i + 1 :]:
            last = later["path"].rpartition("/")[2]
            if later["op"] in ("add", "replace") and not last.isdigit() and last != "-":
                assert not (op["path"] + "/").startswith(later["path"] + "/"), (op, later)


def test_each_selected_containers_env_is_set_in_one_op() -> None:
    """The fusion variables rewrite the env the backend variable was added to: one op, not two."""
    plan = plan_pod_create(pod({"name": "vllm", "command": ["vllm", "serve", "m"]}), policy(), {})
    env_ops = [op for op in plan.ops if op["path"].startswith("/spec/containers/0/env")]
    assert [op["path"] for op in env_ops] == ["/spec/containers/0/env"]
    assert contract.ENV_VAR in {e["name"] for e in env_ops[0]["value"]}


def test_applied_copies_only_the_paths_it_changes() -> None:
    source = pod({"name": "a", "env": [{"name": "X", "value": "1"}]}, {"name": "b"}, labels={"app": "vllm"})
    sent = copy.deepcopy(source)
    ops: list[patches.Op] = [
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "Y", "value": "2"}},
        {"op": "remove", "path": "/spec/containers/0/env/0"},
        {"op": "add", "path": "/metadata/labels/fiar.io~1policy", "value": "vllm"},
    ]
    out = patches.applied(source, ops)
    assert source == sent
    assert out == patches.apply(copy.deepcopy(source), ops)
    assert out["spec"]["containers"][1] is source["spec"]["containers"][1], "an untouched container is shared"
    assert out["metadata"]["labels"] is not source["metadata"]["labels"]


def env_of(obj: dict[str, Any], index: int = 0) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = obj["spec"]["containers"][index].get("env") or []
    return env


def test_selected_container_reads_backend_from_annotation_set_to_fallback() -> None:
    out = mutated(pod(), policy(fallbackBackend="trtllm"))
    assert out["metadata"]["labels"][contract.LABEL_POD_POLICY] == "vllm"
    assert out["metadata"]["annotations"][BACKEND_KEY] == "trtllm"
    assert json.loads(out["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])["reason"] == "Pending"
    (entry,) = [e for e in env_of(out) if e["name"] == contract.ENV_VAR]
    assert entry["valueFrom"]["fieldRef"]["fieldPath"] == FIELD_PATH == "metadata.annotations['fiar.io/backend']"


def test_existing_env_is_kept_and_the_variable_appended() -> None:
    out = mutated(pod({"name": "vllm", "env": [{"name": "HF_HOME", "value": "/cache"}]}), policy())
    assert [e["name"] for e in env_of(out)] == ["HF_HOME", contract.ENV_VAR, *(g.env for g in contract.MULTICAST_GUARD)]


def test_reinvocation_adds_nothing() -> None:
    once = mutated(pod({"name": "vllm", "env": [{"name": "A", "value": "1"}]}, labels={"app": "x"}), policy())
    again = plan_pod_create(once, policy(), {})
    assert again.ops == [] and again.managed
    assert [e["name"] for e in env_of(once)].count(contract.ENV_VAR) == 1


@pytest.mark.parametrize(
    "explicit",
    [
        {"name": contract.ENV_VAR, "value": "trtllm"},
        {"name": contract.ENV_VAR, "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "backend"}}},
    ],
    ids=["value", "valueFrom"],
)
def test_container_that_sets_the_variable_is_left_alone(explicit: dict[str, Any]) -> None:
    source = pod({"name": "vllm", "env": [explicit]}, {"name": "vllm-worker"})
    plan = plan_pod_create(source, policy(), {})
    out = patches.apply(copy.deepcopy(source), plan.ops)
    assert env_of(out, 0) == [explicit]
    assert env_of(out, 1)[0]["valueFrom"]["fieldRef"]["fieldPath"] == FIELD_PATH
    assert any("left alone" in w for w in plan.warnings)


def test_pod_whose_only_container_sets_the_variable_is_not_managed() -> None:
    source = pod({"name": "vllm", "env": [{"name": contract.ENV_VAR, "value": "mnnvl"}]})
    plan = plan_pod_create(source, policy(), {})
    assert not plan.managed and plan.ops == []
    assert any("selects none of its containers" in w for w in plan.warnings)


def test_explicit_env_is_replaced_when_not_respected_and_duplicates_removed() -> None:
    source = pod(
        {
            "name": "vllm",
            "env": [
                {"name": contract.ENV_VAR, "value": "mnnvl"},
                {"name": "X", "value": "1"},
                {"name": contract.ENV_VAR, "value": "trtllm"},
            ],
        }
    )
    out = mutated(source, policy(respectExplicitEnv=False))
    assert [e["name"] for e in env_of(out)] == [contract.ENV_VAR, "X", *(g.env for g in contract.MULTICAST_GUARD)]
    assert env_of(out)[0]["valueFrom"]["fieldRef"]["fieldPath"] == FIELD_PATH


def test_container_globs_select_containers() -> None:
    source = pod({"name": "vllm-leader"}, {"name": "istio-proxy"}, {"name": "main"})
    out = mutated(source, policy(containers=["vllm-*", "main"]))
    assert [bool(env_of(out, i)) for i in range(3)] == [True, False, True]


def test_audit_records_the_decision_and_changes_no_env_or_placement() -> None:
    source = pod({"name": "vllm", "env": [{"name": "A", "value": "1"}]})
    out = mutated(source, policy(mode="Audit", placement="VerifiedNodesOnly"))
    assert env_of(out) == [{"name": "A", "value": "1"}]
    assert "affinity" not in out["spec"]
    assert out["metadata"]["labels"][contract.LABEL_POD_POLICY] == "vllm"
    assert out["metadata"]["annotations"][BACKEND_KEY] == "auto"


def test_pod_created_with_node_name_is_decided_at_once() -> None:
    nodes = {"gpu-7": {contract.LABEL_BACKEND: "trtllm"}}
    out = mutated(pod(nodeName="gpu-7"), policy(), nodes)
    assert out["metadata"]["annotations"][BACKEND_KEY] == "trtllm"
    decision = json.loads(out["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])
    assert decision == {
        "backend": "trtllm",
        "fusion": "on",
        "guard": True,
        "node": "gpu-7",
        "nodeVerdict": "trtllm",
        "policy": "vllm",
        "reason": "Verified",
        "trigger": "create",
    }


def test_verified_nodes_only_trtllm_requires_a_passed_trtllm_test_in_every_existing_term() -> None:
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]
    source = pod(
        affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}},
            "podAntiAffinity": {"x": 1},
        }
    )
    out = mutated(source, policy(placement="VerifiedNodesOnly", backends=["trtllm"]))
    merged = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    wanted = [
        {"key": contract.LABEL_BACKEND, "operator": "In", "values": ["mnnvl", "trtllm"]},
        {"key": contract.LABEL_TRTLLM, "operator": "In", "values": ["pass"]},
    ]
    assert [t["matchExpressions"][-2:] for t in merged["nodeSelectorTerms"]] == [wanted, wanted]
    assert merged["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "zone"
    assert merged["nodeSelectorTerms"][1]["matchFields"] == terms[1]["matchFields"]
    assert out["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}
    assert plan_pod_create(out, policy(placement="VerifiedNodesOnly", backends=["trtllm"]), {}).ops == []


@pytest.mark.parametrize("backends", [["trtllm"], ["mnnvl"], ["mnnvl", "trtllm"], ["trtllm", "mnnvl"]])
def test_verified_nodes_only_admits_exactly_the_nodes_that_verify_an_allowed_backend(backends: list[str]) -> None:
    fleet = {
        "mnnvl-trtllm-pass": {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_TRTLLM: "pass"},
        "mnnvl-trtllm-fail": {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_TRTLLM: "fail"},
        "trtllm": {contract.LABEL_BACKEND: "trtllm", contract.LABEL_TRTLLM: "pass"},
        "none": {contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "fail"},
        "unprobed": {},
    }
    chosen = policy(placement="VerifiedNodesOnly", backends=backends)
    out = mutated(pod(), chosen)
    constraint = node_constraint(out["spec"])
    admitted = {name for name, labels in fleet.items() if constraint.admits(labels)}
    verifying = {name for name, labels in fleet.items() if verified_for(chosen, node_facts(name, labels))}
    assert admitted == verifying


def test_verified_nodes_only_without_affinity_creates_one_term() -> None:
    out = mutated(pod(), policy(placement="VerifiedNodesOnly"))
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [{"key": contract.LABEL_BACKEND, "operator": "In", "values": ["mnnvl", "trtllm"]}]}
    ]


def lws_pod(key: str = "g-1") -> dict[str, Any]:
    return pod(labels={LWS_GROUP_KEY: key}, annotations={LWS_SIZE: "2"})


def test_multi_pod_group_is_pinned_to_mnnvl_nodes_of_one_clique() -> None:
    out = mutated(lws_pod(), policy(placement="VerifiedNodesOnly"))
    affinity = out["spec"]["affinity"]
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": contract.LABEL_BACKEND, "operator": "In", "values": ["mnnvl"]} in term["matchExpressions"]
    assert {"key": contract.LABEL_CLIQUE, "operator": "Exists"} in term["matchExpressions"]
    assert affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"labelSelector": {"matchLabels": {LWS_GROUP_KEY: "g-1"}}, "topologyKey": contract.LABEL_CLIQUE}
    ]


def test_unpinned_multi_pod_group_is_told_how_to_pin_it() -> None:
    plan = plan_pod_create(lws_pod(), policy(), {})
    assert "affinity" not in plan.pod["spec"]
    assert any("mnnvl only if all candidate nodes share one clique" in w for w in plan.warnings)


def test_multi_pod_group_without_mnnvl_allowed_is_warned() -> None:
    plan = plan_pod_create(lws_pod(), policy(backends=["trtllm"]), {})
    assert plan.managed and any("trtllm is invalid across pods" in w for w in plan.warnings)


def test_non_pod_or_missing_fields_do_not_crash() -> None:
    plan = plan_pod_create({"metadata": {}}, policy(), {})
    assert not plan.managed
    plan = plan_pod_create({"spec": {"containers": ["not-a-dict", {"name": "vllm"}]}}, policy(), {})
    assert plan.managed
    plan = plan_pod_create({"spec": {"containers": [{"name": "vllm", "env": "x"}]}}, policy(), {})
    assert not plan.managed and any("env is not a list" in w for w in plan.warnings)


def test_pod_reading_the_backend_annotation_from_an_init_container_gets_auto() -> None:
    injected = {"name": contract.ENV_VAR, "valueFrom": {"fieldRef": {"fieldPath": FIELD_PATH}}}
    source = pod(initContainers=[{"name": "warmup", "env": [injected]}], annotations={"a": "b"})
    assert default_backend_ops(source) == [
        {"op": "add", "path": "/metadata/annotations/fiar.io~1backend", "value": "auto"}
    ]
    assert default_backend_ops(pod(annotations={BACKEND_KEY: "trtllm"}, initContainers=[{"env": [injected]}])) == []
    assert default_backend_ops(pod({"name": "vllm", "env": [{"name": contract.ENV_VAR, "value": "auto"}]})) == []
