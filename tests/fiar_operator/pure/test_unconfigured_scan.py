"""The pods a policy selects that the pod webhook never saw are found by paged LISTs narrowed by the
policies' selectors (the pod watch selects only the pods the webhook labelled), and reported as
before: counted per policy, one rate-limited Warning each, dropped once they go.

The API server is a real fake here: a list of pod objects served page by page, with the selector
grammar the scan writes (the control-plane tests run the same scans against a real API server)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes import client

import fiar_contract as contract
from devcluster.feed import feed
from fiar_operator.core.errors import Unavailable
from fiar_operator.core.policy import Policy, parse_policy
from fiar_operator.core.selectors import parse_label_selector
from fiar_operator.core.settings import Settings
from fiar_operator.reconcile import scan
from fiar_operator.reconcile.events import TokenBucket
from fiar_operator.reconcile.recreate import Recreator
from fiar_operator.reconcile.unconfigured import Unconfigured
from fiar_operator.runtime import Runtime
from fiar_operator.state import kube
from fiar_operator.state.kube import Kube
from fiar_operator.state.store import Store

NS = {"kubernetes.io/metadata.name": "ml"}


def policy(name: str = "vllm", **spec: Any) -> Policy:
    spec.setdefault("podSelector", {"matchLabels": {"app": "vllm"}})
    return parse_policy({"metadata": {"name": name, "generation": 1}, "spec": spec})


def body(
    name: str, labels: dict[str, str] | None = None, namespace: str = "ml", uid: str = "", owned: bool = True
) -> dict[str, Any]:
    owner = [{"kind": "ReplicaSet", "name": "rs", "controller": True, "uid": "rs"}] if owned else []
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "labels": labels if labels is not None else {"app": "vllm"},
            "ownerReferences": owner,
        },
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {"phase": "Running"},
    }


_TERM = re.compile(r"(!?)([^\s=!,()]+)(?:\s*(=|\sin\s|\snotin\s)\s*(\(([^)]*)\)|[^,]*))?")


def selected(selector: str, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics for the terms the scan writes."""
    for term in re.split(r",(?![^(]*\))", selector):
        m = _TERM.fullmatch(term.strip())
        assert m is not None, f"not a selector term: {term!r}"
        negated, key, op, raw, inner = m.groups()
        if op is None:
            if (key in labels) == bool(negated):
                return False
        elif op == "=":
            if labels.get(key) != raw:
                return False
        else:
            values = set((inner or "").split(","))
            if op.strip() == "in" and labels.get(key) not in values:
                return False
            if op.strip() == "notin" and key in labels and labels[key] in values:
                return False
    return True


