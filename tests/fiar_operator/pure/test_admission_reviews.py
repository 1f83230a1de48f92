"""AdmissionReview handling from memory: envelopes, pod CREATE, and bindings found by every route."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

import fiar_contract as contract
from fiar_operator.admission.review import Admission, Need, parse_review
from fiar_operator.core import patches
from fiar_operator.core.errors import ReviewError
from fiar_operator.core.metrics import Metrics
from fiar_operator.state.store import Store

POLICY = {
    "metadata": {"name": "vllm", "resourceVersion": "1"},
    "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}, "namespaceSelector": {"matchLabels": {"gpu": "yes"}}},
}


@pytest.fixture
def store() -> Store:
    s = Store()
    s.put_policy(POLICY)
    s.put_namespace({"metadata": {"name": "ml", "labels": {"gpu": "yes"}}})
    s.put_namespace({"metadata": {"name": "web", "labels": {}}})
    s.put_node({"metadata": {"name": "gpu-a", "resourceVersion": "5", "labels": {contract.LABEL_BACKEND: "mnnvl"}}})
    s.put_node({"metadata": {"name": "gpu-b", "resourceVersion": "5", "labels": {contract.LABEL_BACKEND: "none"}}})
    return s


@pytest.fixture
def admission(store: Store) -> Admission:
    return Admission(store, Metrics(store.sizes), clock=lambda: "2026-05-01T10:00:00Z")


def review(request: dict[str, Any]) -> bytes:
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "r-1", **request}}
    ).encode()


def create(
    namespace: str = "ml",
    labels: dict[str, str] | None = None,
    dry_run: bool = False,
    name: str | None = None,
    containers: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> bytes:
    meta: dict[str, Any] = {"labels": labels if labels is not None else {"app": "vllm"}}
    meta.update({"name": name} if name else {"generateName": "vllm-7d9f-"})
    if annotations is not None:
        meta["annotations"] = annotations
    return review(
        {
            "operation": "CREATE",
            "namespace": namespace,
            "dryRun": dry_run,
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": {"metadata": meta, "spec": {"containers": containers or [{"name": "vllm"}]}},
        }
    )


def bind(name: str, node: str = "gpu-a", namespace: str = "ml", uid: str = "u-1") -> bytes:
    return review(
        {
            "operation": "CREATE",
            "namespace": namespace,
            "name": name,
            "subResource": "binding",
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": {
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "target": {"kind": "Node", "name": node},
            },
        }
    )


def ops(answer: Any) -> list[dict[str, Any]]:
    assert isinstance(answer, dict)
    response = answer["response"]
    assert response["uid"] == "r-1" and response["allowed"] is True
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    decoded: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return decoded


def binding_annotations(answer: Any) -> dict[str, str]:
    applied = patches.apply({"metadata": {}}, ops(answer))
    annotations: dict[str, str] = applied["metadata"].get("annotations", {})
    return annotations


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"kind": "Pod"}', "kind must be AdmissionReview"),
        (b'{"kind": "AdmissionReview", "apiVersion": "v9"}', "apiVersion"),
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}', "no request"),
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": ""}}', "uid"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_malformed_envelopes_raise_review_errors(body: bytes, message: str) -> None:
    with pytest.raises(ReviewError, match=message):
        parse_review(body)


@pytest.mark.parametrize(
    "request_",
    [
        {"operation": "CREATE"},
        {"operation": "CREATE", "object": "pod"},
        {"operation": "DELETE", "object": {}},
        {"operation": "CREATE", "object": {"metadata": None, "spec": None}, "namespace": "ml"},
        {
            "operation": "CREATE",
            "object": {"metadata": {"labels": {"app": "vllm"}}, "spec": {"containers": "x"}},
            "namespace": "ml",
        },
    ],
    ids=["no-object", "object-not-dict", "delete", "null-fields", "containers-not-list"],
)
def test_partial_pod_reviews_are_allowed_unchanged(admission: Admission, request_: dict[str, Any]) -> None:
    assert ops(admission.pod_create(parse_review(review(request_)))) == []


def test_partial_binding_reviews_are_allowed_unchanged(admission: Admission) -> None:
    for request_ in (
        {"subResource": "binding", "operation": "CREATE", "object": {"target": {}}},
        {
            "subResource": "binding",
            "operation": "CREATE",
            "namespace": "ml",
            "name": "x",
            "object": {"metadata": {}, "target": {"name": 7}},
        },
        {"subResource": "status", "operation": "CREATE", "object": {}},
    ):
        assert ops(admission.binding(parse_review(review(request_)))) == []


def test_response_keeps_the_request_api_version(admission: Admission) -> None:
    body = json.loads(create())
    body["apiVersion"] = "admission.k8s.io/v1beta1"
    answer = admission.pod_create(parse_review(json.dumps(body).encode()))
    assert isinstance(answer, dict) and answer["apiVersion"] == "admission.k8s.io/v1beta1"


def test_binding_of_a_pod_admitted_here_is_decided_from_memory(admission: Admission, store: Store) -> None:
    assert ops(admission.pod_create(parse_review(create())))
    annotations = binding_annotations(admission.binding(parse_review(bind("vllm-7d9f-x2k4q"))))
    assert annotations[contract.ANNOTATION_POD_BACKEND] == "mnnvl"
    decision = json.loads(annotations[contract.ANNOTATION_POD_DECISION])
    assert decision == {
        "backend": "mnnvl",
        "fusion": "on",
        "guard": False,
        "node": "gpu-a",
        "nodeVerdict": "mnnvl",
        "policy": "vllm",
        "reason": "Verified",
        "trigger": "binding",
        "time": "2026-05-01T10:00:00Z",
    }
    assert store.sizes()["admission_memo"] == 1


def test_binding_to_an_unverified_node_gets_the_fallback(admission: Admission) -> None:
    admission.pod_create(parse_review(create(name="solo")))
    annotations = binding_annotations(admission.binding(parse_review(bind("solo", node="gpu-b"))))
    assert annotations[contract.ANNOTATION_POD_BACKEND] == "auto"
    assert json.loads(annotations[contract.ANNOTATION_POD_DECISION])["reason"] == "NotVerified"


def test_binding_of_a_pod_seen_by_the_watch_uses_the_index(admission: Admission, store: Store) -> None:
    store.put_pod(
        {
            "metadata": {
                "name": "seen",
                "namespace": "ml",
                "uid": "u-1",
                "labels": {"app": "vllm", contract.LABEL_POD_POLICY: "vllm"},
            },
            "spec": {},
        }
    )
    annotations = binding_annotations(admission.binding(parse_review(bind("seen"))))
    assert annotations[contract.ANNOTATION_POD_BACKEND] == "mnnvl"


def test_binding_of_a_pod_labelled_with_a_policy_that_does_not_select_it_changes_nothing(
    admission: Admission, store: Store
) -> None:
    """A tenant may label its own pods with any policy's name: the label counts only where that
    policy selects the pod (here: app=web in namespace ml, and app=vllm in namespace web)."""
    for namespace, labels in (("ml", {"app": "web"}), ("web", {"app": "vllm"})):
        store.put_pod({"metadata": {"name": "forged", "namespace": namespace, "uid": "u-2",
                                    "labels": {**labels, contract.LABEL_POD_POLICY: "vllm"}}, "spec": {}})
        assert ops(admission.binding(parse_review(bind("forged", namespace=namespace, uid="u-2")))) == []
        assert store.pods_of_policy("vllm") == []


def test_unmanaged_pods_pass_untouched_without_a_read(admission: Admission) -> None:
    admission.pod_create(parse_review(create(labels={"app": "web"})))
    assert ops(admission.binding(parse_review(bind("vllm-7d9f-abcde")))) == []
    assert ops(admission.binding(parse_review(bind("anything", namespace="web")))) == []


def test_unknown_pod_in_a_covered_namespace_asks_for_a_bounded_read(admission: Admission) -> None:
    first = admission.binding(parse_review(bind("stranger")))
    assert first == Need("pod", "ml", "stranger")
    fetched = {
        "kind": "Pod",
        "metadata": {
            "name": "stranger",
            "namespace": "ml",
            "uid": "u-1",
            "labels": {"app": "vllm", contract.LABEL_POD_POLICY: "vllm"},
        },
        "spec": {},
    }
    again = admission.binding(parse_review(bind("stranger")), fetched=fetched, can_read=False)
    assert binding_annotations(again)[contract.ANNOTATION_POD_BACKEND] == "mnnvl"
    failed = admission.binding(parse_review(bind("gone")), fetched=None, can_read=False)
    assert ops(failed) == []


def test_stale_index_entry_of_a_same_named_pod_is_not_trusted(admission: Admission, store: Store) -> None:
    store.put_pod({"metadata": {"name": "lws-0", "namespace": "ml", "uid": "old", "labels": {}}, "spec": {}})
    assert admission.binding(parse_review(bind("lws-0", uid="new"))) == Need("pod", "ml", "lws-0")


def test_dry_run_leaves_no_trace(admission: Admission, store: Store) -> None:
    assert ops(admission.pod_create(parse_review(create(dry_run=True))))
    assert store.sizes()["admission_memo"] == 0


def test_unknown_namespace_is_read_once_when_a_selector_needs_its_labels(admission: Admission, store: Store) -> None:
    body = parse_review(create(namespace="fresh"))
    assert admission.pod_create(body) == Need("namespace", "fresh")
    fresh = {"kind": "Namespace", "metadata": {"name": "fresh", "labels": {"gpu": "yes"}}}
    answer = admission.pod_create(body, fetched=fresh)
    assert ops(answer) and store.namespaces["fresh"] == {"gpu": "yes"}


def test_ignored_namespace_is_never_managed(admission: Admission, store: Store) -> None:
    store.put_namespace({"metadata": {"name": "ml", "labels": {"gpu": "yes", contract.NAMESPACE_IGNORE_LABEL: ""}}})
    assert ops(admission.pod_create(parse_review(create()))) == []


def test_no_policies_means_no_work(store: Store) -> None:
    store.delete_policy("vllm")
    admission = Admission(store, Metrics())
    assert ops(admission.pod_create(parse_review(create()))) == []
    assert ops(admission.binding(parse_review(bind("x")))) == []


def test_warnings_reach_the_client(admission: Admission) -> None:
    body = json.loads(create())
    body["request"]["object"]["spec"]["containers"] = [
        {"name": "vllm", "env": [{"name": contract.ENV_VAR, "value": "trtllm"}]}
    ]
    answer = admission.pod_create(parse_review(json.dumps(body).encode()))
    assert isinstance(answer, dict)
    assert any(w.startswith("fiar: ") and "left alone" in w for w in answer["response"]["warnings"])


EXCLUDING = {
    "metadata": {"name": "all-but-secret", "resourceVersion": "1"},
    "spec": {
        "podSelector": {"matchLabels": {"app": "vllm"}},
        "namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["secret"]}]},
    },
}


def admissions(answer_metrics: Metrics, result: str) -> float:
    value = answer_metrics.registry.get_sample_value(
        "fiar_admission_requests_total", {"webhook": "pods", "result": result}
    )
    return float(value or 0.0)


def test_pod_in_a_namespace_whose_labels_cannot_be_read_is_left_alone(admission: Admission, store: Store) -> None:
    store.put_policy(EXCLUDING)
    body = parse_review(create(namespace="vault"))
    assert admission.pod_create(body) == Need("namespace", "vault")
    answer = admission.pod_create(body, fetched=None, can_read=False)
    assert ops(answer) == []
    assert isinstance(answer, dict) and any("vault unknown" in w for w in answer["response"]["warnings"])
    assert admissions(admission.metrics, "namespace_unknown") == 1
    assert ops(admission.binding(parse_review(bind("vllm-7d9f-x2k4q", namespace="vault")))) == []
    secret = {"kind": "Namespace", "metadata": {"name": "vault", "labels": {"tier": "secret"}}}
    assert ops(admission.pod_create(body, fetched=secret, can_read=False)) == []
    assert admissions(admission.metrics, "unmanaged") == 1


def test_policy_for_every_namespace_takes_pods_of_unindexed_namespaces_without_a_read(store: Store) -> None:
    store.delete_policy("vllm")
    store.put_policy({"metadata": {"name": "everywhere"}, "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}}})
    answer = Admission(store, Metrics()).pod_create(parse_review(create(namespace="fresh")), can_read=False)
    applied = patches.apply(json.loads(create())["request"]["object"], ops(answer))
    assert applied["metadata"]["labels"][contract.LABEL_POD_POLICY] == "everywhere"


def test_namespace_labels_are_not_needed_when_no_policy_could_take_the_pod(admission: Admission) -> None:
    answer = admission.pod_create(parse_review(create(namespace="fresh", labels={"app": "web"})))
    assert ops(answer) == []


INJECTED = {
    "name": contract.ENV_VAR,
    "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['fiar.io/backend']"}},
}


@pytest.mark.parametrize(
    ("namespace", "labels", "containers"),
    [
        ("web", {"app": "vllm"}, [{"name": "vllm", "env": [INJECTED]}]),
        ("ml", {"app": "other"}, [{"name": "vllm", "env": [INJECTED]}]),
        ("ml", {"app": "other"}, [{"name": "main"}, {"name": "vllm", "env": [{"name": "A", "value": "1"}, INJECTED]}]),
    ],
    ids=["uncovered-namespace", "no-policy-selects-the-pod", "second-container"],
)
def test_unmanaged_pod_that_reads_the_backend_annotation_gets_auto(
    admission: Admission, namespace: str, labels: dict[str, str], containers: list[dict[str, Any]]
) -> None:
    answer = admission.pod_create(parse_review(create(namespace, labels, containers=containers)))
    assert ops(answer) == [
        {"op": "add", "path": "/metadata/annotations", "value": {contract.ANNOTATION_POD_BACKEND: "auto"}}
    ]
    assert admissions(admission.metrics, "defaulted") == 1


def test_pod_reading_the_backend_annotation_gets_auto_when_there_are_no_policies(store: Store) -> None:
    store.delete_policy("vllm")
    admission = Admission(store, Metrics())
    body = create(containers=[{"name": "vllm", "env": [INJECTED]}], annotations={"team": "a"})
    applied = patches.apply(json.loads(body)["request"]["object"], ops(admission.pod_create(parse_review(body))))
    assert applied["metadata"]["annotations"] == {"team": "a", contract.ANNOTATION_POD_BACKEND: "auto"}
    assert contract.LABEL_POD_POLICY not in applied["metadata"]["labels"]


def test_pod_whose_containers_the_policy_does_not_select_gets_auto_without_the_policy_label(
    admission: Admission, store: Store
) -> None:
    store.put_policy({**POLICY, "spec": {**POLICY["spec"], "containers": ["worker-*"]}})
    body = create(containers=[{"name": "vllm", "env": [INJECTED]}])
    applied = patches.apply(json.loads(body)["request"]["object"], ops(admission.pod_create(parse_review(body))))
    assert applied["metadata"]["annotations"] == {contract.ANNOTATION_POD_BACKEND: "auto"}
    assert contract.LABEL_POD_POLICY not in applied["metadata"]["labels"]


def test_backend_annotation_already_set_is_kept(admission: Admission) -> None:
    body = create("web", containers=[{"name": "vllm", "env": [INJECTED]}], annotations={"fiar.io/backend": "trtllm"})
    assert ops(admission.pod_create(parse_review(body))) == []


def test_managed_pod_with_the_injected_entry_gets_its_policy_not_auto(admission: Admission) -> None:
    body = create(containers=[{"name": "vllm", "env": [INJECTED]}])
    applied = patches.apply(json.loads(body)["request"]["object"], ops(admission.pod_create(parse_review(body))))
    assert applied["metadata"]["labels"][contract.LABEL_POD_POLICY] == "vllm"
    assert applied["metadata"]["annotations"][contract.ANNOTATION_POD_BACKEND] == "auto"
    assert json.loads(applied["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])["reason"] == "Pending"
