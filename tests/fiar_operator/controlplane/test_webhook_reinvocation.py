"""A sidecar injector that runs after fiar's pod webhook: the API server calls fiar again
(reinvocationPolicy IfNeeded), which gives the injected container the variable and duplicates nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from devcluster import workloads
from devcluster.webhooks import Review, WebhookServer, mutating_configuration
from fiar_operator.core.errors import ApiError
from fiar_operator.state import kube

pytestmark = pytest.mark.controlplane


def _inject_sidecar(request: Review) -> list[dict[str, Any]]:
    names = [c.get("name") for c in request["object"]["spec"]["containers"]]
    if "vllm-router" in names:
        return []
    return [{"op": "add", "path": "/spec/containers/-", "value": {"name": "vllm-router", "image": "router"}}]


@pytest.fixture
def injector(operator: Any, namespace: str, tmp_path: Path, unique: str) -> Iterator[WebhookServer]:
    """A sidecar injector whose configuration sorts after fiar's, so the API server calls it second."""
    with WebhookServer(operator.plane.ca, tmp_path, {"inject": _inject_sidecar}) as server:
        name = f"zz-sidecar-{unique}"
        config = mutating_configuration(
            name, [("inject.sidecar.test", server.url("inject"), "pods", "CREATE")], server.ca_bundle, namespace
        )
        operator.kube.apply(kube.MUTATING_CONFIGS, config)
        yield server
        with contextlib.suppress(ApiError):
            operator.kube.delete(kube.MUTATING_CONFIGS, name)


def env_of(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in container.get("env") or [] if e["name"] == contract.ENV_VAR]


def test_a_container_injected_after_fiar_gets_the_variable_once(
    operator: Any, kit: Any, namespace: str, injector: WebhookServer
) -> None:
    kit.policy(f"reinvoke-{kit.unique}", namespace, containers=["vllm*"])
    probe = workloads.probe_pod()

    def injector_active() -> bool:
        answer = kit.kube.call("POST", f"/api/v1/namespaces/{namespace}/pods", {"dryRun": "All"}, body=probe)
        return bool(answer["spec"]["containers"][-1]["name"] == "vllm-router")

    kit.wait(injector_active, 30, "the API server calls the sidecar injector")
    calls_before = operator.counter("fiar_admission_requests_total", webhook="pods")
    pod = kit.pod(namespace, "served")
    calls = operator.counter("fiar_admission_requests_total", webhook="pods") - calls_before

    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert list(containers) == ["vllm", "vllm-router"]
    for name in ("vllm", "vllm-router"):
        (entry,) = env_of(containers[name])
        assert (
            entry["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{contract.ANNOTATION_POD_BACKEND}']"
        )
    assert pod["metadata"]["labels"][contract.LABEL_POD_POLICY] == f"reinvoke-{kit.unique}"
    # the router's env entry already shows the second call; other namespaces' pods may add to the counter
    assert calls >= 2, "fiar's webhook was called again after the injector changed the pod"
    assert [r["request"]["object"]["metadata"].get("name") for r in injector.requests][-1] == "served"
