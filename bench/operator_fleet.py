"""The operator at fleet scale, before and after, side by side in one run on one control plane.

A local control plane (etcd + kube-apiserver, no kubelets, so nothing but the operator and this script
changes the objects) holds ``--nodes`` nodes, one in ``--gpu-every`` a GPU node (the agent's node
selector, ``nvidia.com/gpu.present=true``), one policy and ``--managed`` pods it manages (labelled
``fiar.io/policy`` as the webhook labels them, on GPU nodes, ``--drift-pods`` of them on one verified
node), and unmanaged pods (``--unmanaged``, a rising list: the curve), all shaped like pods of a vLLM
Deployment (env, probes, volumes, tolerations) and bound to nodes. At each step each operator variant is
started in turn (``--rounds`` times at the last step, alternated), with no webhook registered, and
measured:

    ready      seconds from the start to /readyz (every index listed)
    RSS        at ready, the peak over the start and ``--watch`` seconds after ready, and at the end
    CPU        seconds of CPU from the start to ready (per managed pod: the list), and over the watch
               while ``--churn`` unmanaged pods a second are created and deleted beside the managed
               ones (per unmanaged event: the watch's CPU over the events the churn made)
    drift      seconds from relabelling the drift node (its verdict removed, then restored) until
               all its managed pods carry the new decision (each direction measured)
    correct    whether every managed pod on the drift node carries the node's decision at the end

Variants: ``after`` is this tree; ``before`` is the operator source at ``--before`` (a git worktree,
e.g. ``git worktree add /tmp/fiar-before <commit>``), put first on PYTHONPATH.

    PYTHONPATH=tools .venv/bin/python bench/operator_fleet.py --before /tmp/fiar-before \
        --nodes 10000 --managed 20000 --unmanaged 0 100000 180000 --churn 100
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import tempfile
import threading
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
GPU_PRESENT = {"nvidia.com/gpu.present": "true"}
DRIFT_NODE = "gpu-drift"
DRIFT_NS = "fleet-drift"
POLICY = "fleet"


def node_body(i: int, gpu_every: int = 1) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": f"node-{i:05d}",
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "gpu-8x",
        "topology.kubernetes.io/zone": f"zone-{i % 3}",
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.count": "8",
    }
    if i % gpu_every == 0:
        labels.update(GPU_PRESENT)
        if i % (4 * gpu_every) == 0:
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


def populate_nodes(plane: ControlPlane, nodes: int, gpu_every: int) -> None:
    client = kube.Kube(plane.api_client(), pool_size=32)
    started = time.monotonic()
    parallel(lambda i: create(client, kube.NODES, node_body(i, gpu_every)), range(nodes))
    print(f"# {nodes} nodes in {time.monotonic() - started:.0f}s", flush=True)


def managed_body(i: int, node: str, namespace: str, decision: Any) -> dict[str, Any]:
    body = pod_body(i, node, namespace)
    body["metadata"]["name"] = f"managed-{i:06d}"
    body["metadata"]["labels"] = {"app": "vllm", contract.LABEL_POD_POLICY: POLICY}
    body["metadata"]["annotations"] = dict(decision.annotations())
    env = {"name": contract.ENV_VAR, "valueFrom": {"fieldRef": {"fieldPath": FIELD_PATH}}}
    body["spec"]["containers"][0]["env"].append(env)
    return body


def populate(plane: ControlPlane, nodes: int, gpu_every: int, pods: range, managed: bool, decision: Any) -> None:
    """Create pods of the index range: managed ones on GPU nodes, unmanaged ones on any node."""
    client = kube.Kube(plane.api_client(), pool_size=32)
    started = time.monotonic()
    verified = max(1, nodes // (4 * gpu_every))  # the GPU nodes that verify trtllm, as the drift node does

    def one(i: int) -> None:
        namespace = f"fleet-{i % NAMESPACES}"
        if managed:
            body = managed_body(i, f"node-{(i % verified) * 4 * gpu_every:05d}", namespace, decision)
        else:
            body = pod_body(i, f"node-{i % nodes:05d}", namespace)
        create(client, f"/api/v1/namespaces/{namespace}/pods", body)

    parallel(one, pods)
    kind = "managed" if managed else "unmanaged"
    print(f"# {kind} pods {pods.start}..{pods.stop} in {time.monotonic() - started:.0f}s", flush=True)


class Churn:
    """Unmanaged pods created and deleted at ``rate`` a second (each lives about 2 s) on a thread."""

    def __init__(self, plane: ControlPlane, rate: float, nodes: int) -> None:
        self.client = kube.Kube(plane.api_client(), pool_size=8)
        self.rate, self.nodes = rate, nodes
        self.events = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Churn:
        if self.rate > 0:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        live: list[str] = []
        i = 0
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            started = time.monotonic()
            while not self._stop.is_set():
                due = started + i / self.rate
                self._stop.wait(max(0.0, due - time.monotonic()))
                name = f"churn-{i:07d}"
                body = pod_body(i, f"node-{i % self.nodes:05d}", "fleet-churn")
                body["metadata"]["name"] = name
                pool.submit(create, self.client, "/api/v1/namespaces/fleet-churn/pods", body)
                live.append(name)
                if len(live) > 2 * self.rate:
                    old = live.pop(0)
                    pool.submit(self._delete, old)
                i += 1
                self.events += 2  # its ADDED and, later, its DELETED

    def _delete(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self.client.call("DELETE", f"/api/v1/namespaces/fleet-churn/pods/{name}", {"gracePeriodSeconds": 0})


def prepare(plane: ControlPlane, drift_pods: int) -> Any:
    """The CRD, the namespaces, the drift node, the policy and its managed pods."""
    client = kube.Kube(plane.api_client(), pool_size=32)
    client.apply(kube.CRDS, crd.definition())
    wait_for(lambda: established(client), 30, "CRD established")
    for n in [*(f"fleet-{k}" for k in range(NAMESPACES)), DRIFT_NS, "fleet-churn"]:
        create(client, kube.NAMESPACES, {"metadata": {"name": n}})
    verified = {contract.LABEL_BACKEND: "trtllm", "kubernetes.io/hostname": DRIFT_NODE, **GPU_PRESENT}
    create(client, kube.NODES, {"metadata": {"name": DRIFT_NODE, "labels": verified}})
    spec = {
        "podSelector": {"matchLabels": {"app": "vllm"}},
        "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                     "values": ["fleet-churn"]}]},
    }
    policy = {"apiVersion": "fiar.io/v1alpha1", "kind": "FiAllreducePolicy", "metadata": {"name": POLICY}, "spec": spec}
    create(client, kube.POLICIES, policy)
    created = client.call("GET", f"{kube.POLICIES}/{POLICY}")
    decision = decide(parse_policy(created), DRIFT_NODE, verified)
    parallel(
        lambda i: create(client, f"/api/v1/namespaces/{DRIFT_NS}/pods", managed_pod(i, decision)), range(drift_pods)
    )
    return decision


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


def run_operator(
    plane: ControlPlane, variant: str, source: Path | None, workdir: Path, watch: float, churn: float, nodes: int
) -> dict[str, Any]:
    client = kube.Kube(plane.api_client())
    operator = OperatorProcess(plane.kubeconfig, workdir, source=source, name=variant)
    process = operator.process
    try:
        peak = 0.0

        def ready() -> bool:
            nonlocal peak
            peak = max(peak, rss_mib(process.pid))
            return operator.ready()

        wait_for(ready, 600, f"{variant} operator ready", interval=0.1)
        ready_s = time.monotonic() - operator.started
        ready_rss, ready_cpu = rss_mib(process.pid), cpu_seconds(process.pid)
        with Churn(plane, churn, nodes) as churning:
            until = time.monotonic() + watch
            while time.monotonic() < until:
                peak = max(peak, rss_mib(process.pid))
                time.sleep(0.1)
            end_rss, cpu = rss_mib(process.pid), cpu_seconds(process.pid)
            events = churning.events
        lost = drift(client, None)
        back = drift(client, "trtllm")
        correct = all(b == "trtllm" for b in backends(client))
        peak = max(peak, rss_mib(process.pid))
    finally:
        operator.stop()
    return {
        "variant": variant,
        "ready_s": round(ready_s, 1),
        "rss_ready": round(ready_rss),
        "rss_peak": round(peak),
        "rss_end": round(end_rss),
        "cpu_ready_s": round(ready_cpu, 2),
        "cpu_watch_s": round(cpu - ready_cpu, 2),
        "churn_events": events,
        "drift_lost_s": round(lost, 2),
        "drift_back_s": round(back, 2),
        "correct": correct,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gpu-every", type=int, default=5, help="one node in this many is a GPU node")
    parser.add_argument("--managed", type=int, default=2_000, help="pods the policy manages")
    parser.add_argument(
        "--unmanaged",
        type=int,
        nargs="+",
        default=[0, 20_000],
        help="unmanaged pod counts to measure at, in rising order (the curve); every variant runs at each",
    )
    parser.add_argument("--churn", type=float, default=100.0, help="unmanaged pods created (and deleted) a second")
    parser.add_argument("--drift-pods", type=int, default=100)
    parser.add_argument("--before", type=Path, help="source tree of the operator to compare with")
    parser.add_argument("--rounds", type=int, default=1, help="rounds at the last step")
    parser.add_argument("--watch", type=float, default=30.0, help="seconds measured after ready (with the churn)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fiar-fleet-"))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    print(
        f"# {args.nodes} nodes ({args.nodes // args.gpu_every} GPU), {args.managed} managed pods "
        f"({args.drift_pods} on the drift node), unmanaged steps {args.unmanaged}, churn {args.churn}/s; "
        f"work in {workdir}"
    )
    plane = ControlPlane(workdir / "plane", Tier.A)
    plane.start()
    try:
        decision = prepare(plane, args.drift_pods)
        populate_nodes(plane, args.nodes, args.gpu_every)
        populate(plane, args.nodes, args.gpu_every, range(args.managed - args.drift_pods), True, decision)
        variants: list[tuple[str, Path | None]] = [("after", None)]
        if args.before is not None:
            variants.insert(0, ("before", args.before))
        made = 0
        for step in args.unmanaged:
            populate(plane, args.nodes, args.gpu_every, range(1_000_000 + made, 1_000_000 + step), False, decision)
            made = step
            last = step == args.unmanaged[-1]
            for _ in range(args.rounds if last else 1):
                for variant, source in variants:
                    result = run_operator(plane, variant, source, workdir, args.watch, args.churn, args.nodes)
                    shape = {"nodes": args.nodes, "managed": args.managed, "unmanaged": step, "churn": args.churn}
                    print(json.dumps({**shape, **result}), flush=True)
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
