"""Forged or absurd AdmissionReviews (anyone on the pod network can send them) cost bounded work,
leave bounded state, and cannot steer what real pods get."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

import fiar_contract as contract
from fiar_operator.admission.review import Admission, Need, parse_review
from fiar_operator.core import limits
from fiar_operator.core.errors import ApiError, ReviewError
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.names import is_namespace_name, is_pod_name
from fiar_operator.state.kube import Kube
from fiar_operator.state.store import MEMO_BYTES, MEMO_TTL, Store

POLICY = {
    "metadata": {"name": "vllm", "resourceVersion": "1"},
    "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}, "namespaceSelector": {"matchLabels": {"gpu": "yes"}}},
}
OTHER = {
    "metadata": {"name": "other", "resourceVersion": "1"},
    "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "backends": ["trtllm"]},
}


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


@pytest.fixture
def store(clock: list[float]) -> Store:
    s = Store(clock=lambda: clock[0])
    s.put_policy(POLICY)
    s.put_policy(OTHER)
    s.put_namespace({"metadata": {"name": "ml", "labels": {"gpu": "yes"}}})
    s.put_node({"metadata": {"name": "gpu-a", "resourceVersion": "5", "labels": {contract.LABEL_BACKEND: "mnnvl"}}})
    return s


@pytest.fixture
def admission(store: Store) -> Admission:
    return Admission(store, Metrics(store.sizes))


def create(
    namespace: str = "ml", labels: dict[str, str] | None = None, generate: str = "vllm-7d9f-", **spec: Any
) -> Any:
    meta = {"generateName": generate, "labels": labels if labels is not None else {"app": "vllm"}}
    request = {
        "uid": "r",
        "operation": "CREATE",
        "namespace": namespace,
        "object": {"metadata": meta, "spec": {"containers": [{"name": "vllm"}], **spec}},
    }
    return parse_review(
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    )


def bind(name: str, namespace: str = "ml") -> Any:
    request = {
        "uid": "b",
        "operation": "CREATE",
        "subResource": "binding",
        "namespace": namespace,
        "name": name,
        "object": {"metadata": {"name": name, "uid": "pod-uid"}, "target": {"name": "gpu-a"}},
    }
    return parse_review(
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    )


def test_pods_with_absurd_label_or_container_counts_are_admitted_unchanged_and_not_remembered(
    admission: Admission, store: Store
) -> None:
    absurd = create(labels={f"l{i}": "v" for i in range(60_000)} | {"app": "vllm"})
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(12):
        answer = admission.pod_create(absurd)
        assert isinstance(answer, dict) and "patch" not in answer["response"]
        assert "labels (more than" in answer["response"]["warnings"][0]
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert store.sizes()["admission_memo"] == 0 and kept < 1024 * 1024
    containers = [{"name": f"c{i}"} for i in range(limits.MAX_CONTAINERS + 1)]
    answer = admission.pod_create(create(containers=containers))
    assert isinstance(answer, dict) and "containers (more than" in answer["response"]["warnings"][0]


def test_the_memo_is_bounded_by_bytes_and_expires_on_insert(
    admission: Admission, store: Store, clock: list[float]
) -> None:
    selector = {f"zone-{i:03d}": "z" * 60 for i in range(80)}  # about 14 KiB kept per entry
    labels = {"app": "vllm"} | {f"l{i}": "v" * 60 for i in range(100)}
    for i in range(3_000):
        admission.pod_create(create(generate=f"vllm-{i:06d}-", labels=labels, nodeSelector=selector))
    assert 0 < store.memo_bytes() <= MEMO_BYTES
    assert 1_000 < store.sizes()["admission_memo"] < 3_000  # the oldest were dropped
    entry = store.recall("ml", "vllm-002999-abcde")
    assert entry is not None and entry.policy == "vllm" and dict(entry.labels) == {}  # only what a binding needs
    clock[0] += MEMO_TTL + 1
    admission.pod_create(create(generate="late-"))
    assert store.sizes()["admission_memo"] == 1


def test_a_forged_create_cannot_change_what_a_generated_pod_gets_at_binding(admission: Admission, store: Store) -> None:
    admission.pod_create(create())  # the real ReplicaSet's pod
    forged = create(labels={"app": "web"})  # same generateName, another policy
    admission.pod_create(forged)
    assert store.recall("ml", "vllm-7d9f-x2k4q") is None  # two claims on one key: the memo answers nothing
    assert admission.binding(bind("vllm-7d9f-x2k4q")) == Need("pod", "ml", "vllm-7d9f-x2k4q")
    admission.pod_create(create())
    assert store.recall("ml", "vllm-7d9f-x2k4q") is None  # and a later claim does not restore one


@pytest.mark.parametrize("namespace", ["attacker/pods/prod", "../kube-system", "prod?watch=1", "a" * 64, "Prod"])
def test_a_forged_namespace_name_is_neither_read_nor_remembered(
    admission: Admission, store: Store, namespace: str
) -> None:
    store.put_policy({**POLICY, "metadata": {"name": "vllm", "resourceVersion": "2"}})
    answer = admission.pod_create(create(namespace=namespace))
    assert isinstance(answer, dict) and "patch" not in answer["response"]
    assert store.sizes()["admission_memo"] == 0
    answer = admission.binding(bind("vllm-0", namespace=namespace))
    assert isinstance(answer, dict) and "patch" not in answer["response"]


def test_a_read_answer_that_is_not_the_object_asked_for_is_not_indexed(admission: Admission, store: Store) -> None:
    body = create(namespace="fresh")
    assert admission.pod_create(body) == Need("namespace", "fresh")
    pod_named_fresh = {"kind": "Pod", "metadata": {"name": "fresh", "namespace": "attacker", "labels": {"a": "b"}}}
    admission.pod_create(body, fetched=pod_named_fresh, can_read=False)
    assert "fresh" not in store.namespaces
    other_pod = {"kind": "Pod", "metadata": {"name": "other", "namespace": "ml", "uid": "pod-uid", "labels": {}}}
    assert "patch" not in admission.binding(bind("vllm-0"), fetched=other_pod, can_read=False)["response"]  # type: ignore[index]
    assert ("ml", "other") not in store.pods


def test_names_are_checked_before_any_request() -> None:
    assert is_namespace_name("prod") and not is_namespace_name("attacker/pods/prod") and not is_namespace_name("")
    assert is_pod_name("vllm-0.a") and not is_pod_name("a/b") and not is_pod_name("a" * 254)
    kube = Kube(Unreachable())
    with pytest.raises(ApiError, match="not a namespace name"):
        kube.get_namespace("attacker/pods/prod")
    with pytest.raises(ApiError, match="not a pod name"):
        kube.get_pod("ml", "x/../../secrets/y")


def test_deep_json_is_a_review_error() -> None:
    with pytest.raises(ReviewError, match="deeply"):
        parse_review(b"[" * 100_000 + b"]" * 100_000)


class Unreachable:
    """Client settings whose every request would fail (the checks must come before any request)."""

    host = "https://127.0.0.1:1"
    verify_ssl = False
    ssl_ca_cert = cert_file = key_file = None

    def get_api_key_with_prefix(self, _name: str) -> None:
        return None
