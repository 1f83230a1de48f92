"""Several replicas: every one serves the webhooks from live indexes; one at a time reconciles."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.cluster import ControlPlane, Tier
from fiar_operator.state import kube

pytestmark = pytest.mark.controlplane

# kopf's peering CRD, as the chart installs it.
PEERING_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "clusterkopfpeerings.kopf.dev"},
    "spec": {
        "scope": "Cluster",
        "group": "kopf.dev",
        "names": {"kind": "ClusterKopfPeering", "plural": "clusterkopfpeerings", "singular": "clusterkopfpeering"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {"status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    }
                },
            }
        ],
    },
}


def binding_review(namespace: str, pod: dict[str, Any], node: str) -> bytes:
    meta = pod["metadata"]
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "b-1",
                "operation": "CREATE",
                "namespace": namespace,
                "name": meta["name"],
                "subResource": "binding",
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "object": {
                    "metadata": {"name": meta["name"], "namespace": namespace, "uid": meta["uid"]},
                    "target": {"kind": "Node", "name": node},
                },
            },
        }
    ).encode()


def test_standby_replica_serves_webhooks_while_only_the_leader_reconciles(
    private_plane: Callable[[Tier], ControlPlane],
    start_operator: Callable[..., Any],
    make_kit: Callable[[ControlPlane, str], Any],
    unique: str,
) -> None:
    plane = private_plane(Tier.C)
    kube.Kube(plane.api_client()).apply(kube.CRDS, PEERING_CRD)
    leader = start_operator(plane, unique, ("--peering", "fiar", "--priority", "200"))
    standby = start_operator(plane, unique, ("--peering", "fiar", "--priority", "100"))
    kit = make_kit(plane, unique)
    kit.wait(lambda: "Pausing operations in favour of" in standby.tail(400), 30, "standby pauses")
    assert "Pausing operations" not in leader.tail(400)
    peering = kit.kube.call("GET", "/apis/kopf.dev/v1/clusterkopfpeerings/fiar")
    assert sorted(p["priority"] for p in peering["status"].values()) == [100, 200]

    leader.register("fiar-leader")
    namespace = plane.create_namespace(f"ha-{unique}", {"fiar-operator-test": unique})
    leader.wait_active(namespace)
    node = kit.node(f"t-{unique}", "trtllm")
    kit.policy(f"ha-{unique}", namespace)  # its status is written: the leader reconciles
    created = kit.pod(namespace, "seen-by-both", nodeSelector={"nowhere": "x"})

    def standby_answer() -> dict[str, str] | None:
        status, answer = standby.post("/mutate/binding", binding_review(namespace, created, node))
        assert status == 200
        patch = answer["response"].get("patch")
        if not patch:
            return None
        (op,) = json.loads(base64.b64decode(patch))
        value: dict[str, str] = op["value"]
        return value

    annotations = kit.wait(standby_answer, 30, "the standby decides from its own indexes")
    assert annotations[contract.ANNOTATION_POD_BACKEND] == "trtllm"
    assert standby.counter("fiar_binding_pod_lookups_total", source="read") == 0
    # The policy appeared after the standby paused: only the leader's reconciler acts; kopf handles
    # no pods, nodes, namespaces or policies on either replica.
    def leadership(replica: Any) -> list[str]:
        return [line for line in replica.tail(4000).splitlines() if "reconciling (peering fiar)" in line]

    assert "starts" in leadership(leader)[-1]
    assert not leadership(standby) or "stops" in leadership(standby)[-1]
    for replica in (leader, standby):
        assert "Handler '" not in replica.tail(4000)

    # The leader leaves (kopf marks its peering entry dead on exit): the standby takes over and
    # reconciles, e.g. writes the status of a policy created after the leader left.
    leader.stop()
    kit.wait(lambda: "starts" in (leadership(standby) or ["-"])[-1], 30, "the standby takes over")
    kit.policy(f"ha-after-{unique}", namespace)
