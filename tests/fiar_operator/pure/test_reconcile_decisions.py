"""Drift, late decisions, staleness and policy status, computed from indexes."""

from __future__ import annotations

import json
from typing import Any

import fiar_contract as contract
from fiar_operator.core.decide import Decision
from fiar_operator.core.pods import PodRecord, pod_record
from fiar_operator.core.policy import LWS_GROUP_KEY, LWS_SIZE, Policy, parse_policy
from fiar_operator.reconcile.rules import (
    is_stale,
    multi_node_warning,
    node_counts,
    policy_status,
    review_pod,
    status_of,
)
from fiar_operator.reconcile.status import Outcomes
from fiar_operator.state import kinds
from fiar_operator.state.store import Store

NOW = "2026-05-01T12:00:00Z"


def policy(**spec: Any) -> Policy:
    return parse_policy({"metadata": {"name": "vllm", "generation": 2}, "spec": {"podSelector": {}, **spec}})


def verdict(value: str, **extra: str) -> dict[str, str]:
    return {contract.LABEL_BACKEND: value, **extra}


def bound(
    node: str,
    backend: str,
    decision: Decision | dict[str, Any] | None,
    started: str = "2026-05-01T11:00:00Z",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    name: str = "p-1",
) -> PodRecord:
    notes = {contract.ANNOTATION_POD_BACKEND: backend, **(annotations or {})}
    if isinstance(decision, Decision):
        notes[contract.ANNOTATION_POD_DECISION] = decision.to_json()
    elif decision is not None:
        notes[contract.ANNOTATION_POD_DECISION] = json.dumps(decision)
    return pod_record(
        {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": f"uid-{name}",
                "annotations": notes,
                "labels": {contract.LABEL_POD_POLICY: "vllm", **(labels or {})},
            },
            "spec": {"nodeName": node, "containers": [{"name": "vllm"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [{"name": "vllm", "state": {"running": {"startedAt": started}}}],
            },
        }
    )


def at_binding(node: str, backend: str, node_verdict: str, reason: str = "Verified") -> dict[str, Any]:
    return {
        "backend": backend,
        "node": node,
        "nodeVerdict": node_verdict,
        "policy": "vllm",
        "reason": reason,
        "trigger": "binding",
        "time": "2026-05-01T10:59:59Z",
    }


def test_pod_whose_backend_is_no_longer_verified_is_reannotated() -> None:
    pod = bound("a", "mnnvl", at_binding("a", "mnnvl", "mnnvl"))
    action = review_pod(pod, policy(), {"a": verdict("trtllm")}, now=NOW)
    assert action is not None and action.event_type == "Warning" and action.event_reason == "NodeVerdictChanged"
    assert (action.decision.backend, action.decision.previous, action.decision.trigger) == (
        "trtllm",
        "mnnvl",
        "reconcile",
    )
    assert "next container start" in action.message


def test_pod_on_a_node_that_lost_every_backend_gets_the_fallback() -> None:
    pod = bound("a", "trtllm", at_binding("a", "trtllm", "trtllm"))
    action = review_pod(pod, policy(fallbackBackend="trtllm"), {"a": verdict("none")}, now=NOW)
    assert action is None  # the fallback equals the current value: nothing to change
    action = review_pod(pod, policy(), {"a": verdict("none")}, now=NOW)
    assert action is not None and action.decision.backend == "auto"


def test_still_verified_backend_is_left_alone_when_a_better_one_appears() -> None:
    pod = bound("a", "trtllm", at_binding("a", "trtllm", "trtllm"))
    assert review_pod(pod, policy(), {"a": verdict("mnnvl", **{contract.LABEL_TRTLLM: "pass"})}, now=NOW) is None


def test_fallback_pod_is_upgraded_once_its_node_is_verified() -> None:
    pod = bound("a", "auto", at_binding("a", "auto", "", reason="NotProbed"))
    action = review_pod(pod, policy(), {"a": verdict("trtllm")}, now=NOW)
    assert action is not None and action.decision.backend == "trtllm"


def test_pod_bound_while_the_operator_was_down_is_decided_and_reported() -> None:
    pending = {
        "backend": "auto",
        "policy": "vllm",
        "reason": "Pending",
        "trigger": "create",
        "node": None,
        "nodeVerdict": None,
    }
    pod = bound("a", "auto", pending)
    action = review_pod(pod, policy(), {"a": verdict("mnnvl")}, now=NOW)
    assert action is not None and action.event_reason == "DecidedAfterBinding" and action.event_type == "Warning"
    assert action.decision.backend == "mnnvl" and action.decision.previous == "auto"
    confirm = review_pod(pod, policy(), {"a": verdict("none")}, now=NOW)
    assert confirm is not None and confirm.event_type == "Normal" and confirm.decision.backend == "auto"


def test_pending_and_finished_pods_are_not_touched() -> None:
    unbound = pod_record(
        {"metadata": {"name": "x", "namespace": "ml", "labels": {contract.LABEL_POD_POLICY: "vllm"}}, "spec": {}}
    )
    assert review_pod(unbound, policy(), {}, now=NOW) is None
    done = pod_record(
        {
            "metadata": {"name": "y", "namespace": "ml", "labels": {contract.LABEL_POD_POLICY: "vllm"}},
            "spec": {"nodeName": "a"},
            "status": {"phase": "Succeeded"},
        }
    )
    assert review_pod(done, policy(), {"a": verdict("none")}, now=NOW) is None


def test_group_members_fall_back_together_when_one_node_loses_mnnvl() -> None:
    group = {LWS_GROUP_KEY: "g"}
    size = {LWS_SIZE: "2"}
    nodes = {
        "a": verdict("mnnvl", **{contract.LABEL_CLIQUE: "c.1"}),
        "b": verdict("trtllm", **{contract.LABEL_CLIQUE: "c.1"}),
    }
    a = bound("a", "mnnvl", at_binding("a", "mnnvl", "mnnvl"), labels=group, annotations=size, name="a")
    b = bound("b", "mnnvl", at_binding("b", "mnnvl", "mnnvl"), labels=group, annotations=size, name="b")
    action = review_pod(a, policy(), nodes, members=[a, b], now=NOW)
    assert action is not None and action.decision.backend == "auto"
    assert action.decision.reason == "MultiNodeNoSharedClique"


def test_stale_means_containers_started_before_the_backend_changed() -> None:
    changed = {
        "backend": "trtllm",
        "previous": "mnnvl",
        "trigger": "reconcile",
        "time": "2026-05-01T11:30:00Z",
        "reason": "Verified",
        "policy": "vllm",
        "node": "a",
        "nodeVerdict": "trtllm",
    }
    assert is_stale(bound("a", "trtllm", changed, started="2026-05-01T11:00:00Z"))
    assert not is_stale(bound("a", "trtllm", changed, started="2026-05-01T11:45:00Z"))
    assert not is_stale(bound("a", "mnnvl", at_binding("a", "mnnvl", "mnnvl")))


def test_multi_node_fallback_at_binding_gets_a_warning_message() -> None:
    group, size = {LWS_GROUP_KEY: "g"}, {LWS_SIZE: "2"}
    doc = {**at_binding("a", "auto", "trtllm", reason="MultiNodeNeedsMnnvl"), "group": "g"}
    message = multi_node_warning(bound("a", "auto", doc, labels=group, annotations=size), policy())
    assert message is not None and "trtllm is invalid across pods" in message
    verified = {**at_binding("a", "mnnvl", "mnnvl"), "group": "g"}
    assert multi_node_warning(bound("a", "mnnvl", verified, labels=group, annotations=size), policy()) is None


def test_group_falling_back_on_an_unprobed_node_gets_a_warning_message() -> None:
    doc = {**at_binding("gpu", "auto", "", reason="NotProbed"), "nodeVerdict": None, "group": "g"}
    pod = bound("gpu", "auto", doc, labels={LWS_GROUP_KEY: "g"}, annotations={LWS_SIZE: "2"})
    message = multi_node_warning(pod, policy(placement="Anywhere"))
    assert message == (
        "multi-pod group g: node gpu has no verdict yet (never probed by the fiar agent); it runs with auto"
    )


def test_single_pod_on_an_unprobed_node_gets_no_group_warning() -> None:
    doc = {**at_binding("gpu", "auto", "", reason="NotProbed"), "nodeVerdict": None}
    assert multi_node_warning(bound("gpu", "auto", doc), policy()) is None


def test_group_member_whose_node_kept_mnnvl_is_told_that_the_group_became_inconsistent() -> None:
    group, size = {LWS_GROUP_KEY: "g"}, {LWS_SIZE: "2"}
    nodes = {
        "a": verdict("mnnvl", **{contract.LABEL_CLIQUE: "c.1"}),
        "b": verdict("trtllm", **{contract.LABEL_CLIQUE: "c.1"}),
    }
    a = bound("a", "mnnvl", at_binding("a", "mnnvl", "mnnvl"), labels=group, annotations=size, name="a")
    b = bound("b", "mnnvl", at_binding("b", "mnnvl", "mnnvl"), labels=group, annotations=size, name="b")
    kept = review_pod(a, policy(), nodes, members=[a, b], now=NOW)
    assert kept is not None and kept.event_reason == "GroupInconsistent"
    assert "node a verdict" not in kept.message
    assert "multi-pod group g no longer verifies mnnvl in one NVLink clique" in kept.message
    assert "node b of member b has verdict trtllm" in kept.message and "mnnvl -> auto" in kept.message
    changed = review_pod(b, policy(), nodes, members=[a, b], now=NOW)
    assert changed is not None and changed.event_reason == "NodeVerdictChanged"
    assert changed.message.startswith("node b verdict is now trtllm: backend mnnvl -> auto")


def test_group_spread_over_two_cliques_names_them() -> None:
    group, size = {LWS_GROUP_KEY: "g"}, {LWS_SIZE: "2"}
    nodes = {
        "a": verdict("mnnvl", **{contract.LABEL_CLIQUE: "c.1"}),
        "b": verdict("mnnvl", **{contract.LABEL_CLIQUE: "c.2"}),
    }
    a = bound("a", "mnnvl", at_binding("a", "mnnvl", "mnnvl"), labels=group, annotations=size, name="a")
    b = bound("b", "mnnvl", at_binding("b", "mnnvl", "mnnvl"), labels=group, annotations=size, name="b")
    action = review_pod(a, policy(placement="Anywhere"), nodes, members=[a, b], now=NOW)
    assert action is not None and action.event_reason == "GroupInconsistent"
    assert "its nodes span NVLink cliques c.1 (a), c.2 (b)" in action.message


def test_status_counts_nodes_per_verdict_and_pods_per_outcome() -> None:
    nodes = {"m": verdict("mnnvl"), "t": verdict("trtllm"), "n": verdict("none"), "cpu": {}}
    stale = {
        "backend": "trtllm",
        "previous": "mnnvl",
        "trigger": "reconcile",
        "time": "2026-05-01T11:30:00Z",
        "reason": "Verified",
        "policy": "vllm",
    }
    pods = [
        bound("m", "mnnvl", at_binding("m", "mnnvl", "mnnvl"), name="1"),
        bound("n", "auto", at_binding("n", "auto", "none", reason="NotVerified"), name="2"),
        bound("t", "trtllm", stale, name="3"),
        pod_record({"metadata": {"name": "4", "namespace": "ml", "labels": {contract.LABEL_POD_POLICY: "vllm"}}}),
    ]
    status = policy_status(policy(), nodes, pods, None, NOW)
    assert status["nodes"] == {"mnnvl": 1, "trtllm": 1, "none": 1, "unprobed": 1, "verified": 2}
    assert status["pods"] == {
        "decided": 2,
        "fallback": 1,
        "pending": 1,
        "stale": 1,
        "unconfigured": 0,
        "fusionOff": 0,
        "fusionUncontrolled": 0,
        "multicastGuarded": 0,
        "flashinferNotTurnedOff": 0,
        "valuesNotApplied": 0,
        "releaseNotQualified": 0,
    }
    assert status["observedGeneration"] == 2
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["NoVerifiedNodes"]["status"] == "False"


def test_no_verified_nodes_condition_and_transition_times() -> None:
    first = policy_status(policy(backends=["mnnvl"]), {"t": verdict("trtllm")}, [], None, NOW)
    cond = {c["type"]: c for c in first["conditions"]}["NoVerifiedNodes"]
    assert cond["status"] == "True" and cond["reason"] == "NoVerifiedNodes" and cond["lastTransitionTime"] == NOW
    later = policy_status(policy(backends=["mnnvl"]), {"t": verdict("trtllm")}, [], first, "2026-05-02T00:00:00Z")
    assert later == first
    flipped = policy_status(policy(backends=["mnnvl"]), {"t": verdict("mnnvl")}, [], first, "2026-05-03T00:00:00Z")
    cond = {c["type"]: c for c in flipped["conditions"]}["NoVerifiedNodes"]
    assert cond["status"] == "False" and cond["lastTransitionTime"] == "2026-05-03T00:00:00Z"


def test_a_status_from_node_counts_kept_aside_is_the_status_counted_afresh() -> None:
    nodes = {"m": verdict("mnnvl"), "t": verdict("trtllm"), "n": verdict("none"), "cpu": {}}
    pods = [bound("m", "mnnvl", at_binding("m", "mnnvl", "mnnvl"), name="1")]
    kept = node_counts(policy(), nodes)
    assert policy_status(policy(), {}, pods, None, NOW, counts=kept) == policy_status(policy(), nodes, pods, None, NOW)
    kept["verified"] = 99  # the status holds its own copy
    assert policy_status(policy(), {}, pods, None, NOW, counts=kept)["nodes"]["verified"] == 99
    assert node_counts(policy(), nodes)["verified"] == 2


def test_the_node_index_counts_each_change_of_labels_and_no_heartbeat_or_stale_event() -> None:
    store = Store()
    body = {"metadata": {"name": "gpu-0", "resourceVersion": "5", "labels": verdict("mnnvl")}}
    store.put_node(body)
    assert store.node_changes == 1
    store.put_node({**body, "metadata": {**body["metadata"], "resourceVersion": "7"}})  # a status heartbeat
    store.put_node({**body, "metadata": {**body["metadata"], "resourceVersion": "4", "labels": {}}})  # stale
    assert store.node_changes == 1
    store.put_node({**body, "metadata": {**body["metadata"], "resourceVersion": "8", "labels": verdict("none")}})
    assert store.node_changes == 2
    store.delete_node("gpu-0")
    store.delete_node("gpu-0")
    assert store.node_changes == 3
    store.replace_all(kinds.NODES, [body])
    assert store.node_changes > 3 and store.nodes == {"gpu-0": verdict("mnnvl")}


def labelled_pod(name: str, namespace: str = "ml", node: str | None = None, app: str = "vllm") -> dict[str, Any]:
    labels = {"app": app, contract.LABEL_POD_POLICY: "vllm"}
    spec = {"nodeName": node} if node else {}
    meta = {"name": name, "namespace": namespace, "uid": f"u-{name}", "resourceVersion": "1", "labels": labels}
    return {"metadata": meta, "spec": spec}


def test_a_status_counted_from_kept_outcomes_is_the_status_counted_afresh() -> None:
    store = Store()
    store.put_policy(
        {
            "metadata": {"name": "vllm", "generation": 1},
            "spec": {
                "podSelector": {"matchLabels": {"app": "vllm"}},
                "namespaceSelector": {"matchLabels": {"team": "a"}},
            },
        }
    )
    store.put_namespace({"metadata": {"name": "ml", "resourceVersion": "1", "labels": {"team": "a"}}})
    for name in ("1", "2"):
        store.put_pod(labelled_pod(name))
    store.put_pod(labelled_pod("web", app="web"))  # labelled, not selected: never counted
    outcomes = Outcomes()

    def kept() -> dict[str, int]:
        policy = store.policies["vllm"]
        status = status_of(policy, outcomes.counted(store, "vllm", policy), None, NOW, (), {"verified": 0})
        assert status == policy_status(policy, {}, store.pods_of_policy("vllm"), None, NOW, counts={"verified": 0})
        return dict(status["pods"])

    assert kept()["pending"] == 2
    bound_now = labelled_pod("2", node="n")
    bound_now["metadata"]["resourceVersion"] = "2"
    store.put_pod(bound_now)  # a new record for pod 2
    assert (kept()["pending"], kept()["fallback"]) == (1, 1)
    store.put_namespace({"metadata": {"name": "ml", "resourceVersion": "2", "labels": {"team": "b"}}})
    assert kept()["pending"] == 0  # the namespace left the policy's selector: its pods are counted again
    assert outcomes.held("vllm") == 3
    store.delete_pod("ml", "1")
    kept()
    assert outcomes.held("vllm") == 2  # a pod gone from the index is not held
    outcomes.forget(keep=set())
    assert outcomes.held("vllm") == 0
