"""Peak memory of the operator listing every pod into its index (start, and every relist after a 410).

The API server is replaced by an in-process fake of ``Kube.call`` that answers each page (500 pods)
the way the real one does: the page's JSON bytes, decoded with ``json.loads``. The pods are synthetic
but shaped like pods of a vLLM Deployment on a GPU node (managedFields, env, probes, volumes,
tolerations, status), about 7 KB of JSON each. Two ways of listing are compared, each in a fresh process:

    accumulate  every page is kept until the last one, then the index is built (Kube.list before
                the listing was streamed)
    stream      the index is built from each page as it arrives (``Kube.list`` returns a ``Listing``)

For each, the process's peak RSS and its RSS once listed (without tracemalloc) and the Python
heap's peak and final size (tracemalloc, a separate run) are reported, net of the process before
listing; the stream mode at each page size of ``--page``. ``--source TREE`` measures the operator
source of another tree (put first on PYTHONPATH) beside this one.

    .venv/bin/python bench/operator_list_memory.py [--pods 2000 5000 20000] [--page 500 100] [--source TREE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import fiar_contract as contract
from fiar_operator.state import kinds, kube
from fiar_operator.state.store import Store

PAGE = 500


def synthetic_pod(i: int) -> dict[str, Any]:
    name = f"vllm-llama-70b-7d9f8c6b5-{i:05d}"
    uid = f"6f1c2d3e-{i:04x}-4a5b-8c7d-0123456789ab"
    stamp = "2026-05-01T10:00:00Z"
    env = [{"name": f"VLLM_SETTING_{k}", "value": f"value-{k}"} for k in range(10)]
    field_path = f"metadata.annotations['{contract.ANNOTATION_POD_BACKEND}']"
    env += [
        {"name": "HF_HOME", "value": "/models/cache"},
        {"name": contract.ENV_VAR, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}},
    ]
    probe = {"httpGet": {"path": "/health", "port": 8000, "scheme": "HTTP"}, "periodSeconds": 10,
             "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3}
    fields = {f"f:{k}": {} for k in ("dnsPolicy", "enableServiceLinks", "restartPolicy", "schedulerName",
                                     "securityContext", "terminationGracePeriodSeconds")}
    owner_key = f'k:{{"uid":"{uid}"}}'
    env_fields = {f'k:{{"name":"{e["name"]}"}}': {".": {}, "f:name": {}, "f:value": {}} for e in env}
    container_fields = {".": {}, "f:args": {}, "f:env": env_fields, "f:image": {}, "f:livenessProbe": {},
                        "f:readinessProbe": {}, "f:resources": {}, "f:volumeMounts": {}}
    controller_fields = {
        "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                       "f:ownerReferences": {".": {}, owner_key: {}}},
        "f:spec": {"f:containers": {'k:{"name":"vllm"}': container_fields}, **fields},
    }
    status_fields = {f"f:{k}": {} for k in (
        "conditions", "containerStatuses", "hostIP", "hostIPs", "phase", "podIP", "podIPs", "startTime")}
    managed = [
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": stamp,
         "fieldsType": "FieldsV1", "fieldsV1": controller_fields},
        {"manager": "kube-scheduler", "operation": "Update", "apiVersion": "v1", "time": stamp,
         "fieldsType": "FieldsV1", "subresource": "status",
         "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"PodScheduled"}': {".": {}, "f:status": {}}}}}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": stamp, "fieldsType": "FieldsV1",
         "subresource": "status", "fieldsV1": {"f:status": status_fields}},
    ]
    decision = json.dumps({"backend": "mnnvl", "node": f"gpu-{i % 500}", "nodeVerdict": "mnnvl", "policy": "vllm",
                           "reason": "Verified", "time": stamp, "trigger": "binding"})
    conditions = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp}
                  for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]
    return {
        "metadata": {
            "name": name, "generateName": name[:-5], "namespace": f"team-{i % 50}", "uid": uid,
            "resourceVersion": str(100_000 + i), "creationTimestamp": stamp,
            "labels": {"app": "vllm-llama-70b", "pod-template-hash": "7d9f8c6b5", contract.LABEL_POD_POLICY: "vllm"},
            "annotations": {contract.ANNOTATION_POD_BACKEND: "mnnvl", contract.ANNOTATION_POD_DECISION: decision},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name[:-6], "uid": uid,
                                 "controller": True, "blockOwnerDeletion": True}],
            "managedFields": managed,
        },
        "spec": {
            "containers": [{
                "name": "vllm", "image": "vllm/vllm-openai:v0.26.0",
                "args": ["--model", "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "8"],
                "env": env, "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "900Gi"},
                              "requests": {"nvidia.com/gpu": "8", "memory": "900Gi", "cpu": "64"}},
                "volumeMounts": [{"name": n, "mountPath": p} for n, p in (
                    ("models", "/models"), ("shm", "/dev/shm"),
                    ("kube-api-access-x7k2p", "/var/run/secrets/kubernetes.io/serviceaccount"))],
                "livenessProbe": probe, "readinessProbe": probe, "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
            }],
            "volumes": [
                {"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
                {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                        "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}},
            ],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "nodeName": f"gpu-{i % 500}", "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler", "serviceAccountName": "default", "priority": 0,
            "terminationGracePeriodSeconds": 30, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running", "conditions": conditions, "hostIP": "10.0.0.7", "podIP": f"10.244.{i // 250}.{i % 250}",
            "hostIPs": [{"ip": "10.0.0.7"}], "podIPs": [{"ip": f"10.244.{i // 250}.{i % 250}"}], "startTime": stamp,
            "qosClass": "Burstable",
            "containerStatuses": [{
                "name": "vllm", "ready": True, "restartCount": 0, "started": True, "image": "vllm/vllm-openai:v0.26.0",
                "imageID": "docker.io/vllm/vllm-openai@sha256:" + "0" * 64,
                "containerID": "containerd://" + f"{i:064x}", "state": {"running": {"startedAt": stamp}},
                "lastState": {},
            }],
        },
    }


class FakeApi(kube.Kube):
    """Pages of synthetic pods, encoded and decoded per request as an API server answer would be."""

    def __init__(self, pods: int) -> None:
        self.pods = pods

    def call(self, method: str, path: str, query: Any = None, body: Any = None, content_type: str | None = None,
             timeout: Any = 10.0) -> Any:
        start = int((query or {}).get("continue") or 0)
        end = min(start + int((query or {}).get("limit") or PAGE), self.pods)
        meta: dict[str, Any] = {"resourceVersion": "200000"}
        if end < self.pods:
            meta["continue"] = str(end)
        items = ",".join(json.dumps(synthetic_pod(i)) for i in range(start, end))
        data = f'{{"kind":"PodList","metadata":{json.dumps(meta)},"items":[{items}]}}'.encode()
        del items
        return json.loads(data)  # the response body and its decoded page, as in Kube.call


def accumulate(api: FakeApi, store: Store) -> None:
    """Kube.list before it streamed: every page kept, then the index built from all of them."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        doc = api.call("GET", kube.PODS, {"limit": PAGE, "continue": token})
        items += doc.get("items") or []
        token = (doc.get("metadata") or {}).get("continue") or None
        if not token:
            break
    store.replace_all(kinds.PODS, items)


