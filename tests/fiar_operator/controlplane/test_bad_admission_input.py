"""Malformed or partial AdmissionReview bodies get a 400 or a valid allow-all answer; the operator
keeps serving."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fiar_contract as contract

pytestmark = pytest.mark.controlplane

ENVELOPE = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}

BAD_REQUESTS = [
    b"",
    b"not json at all",
    b"\x00\xff\xfe",
    b"[1, 2, 3]",
    b'"AdmissionReview"',
    json.dumps({"kind": "AdmissionReview"}).encode(),
    json.dumps({**ENVELOPE}).encode(),
    json.dumps({**ENVELOPE, "request": "nope"}).encode(),
    json.dumps({**ENVELOPE, "request": {"operation": "CREATE"}}).encode(),
    json.dumps({**ENVELOPE, "request": {"uid": 42}}).encode(),
]

PARTIAL_REQUESTS = [
    {"uid": "u1"},
    {"uid": "u2", "operation": "CREATE", "object": None},
    {"uid": "u3", "operation": "CREATE", "namespace": "x", "object": {"metadata": "oops", "spec": []}},
    {
        "uid": "u4",
        "operation": "CREATE",
        "namespace": "x",
        "object": {"metadata": {"labels": {"app": 1}}, "spec": {"containers": [None, 3, {"env": "x"}]}},
    },
    {
        "uid": "u5",
        "operation": "CREATE",
        "subResource": "binding",
        "name": "p",
        "namespace": "x",
        "object": {"target": None},
    },
    {
        "uid": "u6",
        "operation": "CREATE",
        "subResource": "binding",
        "name": "p",
        "namespace": "x",
        "object": {"metadata": {"uid": []}, "target": {"name": "n"}},
    },
]


@pytest.mark.parametrize("path", ["/mutate/pods", "/mutate/binding"])
def test_malformed_bodies_get_400_with_a_reason(operator: Any, path: str) -> None:
    for body in BAD_REQUESTS:
        status, answer = operator.post(path, body)
        assert status == 400, body
        assert isinstance(answer, dict) and answer["error"]
    assert operator.ready()


@pytest.mark.parametrize("path", ["/mutate/pods", "/mutate/binding"])
def test_partial_reviews_are_allowed_unchanged(operator: Any, path: str) -> None:
    for request in PARTIAL_REQUESTS:
        status, answer = operator.post(path, json.dumps({**ENVELOPE, "request": request}).encode())
        assert status == 200
        assert answer["kind"] == "AdmissionReview" and answer["apiVersion"] == ENVELOPE["apiVersion"]
        assert answer["response"]["uid"] == request["uid"] and answer["response"]["allowed"] is True
        assert "patch" not in answer["response"]
    assert operator.counter("fiar_admission_requests_total", result="error") == 0


def test_oversized_body_is_refused_and_the_operator_keeps_mutating(operator: Any, kit: Any, namespace: str) -> None:
    status, _ = operator.post("/mutate/pods", b"{" + b" " * (9 * 1024 * 1024) + b"}")
    assert status == 413
    kit.policy(f"after-{kit.unique}", namespace)
    created = kit.pod(namespace, "still-served", nodeName="nowhere")
    assert created["metadata"]["annotations"][contract.ANNOTATION_POD_BACKEND] == "auto"
    assert operator.counter("fiar_admission_requests_total", result="bad_request") >= 2 * len(BAD_REQUESTS)


def test_a_forged_namespace_path_cannot_rewrite_a_namespaces_labels(operator: Any, kit: Any, namespace: str) -> None:
    kit.policy(f"forged-{kit.unique}", namespace)
    # A pod in another namespace, named like the victim namespace and labelled as if it were ignored.
    attacker = operator.plane.create_namespace(f"atk-{kit.unique}")
    decoy = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": namespace, "labels": {contract.NAMESPACE_IGNORE_LABEL: ""}},
        "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "busybox"}]},
    }
    kit.kube.call("POST", f"/api/v1/namespaces/{attacker}/pods", body=decoy)
    pod = {"metadata": {"name": "p", "labels": {"app": "vllm"}}, "spec": {"containers": [{"name": "vllm"}]}}
    forged = {"uid": "forged", "operation": "CREATE", "namespace": f"{attacker}/pods/{namespace}", "object": pod}
    status, answer = operator.post("/mutate/pods", json.dumps({**ENVELOPE, "request": forged}).encode())
    assert status == 200 and answer["response"]["allowed"] is True and "patch" not in answer["response"]
    created = kit.pod(namespace, "after-forgery", nodeName="nowhere")
    assert created["metadata"]["labels"].get(contract.LABEL_POD_POLICY) == f"forged-{kit.unique}"
