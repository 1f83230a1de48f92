"""The two admission mechanisms the operator is built on, shown on the pinned Kubernetes version.

1. A mutating webhook on pod CREATE, served on 127.0.0.1 (url clientConfig + caBundle).
2. A mutating webhook on pods/binding CREATE: the annotations it adds to the Binding are copied by
   the API server onto the Pod when the real scheduler binds it, and a container env var with
   ``fieldRef: metadata.annotations[...]`` then refers to a value known only after scheduling.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from devcluster.cluster import ControlPlane
from devcluster.waiting import wait_for as _wait
from devcluster.webhooks import Review, WebhookServer, mutating_configuration

pytestmark = pytest.mark.controlplane

ANNOTATION = "fiar.test/backend"


def _annotate_on_create(request: Review) -> list[dict[str, Any]]:
    pod = request["object"]
    patch: list[dict[str, Any]] = []
    if not pod["metadata"].get("annotations"):
        patch.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    patch.append({"op": "add", "path": "/metadata/annotations/fiar.test~1backend", "value": "auto"})
    patch.append({"op": "add", "path": "/spec/containers/0/env", "value": [{
        "name": "VLLM_FLASHINFER_ALLREDUCE_BACKEND",
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION}']"}},
    }]})
    return patch


def _annotate_binding(request: Review) -> list[dict[str, Any]]:
    binding = request["object"]
    node = binding["target"]["name"]
    value = "trtllm" if node.startswith("trtllm-") else "mnnvl"
    patch: list[dict[str, Any]] = []
    if not binding["metadata"].get("annotations"):
        patch.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    patch.append({"op": "add", "path": "/metadata/annotations/fiar.test~1backend", "value": value})
    return patch


@pytest.fixture
def webhook(plane_c: ControlPlane, tmp_path: Any) -> Iterator[WebhookServer]:
    assert plane_c.ca is not None
    with WebhookServer(plane_c.ca, tmp_path, {"pods": _annotate_on_create, "binding": _annotate_binding}) as srv:
        yield srv


def test_pod_create_and_binding_webhooks_give_the_pod_its_nodes_value(
    plane_c: ControlPlane, webhook: WebhookServer, unique: str
) -> None:
    ns = plane_c.create_namespace(f"hooks-{unique}")
    node = f"trtllm-{unique}"
    plane_c.add_node(node, labels={"fiar.test/pool": unique})
    config = mutating_configuration(
        f"fiar-test-{unique}",
        [("pods.fiar.test", webhook.url("pods"), "pods", "CREATE"),
         ("binding.fiar.test", webhook.url("binding"), "pods/binding", "CREATE")],
        webhook.ca_bundle,
        namespace=ns,
    )
    with plane_c.api_client() as api:
        admission = client.AdmissionregistrationV1Api(api)
        admission.create_mutating_webhook_configuration(config)
        core = client.CoreV1Api(api)
        try:
            pod = {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm-0"},
                "spec": {"nodeSelector": {"fiar.test/pool": unique},
                         "containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest"}]},
            }
            created = _wait(lambda: _try_create(core, ns, pod), timeout=30)
            # Pod CREATE webhook ran: fallback annotation and the fieldRef env are in place.
            assert created.metadata.annotations[ANNOTATION] == "auto"
            env = created.spec.containers[0].env[0]
            assert env.value_from.field_ref.field_path == f"metadata.annotations['{ANNOTATION}']"

            bound = _wait(lambda: _running(core, ns, "vllm-0"))
            assert bound.spec.node_name == node
            # Binding webhook ran: the API server copied the Binding's annotation onto the Pod.
            assert bound.metadata.annotations[ANNOTATION] == "trtllm"
            kinds = {(r["request"]["resource"]["resource"], r["request"].get("subResource")) for r in webhook.requests}
            assert ("pods", "binding") in kinds and ("pods", None) in kinds
        finally:
            admission.delete_mutating_webhook_configuration(config["metadata"]["name"])


def _try_create(core: client.CoreV1Api, ns: str, pod: dict[str, Any]) -> Any:
    # The API server picks up a new webhook configuration within moments: probe with a dry run
    # (no object is stored) until the mutation shows, then create the pod for real.
    probe = core.create_namespaced_pod(ns, pod, dry_run="All")
    if not (probe.metadata.annotations or {}).get(ANNOTATION):
        return None
    return core.create_namespaced_pod(ns, pod)


def _running(core: client.CoreV1Api, ns: str, name: str) -> Any:
    pod = core.read_namespaced_pod(name, ns)
    return pod if pod.status.phase == "Running" else None
