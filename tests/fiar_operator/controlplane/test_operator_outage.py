"""With the operator down, pods are still created and scheduled (the webhooks fail open) and run
with the fallback backend; once the operator is back it decides them and reports them, and it reports
the pods it never saw (created while the pod webhook was down) as unconfigured."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.cluster import ControlPlane, Tier
from devcluster.workloads import vllm_deployment

pytestmark = pytest.mark.controlplane


def test_pods_schedule_with_the_fallback_while_down_and_are_reported_once_back(
    private_plane: Callable[[Tier], ControlPlane],
    start_operator: Callable[[ControlPlane, str], Any],
    make_kit: Callable[[ControlPlane, str], Any],
    unique: str,
) -> None:
    plane = private_plane(Tier.C)
    operator = start_operator(plane, unique)
    kit = make_kit(plane, unique)
    operator.register("fiar-outage")
    namespace = plane.create_namespace(f"outage-{unique}", {"fiar-operator-test": unique})
    operator.wait_active(namespace)
    policy = f"outage-{unique}"
    selects = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["vllm", "vllm-by-hand"]}]}
    kit.policy(policy, namespace, fallbackBackend="trtllm", podSelector=selects)
    no_nodes = {c["type"]: c for c in kit.get_policy(policy)["status"]["conditions"]}["NoVerifiedNodes"]
    assert no_nodes["status"] == "True" and "pods get trtllm" in no_nodes["message"]

    deployment = vllm_deployment(3, node_selector={f"pool-{unique}": "gpu"}, spread=None)
    kit.kube.call("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=deployment)
    pending = kit.wait(
        lambda: (
            [
                p
                for p in kit.pods(namespace, "app=vllm")
                if contract.ANNOTATION_POD_BACKEND in p["metadata"].get("annotations", {})
            ]
            if len(kit.pods(namespace, "app=vllm")) == 3
            else None
        ),
        60,
        "three admitted pods",
    )
    assert all(p["metadata"]["annotations"][contract.ANNOTATION_POD_BACKEND] == "trtllm" for p in pending)

    operator.stop()
    kit.node(f"gpu-{unique}", "mnnvl")
    kit.pod(namespace, "created-while-down", labels={"app": "other"})
    kit.pod(namespace, "vllm-created-while-down", labels={"app": "vllm-by-hand"})
    pods = kit.running(namespace, 3, "app=vllm", timeout=90)
    for pod in pods:
        notes = pod["metadata"]["annotations"]
        assert notes[contract.ANNOTATION_POD_BACKEND] == "trtllm"
        assert json.loads(notes[contract.ANNOTATION_POD_DECISION])["reason"] == "Pending"
    (unmutated,) = kit.running(namespace, 1, "app=other")
    assert not unmutated["spec"]["containers"][0].get("env")
    (missed,) = kit.running(namespace, 1, "app=vllm-by-hand")
    assert not missed["spec"]["containers"][0].get("env"), "the pod webhook was down: vLLM's default applies"

    operator.start()

    def decided() -> bool:
        current = kit.pods(namespace, "app=vllm")
        return all(p["metadata"]["annotations"][contract.ANNOTATION_POD_BACKEND] == "mnnvl" for p in current)

    kit.wait(decided, 30, "pods decided after the operator came back")
    for pod in kit.pods(namespace, "app=vllm"):
        decision = json.loads(pod["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])
        assert (decision["trigger"], decision["previous"], decision["reason"]) == ("reconcile", "trtllm", "Verified")
        kit.wait(
            lambda pod=pod: [
                e
                for e in kit.events(namespace, pod["metadata"]["name"])
                if e["reason"] == "DecidedAfterBinding" and e["type"] == "Warning"
            ],
            30,
            "DecidedAfterBinding event",
        )

    def reported() -> dict[str, Any] | None:
        status = kit.get_policy(policy).get("status") or {}
        return status if (status.get("pods") or {}).get("stale") == 3 else None

    status = kit.wait(reported, 30, "stale pods reported in the policy status")
    assert status["pods"] == {
        "decided": 3,
        "fallback": 0,
        "pending": 0,
        "stale": 3,
        "unconfigured": 1,
        "fusionOff": 0,
        "fusionUncontrolled": 0,
        "multicastGuarded": 0,
        "flashinferNotTurnedOff": 0,
        "valuesNotApplied": 0,
        "releaseNotQualified": 0,
    }
    assert status["nodes"] == {"mnnvl": 1, "trtllm": 0, "none": 0, "unprobed": 0, "verified": 1}
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Ready": "True", "NoVerifiedNodes": "False", "UnconfiguredPods": "True"}
    (event,) = kit.wait(
        lambda: [e for e in kit.events(namespace, "vllm-created-while-down") if e["reason"] == "NotConfigured"],
        30,
        "NotConfigured event on the pod created while the webhook was down",
    )
    assert event["type"] == "Warning" and "while the fiar pod webhook was unavailable" in event["message"]
    assert not [e for e in kit.events(namespace, "created-while-down") if e["reason"] == "NotConfigured"]

    # Exactly once: each pod bound while the operator was down is re-annotated and warned once, the
    # pod the webhook missed is warned once, however many watches and handlers saw them after the start.
    time.sleep(3)
    assert operator.counter("fiar_pods_reannotated_total", reason="DecidedAfterBinding") == 3
    for pod in kit.pods(namespace, "app=vllm"):
        warned = [e for e in kit.events(namespace, pod["metadata"]["name"]) if e["reason"] == "DecidedAfterBinding"]
        assert sum(int(e.get("count") or 1) for e in warned) == 1, warned
    missed_events = [e for e in kit.events(namespace, "vllm-created-while-down") if e["reason"] == "NotConfigured"]
    assert sum(int(e.get("count") or 1) for e in missed_events) == 1
