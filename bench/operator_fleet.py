"""The operator at fleet scale, before and after, side by side in one run on one control plane.

A local control plane (etcd + kube-apiserver, no kubelets, so nothing but the operator changes the
objects) is filled with pods (``--steps``) and half as many nodes, the pods bound to them, shaped like pods of a
vLLM Deployment (env, probes, volumes, tolerations), plus one policy and ``--drift-pods`` managed pods
on one verified node. Then each operator variant is started in turn (``--rounds`` times, alternated),
with no webhook registered (the operator alone), and measured:

    ready      seconds from the start to /readyz (every index listed)
    RSS        at ready, the peak over ``--watch`` seconds after ready, and at the end of them
    log lines  the records it logged at INFO (no --verbose) from start to end of the watch
    CPU        seconds of CPU the process used from start to end of the watch
    drift      seconds from relabelling the drift node (its verdict removed, then restored) until
               all its managed pods carry the new decision (each direction measured)

Variants: ``after`` is this tree; ``before`` is the operator source at ``--before`` (a git worktree,
e.g. ``git worktree add /tmp/fiar-before <commit>``), put first on PYTHONPATH.

    PYTHONPATH=tools .venv/bin/python bench/operator_fleet.py --before /tmp/fiar-before [--steps 2000 20000]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from operator_process import OperatorProcess

import fiar_contract as contract
from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for
from fiar_operator import crd
from fiar_operator.core.decide import decide
from fiar_operator.core.errors import Conflict
from fiar_operator.core.pods import FIELD_PATH
from fiar_operator.core.policy import parse_policy
from fiar_operator.state import kube

ROOT = Path(__file__).resolve().parent.parent
NAMESPACES = 20
DRIFT_NODE = "gpu-drift"
DRIFT_NS = "fleet-drift"
POLICY = "fleet"


def node_body(i: int) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": f"node-{i:05d}",
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "gpu-8x",
        "topology.kubernetes.io/zone": f"zone-{i % 3}",
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.count": "8",
    }
    if i % 4 == 0:
        labels[contract.LABEL_BACKEND] = "trtllm"
    cap = {"cpu": "192", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": f"node-{i:05d}", "labels": labels},
        "status": {"capacity": cap, "allocatable": cap},
    }


def pod_body(i: int, node: str, namespace: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    env = [{"name": f"VLLM_SETTING_{k}", "value": f"value-{k}"} for k in range(10)]
    probe = {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10}
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.26.0",
        "command": ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "8"],
        "env": env,
        "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "16", "memory": "256Gi"}},
        "livenessProbe": probe,
        "readinessProbe": probe,
        "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "shm", "mountPath": "/dev/shm"}],
    }
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"vllm-{i:05d}",
            "namespace": namespace,
            "labels": {"app": "web" if i % 2 else "batch", "pod-template-hash": "7d9f8c6b5"},
        },
        "spec": {
            "nodeName": node,
            "containers": [container],
            "volumes": [
                {"name": "models", "hostPath": {"path": "/models"}},
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    for key, value in (extra or {}).items():
        body[key] = {**body.get(key, {}), **value}
    return body


def parallel(fn: Callable[[Any], Any], items: Iterable[Any], workers: int = 24) -> None:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass


def create(client: kube.Kube, path: str, body: dict[str, Any]) -> None:
    with contextlib.suppress(Conflict):  # already there
        client.call("POST", path, body=body, timeout=30.0)


def populate(plane: ControlPlane, nodes: range, pods: range) -> None:
    """Create the nodes and pods of the given index ranges (a pod ``i`` is bound to node ``i // 2``)."""
    client = kube.Kube(plane.api_client(), pool_size=32)
    started = time.monotonic()
    parallel(lambda i: create(client, kube.NODES, node_body(i)), nodes)
    print(f"# nodes {nodes.start}..{nodes.stop} in {time.monotonic() - started:.0f}s", flush=True)
    started = time.monotonic()
    parallel(
        lambda i: create(
            client,
            f"/api/v1/namespaces/fleet-{i % NAMESPACES}/pods",
            pod_body(i, f"node-{i // 2:05d}", f"fleet-{i % NAMESPACES}"),
        ),
        pods,
    )
    print(f"# pods {pods.start}..{pods.stop} in {time.monotonic() - started:.0f}s", flush=True)


def prepare(plane: ControlPlane, drift_pods: int) -> None:
    """The CRD, the namespaces, the drift node, the policy and its managed pods."""
    client = kube.Kube(plane.api_client(), pool_size=32)
    client.apply(kube.CRDS, crd.definition())
    wait_for(lambda: established(client), 30, "CRD established")
    for n in [*(f"fleet-{k}" for k in range(NAMESPACES)), DRIFT_NS]:
        create(client, kube.NAMESPACES, {"metadata": {"name": n}})
    verified = {contract.LABEL_BACKEND: "trtllm", "kubernetes.io/hostname": DRIFT_NODE}
    create(client, kube.NODES, {"metadata": {"name": DRIFT_NODE, "labels": verified}})
    spec = {
        "podSelector": {"matchLabels": {"app": "vllm"}},
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": DRIFT_NS}},
    }
    policy = {"apiVersion": "fiar.io/v1alpha1", "kind": "FiAllreducePolicy", "metadata": {"name": POLICY}, "spec": spec}
    create(client, kube.POLICIES, policy)
    created = client.call("GET", f"{kube.POLICIES}/{POLICY}")
    decision = decide(parse_policy(created), DRIFT_NODE, verified)
    parallel(
        lambda i: create(client, f"/api/v1/namespaces/{DRIFT_NS}/pods", managed_pod(i, decision)), range(drift_pods)
    )


def managed_pod(i: int, decision: Any) -> dict[str, Any]:
    body = pod_body(i, DRIFT_NODE, DRIFT_NS)
    body["metadata"]["labels"] = {"app": "vllm", contract.LABEL_POD_POLICY: POLICY}
    body["metadata"]["annotations"] = dict(decision.annotations())
    env = {"name": contract.ENV_VAR, "valueFrom": {"fieldRef": {"fieldPath": FIELD_PATH}}}
    body["spec"]["containers"][0]["env"].append(env)
    return body


def established(client: kube.Kube) -> bool:
    doc = client.call("GET", f"{kube.CRDS}/{crd.definition()['metadata']['name']}")
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in doc["status"]["conditions"] or [])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backends(client: kube.Kube) -> list[str | None]:
    doc = client.call("GET", f"/api/v1/namespaces/{DRIFT_NS}/pods", {"labelSelector": "app=vllm"})
    return [(p["metadata"].get("annotations") or {}).get(contract.ANNOTATION_POD_BACKEND) for p in doc["items"]]


