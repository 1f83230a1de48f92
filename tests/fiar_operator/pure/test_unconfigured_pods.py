"""Pods a policy selects that the pod webhook never configured (created before the policy, or while
the webhook was unavailable) run with vLLM's default and are reported, never silently counted as managed."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client

import fiar_contract as contract
from devcluster.feed import feed
from devcluster.workloads import explicit_backend as explicit
from fiar_operator.core.pods import FIELD_PATH, PodRecord, pod_record
from fiar_operator.core.policy import Policy, parse_policy
from fiar_operator.core.settings import Settings
from fiar_operator.reconcile.events import TokenBucket
from fiar_operator.reconcile.rules import policy_status, unconfigured_by, unconfigured_pods
from fiar_operator.reconcile.unconfigured import Unconfigured
from fiar_operator.runtime import Runtime
from fiar_operator.state import kinds
from fiar_operator.state.kube import Kube
from fiar_operator.state.store import Store

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


def test_a_sweep_groups_pods_by_policy_and_skips_excluded_namespaces() -> None:
    pods = [pod("a"), pod("b"), pod("c", namespace="kube-system"), pod("d", labels={"app": "web"})]
    namespaces = {"ml": NS, "kube-system": {"kubernetes.io/metadata.name": "kube-system"}}
    found = unconfigured_pods(pods, [policy()], namespaces, lambda ns: ns == "kube-system")
    assert {name: [p.name for p in records] for name, records in found.items()} == {"vllm": ["a", "b"]}
    assert unconfigured_pods(pods, [], namespaces, lambda ns: False) == {}


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


def body(name: str, labels: dict[str, str] | None = None, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels or {"app": "vllm"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {"phase": phase},
    }


@pytest.fixture
def runtime() -> Runtime:
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:1"  # nothing here calls the API server
    made = Runtime(Settings(standalone=True, metrics_port=None), kube=Kube(cfg))
    made.store.put_namespace({"metadata": {"name": "ml", "labels": NS}})
    return made


def policy_body(name: str, generation: int = 1, **spec: Any) -> dict[str, Any]:
    spec.setdefault("podSelector", {"matchLabels": {"app": "vllm"}})
    return {"metadata": {"name": name, "generation": generation}, "spec": spec}


def test_each_unconfigured_pod_gets_one_warning_and_is_counted_until_it_goes(runtime: Runtime) -> None:
    feed(runtime, "policies", policy_body("vllm"))
    (event,) = feed(runtime, "pods", body("a"))
    assert (event.type, event.reason, event.target["metadata"]["uid"]) == ("Warning", "NotConfigured", "uid-a")
    assert feed(runtime, "pods", body("a")) == [], "one event per pod, not one per update"
    assert runtime.reconciler.unconfigured.pods("vllm") == ["ml/a"]
    assert feed(runtime, "pods", body("a", phase="Succeeded")) == []
    assert runtime.reconciler.unconfigured.pods("vllm") == [], "a finished pod runs nothing"
    feed(runtime, "pods", body("b"))
    feed(runtime, "pods", body("b"), deleted=True)
    assert runtime.reconciler.unconfigured.pods("vllm") == []


def test_a_policy_created_after_its_pods_reports_them_at_once(runtime: Runtime) -> None:
    assert feed(runtime, "pods", body("a")) == [] and feed(runtime, "pods", body("b", {"app": "web"})) == []
    events = feed(runtime, "policies", policy_body("vllm"))
    assert [e.target["metadata"]["name"] for e in events] == ["a"]
    assert runtime.reconciler.unconfigured.pods("vllm") == ["ml/a"]
    assert feed(runtime, "policies", policy_body("vllm")) == [], "its own status writes change nothing"


def test_a_higher_priority_policy_takes_over_the_report_and_a_deleted_one_drops_it(runtime: Runtime) -> None:
    feed(runtime, "policies", policy_body("low"))
    feed(runtime, "pods", body("a"))
    feed(runtime, "policies", policy_body("high", priority=9))
    assert (runtime.reconciler.unconfigured.pods("low"), runtime.reconciler.unconfigured.pods("high")) == ([], ["ml/a"])
    feed(runtime, "policies", policy_body("high", priority=9), deleted=True)
    assert (runtime.reconciler.unconfigured.pods("low"), runtime.reconciler.unconfigured.pods("high")) == (["ml/a"], [])


def test_pods_in_excluded_namespaces_are_never_reported(runtime: Runtime) -> None:
    runtime.store.put_namespace({"metadata": {"name": "kube-system", "labels": {}}})
    feed(runtime, "policies", policy_body("vllm", namespaceSelector={}))
    system = {**body("coredns"), "metadata": {**body("coredns")["metadata"], "namespace": "kube-system"}}
    assert feed(runtime, "pods", system) == []
    assert runtime.reconciler.unconfigured.pods("vllm") == []


def test_audit_policies_report_nothing_since_the_webhook_changes_no_env_under_them() -> None:
    assert unconfigured_by(pod(), [policy(mode="Audit")], NS) is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tracker_over(pods: int, clock: Clock, marked: list[str], burst: int = 3) -> tuple[Store, Unconfigured]:
    store = Store()
    store.put_namespace({"metadata": {"name": "ml", "labels": NS}})
    store.put_policy(policy_body("vllm"))
    for i in range(pods):
        store.put_pod(body(f"p{i}"))
    limit = TokenBucket(burst, 1.0, clock=clock)
    return store, Unconfigured(store, lambda ns: False, marked.append, limit, clock=clock)


def test_warnings_are_rate_limited_then_drained_in_order_and_every_pod_is_counted() -> None:
    clock, marked = Clock(), []
    store, tracker = tracker_over(10, clock, marked)
    events = tracker.sweep()
    assert [e.target["metadata"]["name"] for e in events] == ["p0", "p1", "p2"]
    assert len(tracker.pods("vllm")) == 10 and marked == ["vllm"]
    assert tracker.pod_changed(store.pods[("ml", "p9")]) == [], "no token left: it waits its turn"
    assert tracker.drain() == []
    clock.now = 2.0  # two tokens back
    assert [e.target["metadata"]["name"] for e in tracker.drain()] == ["p3", "p4"]
    store.delete_pod("ml", "p5", "uid-p5")
    tracker.pod_deleted(("ml", "p5"), "uid-p5")
    clock.now = 100.0
    assert [e.target["metadata"]["name"] for e in tracker.drain()] == ["p6", "p7", "p8"]
    clock.now = 200.0
    assert [e.target["metadata"]["name"] for e in tracker.drain()] == ["p9"]
    assert tracker.drain() == [] and tracker.sweep() == [], "each pod warned once"


def test_a_delete_event_removes_the_pod_before_the_index_notices() -> None:
    store, tracker = tracker_over(2, Clock(), [])
    tracker.sweep()
    tracker.pod_deleted(("ml", "p1"), "uid-p1")
    assert ("ml", "p1") in store.pods and tracker.pods("vllm") == ["ml/p0"]


def test_pods_gone_in_a_relist_without_a_delete_event_are_uncounted_and_their_policy_rewritten() -> None:
    clock, marked = Clock(), []
    store, tracker = tracker_over(2, clock, marked)
    tracker.sweep()
    marked.clear()
    store.replace_all(kinds.PODS, [body("p1")])  # the informer's relist after a watch gap
    tracker.refresh()
    assert marked == [], "not checked again before the interval"
    clock.now = 31.0
    tracker.refresh()
    assert marked == ["vllm"] and tracker.pods("vllm") == ["ml/p1"]


def test_a_pod_event_during_a_sweep_is_applied_after_it() -> None:
    store = Store()
    store.put_namespace({"metadata": {"name": "ml", "labels": NS}})
    store.put_policy(policy_body("vllm"))
    late = threading.Thread()

    def excluded(namespace: str) -> bool:  # called by the sweep while it holds the tracker
        nonlocal late
        if not late.is_alive() and ("ml", "late") not in store.pods:
            store.put_pod(body("late"))
            late = threading.Thread(target=tracker.pod_changed, args=(store.pods[("ml", "late")],))
            late.start()
            late.join(0.2)
            assert late.is_alive(), "the pod event waits for the sweep"
        return False

    store.put_pod(body("early"))
    tracker = Unconfigured(store, excluded, lambda name: None)
    tracker.sweep()
    late.join(5)
    assert tracker.pods("vllm") == ["ml/early", "ml/late"]


def test_a_late_delete_of_an_old_pod_keeps_its_namesake_counted(runtime: Runtime) -> None:
    feed(runtime, "policies", policy_body("vllm"))
    old = body("web-0")
    feed(runtime, "pods", {**old, "metadata": {**old["metadata"], "uid": "uid-new"}})
    feed(runtime, "pods", old, deleted=True)  # the previous pod of that name, reported late
    assert runtime.reconciler.unconfigured.pods("vllm") == ["ml/web-0"]


def test_a_namespace_that_stops_matching_clears_its_pods(runtime: Runtime) -> None:
    feed(runtime, "policies", policy_body("vllm"))
    feed(runtime, "pods", body("a"))
    feed(runtime, "namespaces", {"metadata": {"name": "ml", "labels": {**NS, contract.NAMESPACE_IGNORE_LABEL: "true"}}})
    assert runtime.reconciler.unconfigured.pods("vllm") == []
    events = feed(runtime, "namespaces", {"metadata": {"name": "ml", "labels": NS}})
    assert runtime.reconciler.unconfigured.pods("vllm") == ["ml/a"]
    assert events == [], "the pod was warned once already"


def test_older_policy_or_namespace_events_and_the_delete_of_a_recreated_policy_change_nothing() -> None:
    store = Store()
    store.put_namespace({"metadata": {"name": "ml", "resourceVersion": "7", "labels": {"team": "b"}}})
    store.put_namespace({"metadata": {"name": "ml", "resourceVersion": "5", "labels": {"team": "a"}}})
    assert store.namespaces["ml"] == {"team": "b"}
    store.put_policy({**policy_body("vllm", 2), "metadata": {"name": "vllm", "uid": "new", "resourceVersion": "20"}})
    store.put_policy({**policy_body("vllm", 1), "metadata": {"name": "vllm", "uid": "old", "resourceVersion": "10"}})
    assert store.policy_objects["vllm"]["metadata"]["uid"] == "new"
    store.delete_policy("vllm", "old")
    assert "vllm" in store.policies
    store.delete_policy("vllm", "new")
    assert "vllm" not in store.policies


def test_a_namespace_change_sweeps_only_that_namespaces_pods() -> None:
    store = Store()
    for ns in ("ml", "web"):
        store.put_namespace({"metadata": {"name": ns, "resourceVersion": "1", "labels": {"team": ns}}})
        for i in range(50):
            store.put_pod({**body(f"{ns}-{i}"), "metadata": {**body(f"{ns}-{i}")["metadata"], "namespace": ns}})
    for i in range(20):
        store.put_policy(policy_body(f"p{i}", namespaceSelector={"matchLabels": {"team": "ml"}}, priority=i))
    considered: list[str] = []

    def excluded(namespace: str) -> bool:  # the sweep asks once per pod it considers
        considered.append(namespace)
        return False

    tracker = Unconfigured(store, excluded, lambda name: None)
    tracker.sweep()
    assert len(considered) == 100 and tracker.pods("p19") == [f"ml/ml-{i}" for i in sorted(range(50), key=str)]
    considered.clear()
    store.put_namespace({"metadata": {"name": "web", "resourceVersion": "2", "labels": {"team": "ml"}}})
    tracker.sweep()
    assert set(considered) == {"web"} and len(considered) == 50
    assert len(tracker.pods("p19")) == 100  # the pods of ml kept, web's added
    considered.clear()
    tracker.sweep()
    assert considered == []  # nothing changed: nothing swept
