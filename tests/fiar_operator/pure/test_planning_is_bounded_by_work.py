"""Planning one review is bounded by its work, not only by the wall clock: what planning reads is
counted before it is walked, In/NotIn are set lookups, a group's node check spends a work budget,
and a review past its budget is answered unchanged at once, freeing its thread for other tenants."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from devcluster import pki
from fiar_operator.admission.review import Admission, parse_review
from fiar_operator.admission.server import Bounds, Server
from fiar_operator.core import decide, limits, selectors
from fiar_operator.core.errors import NeedsThread, OverBudget
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.nodefacts import node_facts
from fiar_operator.core.pods import group_plan, pod_record
from fiar_operator.core.policy import LWS_SIZE, parse_policy
from fiar_operator.core.settings import Settings
from fiar_operator.state.store import Store

NODES = 1_000
MNNVL = {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_MNNVL: "pass", contract.LABEL_CLIQUE: "c1", "zone": "z"}
POLICY = {
    "metadata": {"name": "vllm", "resourceVersion": "1"},
    "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}},
}


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    selector = {"nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}


def short_values(count: int) -> list[str]:
    """Two-character values that no node label holds (the attack's: 580,000 of them fit in 2.9 MB)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return [alphabet[i % 36] + alphabet[i // 36 % 36] for i in range(count)]


def group_pod(affinity: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A dry-run-able LeaderWorkerSet pod of size 2 bound at once (``nodeName``) to an mnnvl node:
    its planning checks every node its placement admits."""
    meta = {"generateName": "attack-", "labels": {"app": "vllm"}, "annotations": {LWS_SIZE: "2"}}
    body: dict[str, Any] = {"nodeName": "gpu-0", "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}], **spec}
    if affinity is not None:
        body["affinity"] = affinity
    return {"metadata": meta, "spec": body}


def reported_attack() -> dict[str, Any]:
    """The pod of the report: one node-affinity expression of 580,000 values."""
    return group_pod(required([{"key": "zone", "operator": "NotIn", "values": short_values(580_000)}]))


def within_bounds_attack() -> dict[str, Any]:
    """A pod inside every size bound whose group check would still cost a million requirement checks."""
    return group_pod(required([{"key": "zone", "operator": "In", "values": ["z"]}] * 998))


def review_body(pod: dict[str, Any], uid: str = "u", dry_run: bool = True) -> bytes:
    request = {"uid": uid, "operation": "CREATE", "namespace": "ml", "dryRun": dry_run, "object": pod}
    doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(doc, separators=(",", ":")).encode()


def fleet() -> Store:
    store = Store()
    for i in range(NODES):
        store.put_node({"metadata": {"name": f"gpu-{i}", "resourceVersion": "1", "labels": MNNVL}})
    store.put_namespace({"metadata": {"name": "ml", "labels": {"team": "ml"}}})
    store.put_policy(POLICY)
    for kind in ("nodes", "namespaces", "policies", "pods"):
        store.synced[kind] = True
    return store


# -- the size bounds ------------------------------------------------------------------------------
def test_the_reported_pod_is_past_the_bounds_before_any_node_is_walked() -> None:
    assert limits.oversized(reported_attack()) == "580000 node-affinity values (more than 10000)"


def container(**fields: Any) -> dict[str, Any]:
    return {"name": "vllm", "image": "vllm/vllm-openai", **fields}


def plain_pod() -> dict[str, Any]:
    """An ordinary vLLM pod, not yet bound."""
    return {"metadata": {"generateName": "vllm-", "labels": {"app": "vllm"}}, "spec": {"containers": [container()]}}


def env(count: int) -> list[dict[str, str]]:
    return [{"name": f"E{i}", "value": "1"} for i in range(count)]


BOUNDS: dict[str, tuple[int, Callable[[int], dict[str, Any]]]] = {
    "node-affinity values": (
        limits.MAX_AFFINITY_VALUES,
        lambda n: group_pod(required([{"key": "zone", "operator": "NotIn", "values": short_values(n)}])),
    ),
    "env entries per container": (
        limits.MAX_ENV_PER_CONTAINER,
        lambda n: group_pod(containers=[container(env=env(n - 1), envFrom=[{"prefix": "X"}])]),
    ),
    "env entries": (
        limits.MAX_ENV,
        lambda n: group_pod(containers=[container(name=f"c{i}", env=env(n // 8)) for i in range(8)]),
    ),
    "annotations": (
        limits.MAX_ANNOTATIONS,
        lambda n: {"metadata": {"annotations": {f"a{i}": "" for i in range(n)}}, "spec": {}},
    ),
    "arguments": (
        limits.MAX_ARGUMENTS,
        lambda n: group_pod(
            containers=[container(name=f"c{i}", command=["vllm"], args=["-x"] * (n // 16 - 1)) for i in range(16)]
        ),
    ),
    "node selector and affinity expressions": (
        limits.MAX_AFFINITY_EXPRESSIONS,
        lambda n: group_pod(
            required([{"key": "zone", "operator": "Exists"}] * (n - 11)), nodeSelector={f"k{i}": "v" for i in range(10)}
        ),
    ),
    "pod-affinity terms": (
        limits.MAX_POD_AFFINITY_TERMS,
        lambda n: group_pod(
            {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k"}] * n}}
        ),
    ),
    "resource claims": (
        limits.MAX_CLAIMS,
        lambda n: group_pod(
            resourceClaims=[{"name": "imex"}] * (n - 1),
            containers=[container(resources={"claims": [{"name": "imex"}]})],
        ),
    ),
    "characters": (
        limits.MAX_CHARACTERS,
        lambda n: {
            "metadata": {"labels": {"app": "vllm", "k": "v" * (n - 10)}},
            "spec": {"containers": [{"name": "vllm", "args": ["ab"]}]},
        },
    ),
}


@pytest.mark.parametrize("bound", sorted(BOUNDS))
def test_a_pod_at_each_bound_is_planned_and_one_past_it_is_not(bound: str) -> None:
    limit, make = BOUNDS[bound]
    at, past = make(limit), make(limit + (16 if bound in ("arguments", "env entries") else 1))
    assert limits.oversized(at) is None
    reason = limits.oversized(past)
    assert reason is not None and f"{limit})" in reason and len(f"fiar: pod not configured: {reason}") <= 120


def real_inference_pod(scale: int = 1) -> dict[str, Any]:
    """A LeaderWorkerSet vLLM leader with a metrics sidecar, 60 env entries, 40 arguments, an inline
    chat template, 30 labels and a list of 200 node names; ``scale`` multiplies each count."""
    hosts = [f"gpu-node-{i:05d}" for i in range(200 * scale)]
    vllm = container(
        command=["vllm", "serve", "meta-llama/Llama-3.1-405B"],
        args=["--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}" * 100] + ["--x"] * 40 * scale,
        env=env(60 * scale),
    )
    pod = group_pod(
        required([{"key": "kubernetes.io/hostname", "operator": "In", "values": hosts}]),
        containers=[vllm, container(name="metrics", env=env(10))],
    )
    pod["metadata"]["labels"] |= {f"app.kubernetes.io/l{i}": "x" * 40 for i in range(30 * scale)}
    pod["metadata"]["annotations"] |= {f"example.com/a{i}": "y" * 200 for i in range(30 * scale)}
    return pod


def test_a_large_real_inference_pod_stays_far_inside_every_bound() -> None:
    assert limits.oversized(real_inference_pod()) is None
    assert limits.oversized(real_inference_pod(scale=10)) is None  # ten times as large still passes


# -- set lookups ----------------------------------------------------------------------------------
class Counted(str):
    """A value that counts how often it is compared."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return super().__eq__(other)

    __hash__ = str.__hash__


@pytest.mark.parametrize("operator", ["In", "NotIn"])
def test_in_and_not_in_look_a_label_up_without_scanning_the_values(operator: str) -> None:
    values = [Counted(v) for v in short_values(10_000)]
    requirement = selectors.parse_requirement({"key": "zone", "operator": operator, "values": values}, "t")
    Counted.compared = 0
    for _ in range(100):
        assert requirement.matches({"zone": "z"}) is (operator == "NotIn")
        assert requirement.matches({"zone": "ab"}) is (operator == "In")
    assert Counted.compared <= 200  # one per lookup that finds its value, not one per value
    assert requirement == selectors.Requirement("zone", operator, tuple(values))


# -- the work budget ------------------------------------------------------------------------------
def test_a_budget_runs_out_past_its_steps_or_its_deadline() -> None:
    budget = limits.Budget(steps=10)
    budget.spend(10)
    with pytest.raises(OverBudget, match="budget of 10"):
        budget.spend()
    now = [0.0]
    timed = limits.Budget(steps=None, deadline=1.0, clock=lambda: now[0])
    timed.spend(10**9)
    now[0] = 1.5
    with pytest.raises(OverBudget, match="deadline"):
        timed.spend()
    limits.unbounded().spend(10**12)


def group(pod: dict[str, Any]) -> decide.GroupPlan:
    return group_plan(pod_record(pod), parse_policy(POLICY))


def test_a_groups_node_check_spends_its_budget_per_node_and_requirement() -> None:
    store = fleet()
    plan = group(group_pod(required([{"key": "zone", "operator": "In", "values": ["z"]}] * 4)))
    budget = limits.Budget()
    choice = decide.choose_for_group(parse_policy(POLICY), None, plan, store.nodes, budget)
    assert choice == ("auto", "NodeUnknown") and budget.spent == 0  # nothing to check: no node walked
    facts = node_facts("gpu-0", MNNVL)
    decide.choose_for_group(parse_policy(POLICY), facts, plan, store.nodes, budget)
    assert budget.spent == NODES * (1 + 4)
    with pytest.raises(OverBudget):
        decide.choose_for_group(parse_policy(POLICY), facts, plan, store.nodes, limits.Budget(steps=NODES * 5 - 1))


def test_a_groups_node_check_stops_at_the_first_node_that_breaks_the_rule() -> None:
    store = fleet()
    store.put_node({"metadata": {"name": "gpu-1", "resourceVersion": "2", "labels": {"zone": "z"}}})
    plan = group(group_pod(required([{"key": "zone", "operator": "Exists"}])))
    budget = limits.Budget()
    facts = node_facts("gpu-0", MNNVL)
    assert (
        decide.choose_for_group(parse_policy(POLICY), facts, plan, store.nodes, budget)[1] == "MultiNodeNoSharedClique"
    )
    assert budget.spent == 2 * 2  # gpu-0 kept the rule, gpu-1 broke it: two nodes of a thousand walked


def test_a_review_past_its_budget_is_allowed_unchanged_with_a_warning_and_leaves_nothing() -> None:
    store = fleet()
    admission = Admission(store, Metrics(store.sizes))
    answer = admission.pod_create(parse_review(review_body(within_bounds_attack(), dry_run=False)), can_read=False)
    assert isinstance(answer, dict)
    response = answer["response"]
    assert response["allowed"] and "patch" not in response
    assert response["warnings"] == [
        "fiar: pod not configured: planning passed its budget of 200000 node and requirement checks"
    ]
    assert admission.metrics.admissions.labels("pods", "over_budget")._value.get() == 1
    assert store.sizes()["admission_memo"] == 0
    ordinary = admission.pod_create(parse_review(review_body(group_pod(), dry_run=False)), can_read=False)
    assert isinstance(ordinary, dict) and "patch" in ordinary["response"]  # the same fleet, planned in full


def test_a_binding_past_its_budget_is_allowed_unchanged() -> None:
    store = fleet()
    pod = within_bounds_attack()
    pod["metadata"] |= {
        "name": "big-0",
        "namespace": "ml",
        "uid": "big-uid",
        "labels": {"app": "vllm", "fiar.io/policy": "vllm"},
    }
    del pod["spec"]["nodeName"]
    store.put_pod(pod)  # as the informer lists it
    admission = Admission(store, Metrics(store.sizes))
    request = {
        "uid": "b",
        "operation": "CREATE",
        "subResource": "binding",
        "namespace": "ml",
        "name": "big-0",
        "object": {"metadata": {"name": "big-0", "uid": "big-uid"}, "target": {"name": "gpu-0"}},
    }
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()
    answer = admission.binding(parse_review(body), can_read=False)
    assert isinstance(answer, dict) and "patch" not in answer["response"]
    assert admission.metrics.admissions.labels("binding", "over_budget")._value.get() == 1


# -- the webhook server at 1,000 nodes ------------------------------------------------------------
@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, ssl.SSLContext]]:
    ca = pki.CertificateAuthority()
    crt, key = ca.issue("fiar", hosts=("127.0.0.1",)).write(tmp_path, "serving")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    store = fleet()
    metrics = Metrics(store.sizes)
    settings = Settings(
        webhook_host="127.0.0.1", webhook_port=0, tls_cert=crt, tls_key=key, metrics_host="127.0.0.1", metrics_port=0
    )
    server = Server(Admission(store, metrics), metrics, settings, None, lambda: store.synced)
    server.start()
    yield server, ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    server.stop()


