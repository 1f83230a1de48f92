"""The reconciler leaves alone every namespace the webhooks exclude, as the docs promise."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.feed import feed
from fiar_operator.core.decide import Decision
from fiar_operator.core.settings import Settings, excluded_namespaces
from fiar_operator.runtime import Runtime
from fiar_operator.state import kube

RELEASE = "fiar-system"


class RecordingKube(kube.Kube):
    """Records the pod annotations the reconciler writes, and answers with the patched pod."""

    def __init__(self, pods: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.pods = pods
        self.annotated: list[tuple[str, str]] = []

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> dict[str, Any]:
        self.annotated.append((namespace, name))
        patched = copy.deepcopy(self.pods[(namespace, name)])
        patched["metadata"]["annotations"].update(annotations)
        patched["metadata"]["resourceVersion"] = "2"
        return patched


def bound_pod(namespace: str) -> dict[str, Any]:
    """A running pod bound while the operator was down: the reconciler would decide it now."""
    pending = Decision("auto", "Pending", "vllm", trigger="create")
    return {
        "metadata": {
            "name": "vllm-0",
            "namespace": namespace,
            "uid": f"uid-{namespace}",
            "resourceVersion": "1",
            "labels": {contract.LABEL_POD_POLICY: "vllm"},
            "annotations": {
                contract.ANNOTATION_POD_BACKEND: "auto",
                contract.ANNOTATION_POD_DECISION: pending.to_json(),
            },
        },
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {"phase": "Running"},
    }


def runtime_with(namespace: str) -> tuple[Runtime, RecordingKube, dict[str, Any]]:
    pod = bound_pod(namespace)
    client = RecordingKube({(namespace, "vllm-0"): pod})
    runtime = Runtime(
        Settings(metrics_port=None, excluded_namespaces=excluded_namespaces({"POD_NAMESPACE": RELEASE})), client
    )
    runtime.store.put_policy({"metadata": {"name": "vllm"}, "spec": {"podSelector": {}}})
    runtime.store.put_node({"metadata": {"name": "gpu-1", "labels": {contract.LABEL_BACKEND: "mnnvl"}}})
    runtime.store.put_namespace({"metadata": {"name": "ignored", "labels": {contract.NAMESPACE_IGNORE_LABEL: "true"}}})
    runtime.store.put_namespace({"metadata": {"name": "ml", "labels": {}}})
    return runtime, client, pod


def test_excluded_namespaces_are_kube_system_and_the_release_namespace() -> None:
    assert excluded_namespaces({}) == ("kube-system",)
    assert excluded_namespaces({"POD_NAMESPACE": RELEASE}) == ("kube-system", RELEASE)
    assert excluded_namespaces({"POD_NAMESPACE": "kube-system"}) == ("kube-system",)


def test_namespaces_the_chart_excludes_are_excluded_too() -> None:
    assert excluded_namespaces({"POD_NAMESPACE": RELEASE}, extra=["batch", " ", RELEASE]) == (
        "kube-system", RELEASE, "batch")


@pytest.mark.parametrize("namespace", ["kube-system", RELEASE, "ignored"])
def test_reconciler_never_reannotates_or_reports_pods_in_excluded_namespaces(namespace: str) -> None:
    runtime, client, pod = runtime_with(namespace)
    assert feed(runtime, "pods", pod) == []
    relabelled = {"metadata": {"name": "gpu-1", "labels": {contract.LABEL_BACKEND: "none"}}}
    assert feed(runtime, "nodes", relabelled) == []
    policy = {"metadata": {"name": "vllm"}, "spec": {"podSelector": {}, "backends": ["trtllm"]}}
    assert feed(runtime, "policies", policy) == []
    assert client.annotated == []
    assert (namespace, "vllm-0") in runtime.store.pods, "the pod stays indexed"


def test_reconciler_still_decides_pods_in_other_namespaces() -> None:
    runtime, client, pod = runtime_with("ml")
    events = feed(runtime, "pods", pod)
    assert client.annotated == [("ml", "vllm-0")]
    assert [e.reason for e in events] == ["DecidedAfterBinding"]
    assert runtime.store.pods[("ml", "vllm-0")].backend == "mnnvl"