def drift(client: kube.Kube, verdict: str | None, timeout: float = 60.0) -> float:
    """Relabel the drift node; seconds until every managed pod on it left (or went back to) trtllm."""
    body = {"metadata": {"labels": {contract.LABEL_BACKEND: verdict}}}
    started = time.monotonic()
    client.call("PATCH", f"{kube.NODES}/{DRIFT_NODE}", body=body, content_type=kube.MERGE_PATCH)
    want_trtllm = verdict == "trtllm"
    while time.monotonic() - started < timeout:
        if all((b == "trtllm") == want_trtllm for b in backends(client)):
            return time.monotonic() - started
        time.sleep(0.05)
    return float("nan")


def run_operator(plane: ControlPlane, variant: str, source: Path | None, workdir: Path, watch: float) -> dict[str, Any]:
    client = kube.Kube(plane.api_client())
    operator = OperatorProcess(plane.kubeconfig, workdir, source=source, name=variant)
    process = operator.process
    try:
        peak = 0.0

        def ready() -> bool:
            nonlocal peak
            peak = max(peak, rss_mib(process.pid))
            return operator.ready()

        wait_for(ready, 300, f"{variant} operator ready", interval=0.1)
        ready_s = time.monotonic() - operator.started
        ready_rss = rss_mib(process.pid)
        until = time.monotonic() + watch
        while time.monotonic() < until:
            peak = max(peak, rss_mib(process.pid))
            time.sleep(0.1)
        end_rss, cpu = rss_mib(process.pid), cpu_seconds(process.pid)
        lines = sum(
            1
            for line in operator.log.read_text(errors="replace").splitlines()
            if line.startswith("[") and "aiohttp.server" not in line  # not strangers' requests to the port
        )
        lost = drift(client, None)
        back = drift(client, "trtllm")
        peak = max(peak, rss_mib(process.pid))
    finally:
        operator.stop()
    return {
        "variant": variant,
        "ready_s": round(ready_s, 1),
        "rss_ready": round(ready_rss),
        "rss_peak": round(peak),
        "rss_end": round(end_rss),
        "log_lines": lines,
        "cpu_s": round(cpu, 1),
        "drift_lost_s": round(lost, 2),
        "drift_back_s": round(back, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--steps",
        type=int,
        nargs="+",
        default=[20_000],
        help="pod counts to measure at, in rising order (half as many nodes); every variant runs at the "
        "last, only 'after' at the others (the memory curve)",
    )
    parser.add_argument("--drift-pods", type=int, default=100)
    parser.add_argument("--before", type=Path, help="source tree of the operator to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--watch", type=float, default=60.0, help="seconds measured after ready")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fiar-fleet-"))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    print(f"# steps {args.steps} pods (half as many nodes), {args.drift_pods} managed pods; work in {workdir}")
    plane = ControlPlane(workdir / "plane", Tier.A)
    plane.start()
    try:
        prepare(plane, args.drift_pods)
        variants: list[tuple[str, Path | None]] = [("after", None)]
        if args.before is not None:
            variants.insert(0, ("before", args.before))
        pods = 0
        for step in args.steps:
            populate(plane, range(pods // 2, step // 2), range(pods, step))
            pods = step
            last = step == args.steps[-1]
            for _ in range(args.rounds if last else 1):
                for variant, source in variants if last else variants[-1:]:
                    result = run_operator(plane, variant, source, workdir, args.watch)
                    print(json.dumps({"pods": step, "nodes": step // 2, **result}), flush=True)
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