def post(server: Server, context: ssl.SSLContext, body: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=30)
    try:
        conn.request("POST", "/mutate/pods", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def healthz(server: Server) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=5)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("attack", [reported_attack, within_bounds_attack], ids=["reported", "within-bounds"])
def test_attack_reviews_end_within_their_budget_and_ordinary_reviews_beside_them_are_configured(
    served: tuple[Server, ssl.SSLContext], attack: Callable[[], dict[str, Any]]
) -> None:
    server, context = served
    hostile = review_body(attack(), uid="attack")
    ordinary = review_body(plain_pod(), "ok")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        attacks = [pool.submit(post, server, context, hostile) for _ in range(2 * server.bounds.workers)]
        answers = [post(server, context, ordinary) for _ in range(10)]
        health = [healthz(server) for _ in range(5)]
        hostile_answers = [a.result() for a in attacks]
    for status, answer in hostile_answers:
        assert status == 200 and answer["response"]["allowed"] and "patch" not in answer["response"]
        assert answer["response"]["warnings"][0].startswith("fiar: pod not configured: ")
    for status, answer in answers:
        assert status == 200 and "patch" in answer["response"]  # configured, not answered on the deadline
    assert health == [200] * 5
    assert server.metrics.admissions.labels("pods", "deadline")._value.get() == 0


