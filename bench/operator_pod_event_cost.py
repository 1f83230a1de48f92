"""What a pod's watch event and a policy status pass cost the operator, side by side in one run.

watch event   decoding one bound, running pod's event (4 KiB of JSON, as the API server sends
              it) and indexing it: read whole (the first event of a pod, or a pod without a
              ``metadata.generation``) beside a status change of a pod the index holds at the
              same generation, which keeps what the held record read from the spec
status pass   the pod counts of one policy's status over its pods: counted afresh for every pod
              (``rules.policy_status``) beside kept per pod record (``status.Outcomes``), with
              every pod unchanged since the last pass and with a quarter of them changed

.venv/bin/python bench/operator_pod_event_cost.py [--pods 1000 20000]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from typing import Any

import fiar_contract as contract
from fiar_operator.reconcile import rules
from fiar_operator.reconcile.status import Outcomes
from fiar_operator.state.store import Store

DECISION = {"backend": "trtllm", "reason": "Verified", "trigger": "binding", "policy": "bench", "node": "node-00001"}
ENV = [
    {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{note}']"}}}
    for name, note in (
        (contract.ENV_VAR, contract.ANNOTATION_POD_BACKEND),
        (contract.ENV_FUSE_ALLREDUCE_RMS, contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS),
    )
]


def pod(i: int, generation: int | None, phase: str = "Running") -> dict[str, Any]:
    """A managed pod as a watch event decodes it: defaulted by the API server, bound, running."""
    meta: dict[str, Any] = {
        "name": f"vllm-{i:05d}",
        "namespace": "ml",
        "uid": f"2f7c1a4e-8b1d-4c3e-9a55-{i:012d}",
        "resourceVersion": str(1000 + i),
        "creationTimestamp": "2026-12-03T12:00:00Z",
        "labels": {"app": "vllm", "pod-template-hash": "7d9f8c6b5", contract.LABEL_POD_POLICY: "bench"},
        "annotations": {
            contract.ANNOTATION_POD_BACKEND: "trtllm",
            contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: "on",
            contract.ANNOTATION_POD_DECISION: json.dumps(DECISION),
        },
        "managedFields": [
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "v1",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:containers": {}}},
            },
            {
                "manager": "kubelet",
                "operation": "Update",
                "apiVersion": "v1",
                "subresource": "status",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:conditions": {}, "f:phase": {}, "f:podIP": {}}},
            },
        ],
    }
    if generation is not None:
        meta["generation"] = generation
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.33.0",
        "command": ["vllm", "serve", "m"],
        "args": ["-cc.pass_config.fuse_allreduce_rms=$(FIAR_FUSE_ALLREDUCE_RMS)"],
        "env": ENV,
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "volumeMounts": [
            {"name": "kube-api-access", "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
        ],
    }
    toleration = {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    spec = {
        "containers": [container],
        "nodeName": f"node-{i:05d}",
        "restartPolicy": "Always",
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", **toleration},
            {"key": "node.kubernetes.io/unreachable", **toleration},
        ],
        "volumes": [
            {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
        ],
    }
    started = {
        "name": "vllm",
        "ready": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": "2026-12-03T12:00:02Z"}},
    }
    status = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
        "hostIP": "10.0.0.1",
        "podIP": "10.1.0.2",
        "containerStatuses": [started],
    }
    return {"metadata": meta, "spec": spec, "status": status}


def best_us(fn: Callable[[], object], rounds: int) -> float:
    """The best of 5 means over ``rounds`` calls (µs)."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(rounds):
            fn()
        times.append((time.perf_counter() - started) / rounds)
    return min(times) * 1e6


def watch_event(rounds: int) -> None:
    line = json.dumps({"type": "MODIFIED", "object": pod(1, 1)}).encode()
    print(f"watch event: {len(line)} bytes of JSON")
    decode = best_us(lambda: json.loads(line), rounds)
    cases = {"read whole (no generation)": None, "spec kept (same generation)": 1}
    results = {}
    for name, generation in cases.items():
        store = Store()
        store.put_pod(pod(1, generation, phase="Pending"))
        body = pod(1, generation)

        def index(body: dict[str, Any] = body, store: Store = store, version: list[int] = [2000]) -> None:  # noqa: B006
            version[0] += 1
            body["metadata"]["resourceVersion"] = str(version[0])
            store.put_pod(body)

        results[name] = best_us(index, rounds)
    whole, kept = results.values()
    print(f"  {'decode (json.loads)':32} {decode:8.1f} µs")
    for name, value in results.items():
        print(f"  {'index: ' + name:32} {value:8.1f} µs")
    print(f"  decode + index, spec kept / read whole: {(decode + kept) / (decode + whole):.2f}")


def status_pass(pods: int) -> None:
    store = Store()
    store.put_policy(
        {"metadata": {"name": "bench", "generation": 1}, "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}}}
    )
    store.put_namespace({"metadata": {"name": "ml", "resourceVersion": "1", "labels": {"team": "ml"}}})
    for i in range(pods):
        store.put_pod(pod(i, 1))
    policy = store.policies["bench"]
    outcomes = Outcomes()
    counts = {"verified": 1}

    def afresh() -> object:
        return rules.policy_status(policy, {}, store.pods_of_policy("bench"), None, "now", (), counts)

    def kept() -> object:
        return rules.status_of(policy, outcomes.counted(store, "bench", policy), None, "now", (), counts)

    assert afresh() == kept()
    rounds = max(3, 20_000 // pods)
    fresh_ms, kept_ms = best_us(afresh, rounds) / 1000, best_us(kept, rounds) / 1000
    changed = [pod(i, 1) for i in range(0, pods, 4)]

    def churn() -> None:
        for body in changed:
            body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 100_000)
            store.put_pod(body)

    churned = []
    for _ in range(rounds):
        churn()
        started = time.perf_counter()
        kept()
        churned.append(time.perf_counter() - started)
    churned_ms = min(churned) * 1000
    print(
        f"status pass over {pods} pods: afresh {fresh_ms:.2f} ms, kept {kept_ms:.2f} ms "
        f"({kept_ms / fresh_ms:.2f}x); a quarter changed since the last pass: kept {churned_ms:.2f} ms "
        f"({churned_ms / fresh_ms:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[1000, 20_000])
    parser.add_argument("--rounds", type=int, default=5000)
    args = parser.parse_args()
    print(f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}")
    watch_event(args.rounds)
    for pods in args.pods:
        status_pass(pods)


if __name__ == "__main__":
    main()