def child(mode: str, pods: int, page: int, traced: bool) -> dict[str, float]:
    api, store = FakeApi(pods), Store()

    def run(api: FakeApi, store: Store) -> None:
        if mode == "accumulate":
            accumulate(api, store)
        else:
            store.replace_all(kinds.PODS, api.list(kube.PODS, page=page))

    if traced:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        run(api, store)
        elapsed = time.perf_counter() - started
        current, peak = tracemalloc.get_traced_memory()
        assert len(store.pods) == pods
        return {"heap_peak": peak - base, "heap_kept": current - base, "seconds": elapsed}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(api, store)
    assert len(store.pods) == pods
    return {
        "rss_before": before * 1024.0,
        "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0,
        "rss_end": rss(),
    }


def rss() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024.0
    return 0.0


def measure(mode: str, pods: int, page: int, traced: bool, source: Path | None) -> dict[str, float]:
    argv = [sys.executable, __file__, "--child", mode, "--pods", str(pods), "--page", str(page)]
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source / "operator"), str(source), env.get("PYTHONPATH", "")])
    argv += ["--traced"] if traced else []
    done = subprocess.run(argv, check=True, capture_output=True, text=True, env=env)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[2000, 5000, 20000])
    parser.add_argument("--page", type=int, nargs="+", default=[PAGE], help="objects per page of the stream mode")
    parser.add_argument("--accumulate", action="store_true", help="also the list kept whole (before streaming)")
    parser.add_argument("--source", type=Path, help="the operator source of another tree, measured beside this one")
    parser.add_argument("--child", choices=["accumulate", "stream"], help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.pods[0], args.page[0], args.traced)))
        return

    size = len(json.dumps(synthetic_pod(0)))
    tracemalloc.start()
    decoded = json.loads(json.dumps(synthetic_pod(0)))
    heap = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del decoded
    mib = 1024.0 * 1024.0
    print(f"synthetic pod: {size / 1024:.1f} KB of JSON, {heap / 1024:.1f} KB of Python heap decoded; "
          f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}")
    print(f"{'tree':>6} {'pods':>6} {'mode':>10} {'page':>5} {'peak RSS MiB':>13} {'RSS growth MiB':>15} "
          f"{'RSS kept MiB':>13} {'heap peak MiB':>14} {'heap kept MiB':>14} {'kept B/pod':>11} {'list s':>7}")
    trees: list[tuple[str, Path | None]] = [("this", None)] + ([("source", args.source)] if args.source else [])
    modes = [("accumulate", PAGE)] if args.accumulate else []
    modes += [("stream", page) for page in args.page]
    for pods in args.pods:
        for mode, page in modes:
            for tree, source in trees:
                rss, heap_stats = measure(mode, pods, page, False, source), measure(mode, pods, page, True, source)
                growth = (rss["rss_peak"] - rss["rss_before"]) / mib
                kept = (rss["rss_end"] - rss["rss_before"]) / mib
                print(f"{tree:>6} {pods:6d} {mode:>10} {page:5d} {rss['rss_peak'] / mib:13.0f} {growth:15.0f} "
                      f"{kept:13.0f} {heap_stats['heap_peak'] / mib:14.1f} {heap_stats['heap_kept'] / mib:14.1f} "
                      f"{heap_stats['heap_kept'] / pods:11.0f} {heap_stats['seconds']:7.2f}", flush=True)


if __name__ == "__main__":
    main()