class Endless(Admission):
    """Planning that never ends by itself for the review with uid ``endless``: it only spends its budget."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        super().__init__(store, metrics)
        self.stopped = threading.Event()

    def pod_create(
        self, review: Any, fetched: Any = None, can_read: bool = True, budget: limits.Budget | None = None
    ) -> Any:
        if review.uid == "endless":
            assert budget is not None
            try:
                while True:
                    budget.spend(0)
            except OverBudget:
                self.stopped.set()
                raise
        return super().pod_create(review, fetched, can_read, budget)


def test_a_review_answered_on_its_deadline_stops_planning_and_frees_its_thread(tmp_path: Path) -> None:
    ca = pki.CertificateAuthority()
    crt, key = ca.issue("fiar", hosts=("127.0.0.1",)).write(tmp_path, "serving")
    store = fleet()
    metrics = Metrics(store.sizes)
    settings = Settings(
        webhook_host="127.0.0.1", webhook_port=0, tls_cert=crt, tls_key=key, metrics_host="127.0.0.1", metrics_port=0
    )
    admission = Endless(store, metrics)
    server = Server(admission, metrics, settings, None, lambda: store.synced, Bounds(work_deadline=0.3, workers=1))
    server.start()
    try:
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())
        status, answer = post(server, context, review_body(group_pod(), uid="endless"))
        assert status == 200 and "patch" not in answer["response"]
        assert admission.stopped.wait(5)  # the one review thread gave the review up
        plain = {
            "metadata": {"generateName": "vllm-", "labels": {"app": "vllm"}},
            "spec": {"containers": [container()]},
        }
        status, answer = post(server, context, review_body(plain, uid="next"))
        assert status == 200 and "patch" in answer["response"]  # and planned the next one
    finally:
        server.stop()


# -- bindings on the event loop ---------------------------------------------------------------------
def binding_body(name: str, uid: str, node: str = "gpu-0") -> bytes:
    request = {
        "uid": f"review-{name}",
        "operation": "CREATE",
        "namespace": "ml",
        "name": name,
        "subResource": "binding",
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "object": {"metadata": {"name": name, "namespace": "ml", "uid": uid}, "target": {"kind": "Node", "name": node}},
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def indexed_pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    labels = {"app": "vllm", contract.LABEL_POD_POLICY: "vllm"}
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels, "annotations": annotations}
    return {"metadata": meta, "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}}


class Holding(Admission):
    """Admission whose CREATE review with uid ``hold`` takes a planning step (so that it goes to a
    review thread) and keeps that thread until ``release``."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        super().__init__(store, metrics)
        self.release, self.holding = threading.Event(), threading.Event()

    def pod_create(
        self, review: Any, fetched: Any = None, can_read: bool = True, budget: limits.Budget | None = None
    ) -> Any:
        if review.uid == "hold":
            assert budget is not None
            budget.spend(1)
            self.holding.set()
            self.release.wait(10)
        return super().pod_create(review, fetched, can_read, budget)


