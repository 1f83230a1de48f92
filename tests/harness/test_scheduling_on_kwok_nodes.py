"""Deployment -> ReplicaSet -> Pods, bound by the real scheduler to a labelled kwok node, Running (tier C)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from devcluster.cluster import ControlPlane

pytestmark = pytest.mark.controlplane


def test_deployment_pods_land_on_the_labelled_fake_gpu_node_and_run(plane_c: ControlPlane, unique: str) -> None:
    gpu_node, cpu_node = f"gpu-{unique}", f"cpu-{unique}"
    plane_c.add_node(gpu_node, labels={"fiar.test/pool": unique}, capacity={"nvidia.com/gpu": "8"},
                     taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    plane_c.add_node(cpu_node)
    ns = plane_c.create_namespace(f"sched-{unique}")
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "vllm"}},
            "template": {
                "metadata": {"labels": {"app": "vllm"}},
                "spec": {
                    "nodeSelector": {"fiar.test/pool": unique},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest",
                                    "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
                },
            },
        },
    }
    with plane_c.api_client() as api:
        client.AppsV1Api(api).create_namespaced_deployment(ns, deployment)
        core = client.CoreV1Api(api)
        deadline = time.monotonic() + 60
        pods: list[client.V1Pod] = []
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(ns, label_selector="app=vllm").items
            if len(pods) == 3 and all(p.status.phase == "Running" for p in pods):
                break
            time.sleep(0.2)
        assert len(pods) == 3
        assert {p.spec.node_name for p in pods} == {gpu_node}
        assert all(p.status.phase == "Running" for p in pods), [p.status.phase for p in pods]
        node = core.read_node(gpu_node)
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