class ApiServer:
    """Pods served by paged, label-selected LISTs; each request is recorded with its page size."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.requests: list[tuple[str, str, int]] = []

    def list(self, path: str, selector: str, page: int) -> Iterator[dict[str, Any]]:
        namespace = None if path == kube.PODS else path.split("/")[4]
        chosen = [
            p
            for p in self.pods
            if (namespace is None or p["metadata"]["namespace"] == namespace)
            and selected(selector, p["metadata"]["labels"])
        ]
        for start in range(0, max(len(chosen), 1), page):
            self.requests.append((path, selector, page))
            yield from chosen[start : start + page]


def test_a_policys_selectors_go_to_the_api_server_with_the_policy_label_required_absent() -> None:
    selector = parse_label_selector(
        {
            "matchLabels": {"app": "vllm"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["b", "a"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "example.com/gpu", "operator": "Exists"},
                {"key": "zone", "operator": "NotIn", "values": ["x"]},
            ],
        },
        "podSelector",
    )
    assert scan.selector_query(selector) == (
        f"!{contract.LABEL_POD_POLICY},app=vllm,tier in (a,b),!canary,example.com/gpu,zone notin (x)"
    )
    unwritable = parse_label_selector({"matchLabels": {"app": "a,b=c"}}, "podSelector")
    assert scan.selector_query(unwritable) is None, "no pod label can hold it: the scan filters here"


def test_a_scan_lists_each_selected_namespace_or_the_cluster_once_per_distinct_selector() -> None:
    namespaces = {f"t{i}": {"kubernetes.io/metadata.name": f"t{i}", "team": "ml"} for i in range(20)}
    namespaces["ml"] = NS
    namespaces["quiet"] = {**NS, contract.NAMESPACE_IGNORE_LABEL: "true"}
    few = policy("few", namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": "ml"}})
    many = policy("many", namespaceSelector={"matchLabels": {"team": "ml"}})
    audit = policy("audit", podSelector={"matchLabels": {"app": "x"}}, mode="Audit")
    queries = scan.plan([few, many, audit], namespaces, lambda ns: ns == "t0")
    assert [(q.path, q.namespaces and len(q.namespaces)) for q in queries] == [
        ("/api/v1/namespaces/ml/pods", None),
        (kube.PODS, 19),  # 20 namespaces take more than PER_NAMESPACE, t0 is excluded
    ]
    everywhere = scan.plan(
        [policy("a", namespaceSelector={}), policy("b", namespaceSelector={})], namespaces, lambda ns: False
    )
    assert [(q.path, q.namespaces) for q in everywhere] == [(kube.PODS, None)]


def test_a_scan_finds_the_unlabelled_pods_and_attributes_them_as_the_webhook_would() -> None:
    server = ApiServer(
        [
            body("a"),
            body("b", {"app": "vllm", "tier": "gold"}),
            body("web", {"app": "web"}),
            body("done", {"app": "vllm", contract.LABEL_POD_POLICY: "low"}),
            body("sys", namespace="kube-system"),
        ]
    )
    low = policy("low", namespaceSelector={})
    high = policy("high", podSelector={"matchLabels": {"tier": "gold"}}, priority=5)
    namespaces = {"ml": NS, "kube-system": {"kubernetes.io/metadata.name": "kube-system"}}
    found = scan.scan(server.list, [low, high], namespaces, lambda ns: ns == "kube-system")
    assert {name: sorted(k[1] for k in pods) for name, pods in found.pods.items()} == {"low": ["a"], "high": ["b"]}
    assert found.complete and found.pods["low"][("ml", "a")].owner == ("ReplicaSet", "rs")


def test_an_empty_selector_over_every_namespace_is_read_in_pages_within_the_budget() -> None:
    server = ApiServer([body(f"p{i}", {"x": str(i)}) for i in range(2_300)])
    everything = policy("all", namespaceSelector={}, podSelector={})
    pauses: list[int] = []
    found = scan.scan(
        server.list,
        [everything],
        {"ml": NS},
        lambda ns: False,
        budget=1_000,
        pause=lambda: bool(pauses.append(1)),
        page=250,
    )
    assert not found.complete and found.read == 1_000
    assert {page for _, _, page in server.requests} == {250}, "every request is one page"
    assert len(server.requests) == 4 and len(pauses) == 4
    whole = scan.scan(ApiServer(server.pods).list, [everything], {"ml": NS}, lambda ns: False, page=500)
    assert whole.complete and len(whole.pods["all"]) == 2_300 and whole.requests == 5


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tracker(clock: Clock, marked: list[str], burst: int = 3) -> tuple[Store, Unconfigured, list[int]]:
    store = Store()
    store.put_namespace({"metadata": {"name": "ml", "labels": NS}})
    store.put_policy(policy_body("vllm"))
    pokes: list[int] = []
    limit = TokenBucket(burst, 1.0, clock=clock)
    made = Unconfigured(store, lambda ns: False, marked.append, limit, clock=clock, poke=lambda: pokes.append(1))
    return store, made, pokes


def found_over(store: Store, pods: list[dict[str, Any]]) -> scan.Found:
    return scan.scan(ApiServer(pods).list, list(store.policies.values()), store.namespaces, lambda ns: False)


def test_warnings_are_rate_limited_then_drained_in_order_and_every_pod_is_counted() -> None:
    clock, marked = Clock(), []
    store, tracked, _ = tracker(clock, marked)
    tracked.scanned(found_over(store, [body(f"p{i}") for i in range(10)]))
    assert len(tracked.pods("vllm")) == 10 and marked == ["vllm"]
    assert [e.target["metadata"]["name"] for e in tracked.drain()] == ["p0", "p1", "p2"]
    assert tracked.drain() == []
    clock.now = 2.0  # two tokens back
    assert [e.target["metadata"]["name"] for e in tracked.drain()] == ["p3", "p4"]
    clock.now = 100.0
    tracked.scanned(found_over(store, [body(f"p{i}") for i in range(10) if i != 5]))
    assert [e.target["metadata"]["name"] for e in tracked.drain()] == ["p6", "p7", "p8"], "p5 is gone"
    clock.now = 200.0
    assert [e.target["metadata"]["name"] for e in tracked.drain()] == ["p9"]
    tracked.scanned(found_over(store, [body(f"p{i}") for i in range(10) if i != 5]))
    assert tracked.drain() == [], "each pod warned once"


def test_a_scan_cut_short_keeps_what_it_did_not_reach_and_a_whole_one_drops_the_pods_gone() -> None:
    clock, marked = Clock(), []
    store, tracked, _ = tracker(clock, marked)
    tracked.scanned(found_over(store, [body("a"), body("b")]))
    cut = found_over(store, [body("c")])
    cut.complete = False
    tracked.scanned(cut)
    assert tracked.pods("vllm") == ["ml/a", "ml/b", "ml/c"]
    tracked.scanned(found_over(store, [body("c")]))
    assert tracked.pods("vllm") == ["ml/c"]


def test_a_configured_pod_of_the_same_name_replaces_its_entry_at_once() -> None:
    clock, marked = Clock(), []
    store, tracked, _ = tracker(clock, marked)
    tracked.scanned(found_over(store, [body("web-0"), body("web-1")]))
    marked.clear()
    again = store.put_pod(body("web-0", {"app": "vllm", contract.LABEL_POD_POLICY: "vllm"}, uid="new"))
    tracked.pod_changed(again)
    assert tracked.pods("vllm") == ["ml/web-1"] and marked == ["vllm"]
    store.put_pod(body("web-1", {"app": "vllm", contract.LABEL_POD_POLICY: "vllm"}, uid="new-1"))
    assert tracked.pods("vllm") == [], "the status writer's read checks against the pod index too"


@pytest.fixture
def runtime() -> Runtime:
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:1"  # nothing here calls the API server
    made = Runtime(Settings(standalone=True, metrics_port=None), kube=Kube(cfg))
    made.store.put_namespace({"metadata": {"name": "ml", "labels": NS}})
    return made


def policy_body(name: str, generation: int = 1, **spec: Any) -> dict[str, Any]:
    spec.setdefault("podSelector", {"matchLabels": {"app": "vllm"}})
    return {"metadata": {"name": name, "generation": generation, "uid": f"uid-{name}"}, "spec": spec}


def test_a_policy_or_namespace_change_asks_for_a_scan_and_a_deleted_policy_drops_its_pods_at_once(
    runtime: Runtime,
) -> None:
    unconfigured, scanner = runtime.reconciler.unconfigured, runtime.reconciler.scanner
    feed(runtime, "policies", policy_body("vllm"))
    assert scanner._wake.is_set()
    scanner._wake.clear()
    unconfigured.scanned(found_over(runtime.store, [body("a")]))
    assert unconfigured.pods("vllm") == ["ml/a"]
    feed(runtime, "policies", policy_body("vllm"))
    assert not scanner._wake.is_set(), "its own status writes change nothing"
    feed(runtime, "namespaces", {"metadata": {"name": "ml", "labels": {**NS, "team": "b"}}})
    assert scanner._wake.is_set()
    feed(runtime, "policies", policy_body("vllm"), deleted=True)
    assert unconfigured.pods("vllm") == [] and unconfigured.count() == 0


def test_only_controller_owned_pods_are_offered_for_eviction() -> None:
    clock, marked = Clock(), []
    store, tracked, _ = tracker(clock, marked)
    tracked.scanned(found_over(store, [body("owned"), body("bare", owned=False)]))
    assert [(key[1], pod.owner) for _, key, pod in tracked.evictable()] == [("owned", ("ReplicaSet", "rs"))]


class Evictions(Kube):
    """The Eviction API: refuses (429, as a PodDisruptionBudget does) the pods named in ``guarded``."""

    def __init__(self, guarded: set[str]) -> None:
        self.guarded, self.evicted = guarded, []

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        if name in self.guarded:
            raise Unavailable("Cannot evict pod as it would violate the pod's disruption budget.")
        self.evicted.append(name)


def test_the_remedy_evicts_controller_owned_pods_within_its_rate_and_retries_what_a_budget_refuses() -> None:
    clock, marked = Clock(), []
    store, tracked, _ = tracker(clock, marked)
    pods = [body(f"p{i}") for i in range(7)] + [body("bare", owned=False), body("guarded")]
    tracked.scanned(found_over(store, pods))
    api = Evictions({"guarded"})
    recreator = Recreator(api, tracked, marked.append, TokenBucket(3, 1.0, clock=clock), clock=clock)
    events = recreator.step()
    assert api.evicted == ["p0", "p1"], "three tokens: the budget refuses the first, two evicted"
    assert [e.reason for e in events] == ["RecreatedForPolicy"] * 2 and recreator.recreated("vllm") == 2
    clock.now = 10.0
    recreator.step()
    assert len(api.evicted) == 5, "at most the burst at once"
    clock.now = 20.0
    recreator.step()
    assert "bare" not in api.evicted and "guarded" not in api.evicted and len(api.evicted) == 7
    api.guarded.clear()
    clock.now = 45.0  # past the retry of the refused one
    recreator.step()
    assert api.evicted[-1] == "guarded" and recreator.recreated("vllm") == 8