def test_a_single_pods_create_and_binding_are_answered_while_every_review_thread_is_busy(tmp_path: Path) -> None:
    """A single pod's CREATE and binding take no planning step: the event loop answers them. A group's
    binding walks the candidate nodes, so it goes to a review thread, and waits for one; each gets the
    answer a review thread with a whole budget gives."""
    ca = pki.CertificateAuthority()
    crt, key = ca.issue("fiar", hosts=("127.0.0.1",)).write(tmp_path, "serving")
    store = fleet()
    store.put_pod(indexed_pod("single", {}))
    store.put_pod(indexed_pod("grp", {LWS_SIZE: "2"}))
    metrics = Metrics(store.sizes)
    settings = Settings(
        webhook_host="127.0.0.1", webhook_port=0, tls_cert=crt, tls_key=key, metrics_host="127.0.0.1", metrics_port=0
    )
    admission = Holding(store, metrics)
    expected = {
        name: admission.binding(parse_review(binding_body(name, f"uid-{name}")), can_read=False)
        for name in ("single", "grp")
    }
    plain = {"metadata": {"generateName": "vllm-", "labels": {"app": "vllm"}}, "spec": {"containers": [container()]}}
    expected["create"] = admission.pod_create(parse_review(review_body(plain, uid="create")), can_read=False)
    with pytest.raises(NeedsThread):
        admission.binding(parse_review(binding_body("grp", "uid-grp")), can_read=False, budget=limits.OnLoop())
    server = Server(admission, metrics, settings, None, lambda: store.synced, Bounds(workers=1, work_deadline=5.0))
    server.start()
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())

    def send(path: str, body: bytes) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=30)
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            held = pool.submit(send, "/mutate/pods", review_body(group_pod(), uid="hold"))
            assert admission.holding.wait(5)
            group = pool.submit(send, "/mutate/binding", binding_body("grp", "uid-grp"))
            assert send("/mutate/binding", binding_body("single", "uid-single")) == (200, expected["single"])
            assert "patch" in expected["single"]["response"]
            assert send("/mutate/pods", review_body(plain, uid="create")) == (200, expected["create"])
            assert "patch" in expected["create"]["response"]
            assert not group.done()  # behind the held review, on the one review thread
            admission.release.set()
            assert group.result(10) == (200, expected["grp"]) and held.result(10)[0] == 200
    finally:
        admission.release.set()
        server.stop()
