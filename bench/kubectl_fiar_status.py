"""``kubectl fiar status`` at fleet scale, beside ``kubectl get nodes -L ...``, in one run on one control plane.

A local control plane (etcd + kube-apiserver) is filled with ``--nodes`` GPU nodes, each labelled as
the agent labels it and carrying a real probe report (the one ``fiar-agent probe --simulate`` writes
for a host fixture, one fixture per node in turn: about 3-6 KB each), and ``--pods`` managed vLLM
pods bound to them (the ``fiar.io/policy`` label, the operator's annotations and decision, the env
fieldRef), plus the policy with a status. Then, alternated ``--rounds`` times, each command runs as
a child process with its output to /dev/null, and is measured:

    wall       seconds from start to exit
    peak RSS   the child's maximum resident set (GNU time's %M)

Commands: ``kubectl fiar status`` (text), ``kubectl fiar status -o json``, ``kubectl fiar report
--html``, and as the baseline ``kubectl get nodes -L <fiar's labels>`` (server-side table; it reads
no pod and no report) and ``kubectl get pods -A -l fiar.io/policy``.

    PYTHONPATH=tools .venv/bin/python bench/kubectl_fiar_status.py [--nodes 10000 --pods 20000 --rounds 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import fiar_contract as contract
from devcluster import build
from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for
from fiar_operator import crd
from fiar_operator.core.errors import Conflict
from fiar_operator.state import kube

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "node_agent" / "fixtures").glob("*.json"))
BIN = Path(sys.executable).parent
NAMESPACES = 20


def reports() -> list[dict[str, Any]]:
    """The report the agent writes for each fixture (its own code, through its CLI)."""
    found = []
    for fixture in FIXTURES:
        out = subprocess.run(
            [str(BIN / "fiar-agent"), "probe", "--simulate", str(fixture), "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        found.append(json.loads(out.stdout))
    return found


def node_body(i: int, report: dict[str, Any]) -> dict[str, Any]:
    name = f"gpu-{i:05d}"
    doc = {**report, "node": name}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "nvidia.com/gpu.present": "true",
        "topology.kubernetes.io/zone": f"zone-{i % 3}",
        **doc["labels"],
    }
    cap = {"cpu": "192", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": labels.get(contract.LABEL_GPUS, "8")}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {contract.ANNOTATION_PROBE_REPORT: json.dumps(doc, separators=(",", ":"))},
        },
        "status": {"capacity": cap, "allocatable": cap},
    }


def pod_body(i: int, node: str, verdict: str) -> dict[str, Any]:
    backend = verdict if verdict in contract.BACKENDS else "auto"
    fusion = "on" if verdict in contract.BACKENDS else "off"
    decision = {
        "backend": backend,
        "fusion": fusion,
        "node": node,
        "nodeVerdict": verdict,
        "policy": "vllm",
        "reason": "Verified" if fusion == "on" else "NotVerified",
        "trigger": "binding",
        "time": "2026-12-02T06:00:00Z",
    }
    ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{contract.ANNOTATION_POD_BACKEND}']"}}
    env = [{"name": f"VLLM_SETTING_{k}", "value": f"value-{k}"} for k in range(10)]
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.26.0",
        "command": ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "8"],
        "env": [*env, {"name": contract.ENV_VAR, "valueFrom": ref}],
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"vllm-{i:05d}",
            "namespace": f"fleet-{i % NAMESPACES}",
            "labels": {"app": "vllm", contract.LABEL_POD_POLICY: "vllm"},
            "annotations": {
                contract.ANNOTATION_POD_BACKEND: backend,
                contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: contract.FUSE_ALLREDUCE_RMS[fusion],
                contract.ANNOTATION_POD_DECISION: json.dumps(decision),
            },
        },
        "spec": {
            "nodeName": node,
            "containers": [container],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def parallel(fn: Callable[[Any], Any], items: Iterable[Any], workers: int = 24) -> None:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass


def create(client: kube.Kube, path: str, body: dict[str, Any]) -> None:
    with contextlib.suppress(Conflict):
        client.call("POST", path, body=body, timeout=30.0)


def populate(plane: ControlPlane, nodes: int, pods: int) -> None:
    client = kube.Kube(plane.api_client(), pool_size=32)
    client.apply(kube.CRDS, crd.definition())
    wait_for(
        lambda: any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (
                (client.call("GET", f"{kube.CRDS}/fiallreducepolicies.fiar.io").get("status") or {}).get("conditions")
                or []
            )
        ),
        30,
        "CRD established",
    )
    for n in range(NAMESPACES):
        create(client, kube.NAMESPACES, {"metadata": {"name": f"fleet-{n}"}})
    docs = reports()
    verdicts = [d["labels"][contract.LABEL_BACKEND] for d in docs]
    started = time.monotonic()
    parallel(lambda i: create(client, kube.NODES, node_body(i, docs[i % len(docs)])), range(nodes))
    print(f"# {nodes} nodes in {time.monotonic() - started:.0f}s", flush=True)
    started = time.monotonic()
    per_node = max(1, pods // max(nodes, 1))
    parallel(
        lambda i: create(
            client,
            f"/api/v1/namespaces/fleet-{i % NAMESPACES}/pods",
            pod_body(i, f"gpu-{(i // per_node) % nodes:05d}", verdicts[((i // per_node) % nodes) % len(docs)]),
        ),
        range(pods),
    )
    print(f"# {pods} pods in {time.monotonic() - started:.0f}s", flush=True)
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}"
    create(
        client,
        path,
        {
            "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
            "kind": contract.KIND,
            "metadata": {"name": "vllm"},
            "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}},
        },
    )
    counts = {
        "decided": pods * 4 // 7,
        "fallback": pods * 3 // 7,
        "pending": 0,
        "fusionOff": pods * 3 // 7,
        "stale": 0,
        "unconfigured": 0,
        "fusionUncontrolled": 0,
    }
    client.call(
        "PATCH",
        f"{path}/vllm/status",
        body={"status": {"pods": counts}},
        content_type="application/merge-patch+json",
        timeout=30.0,
    )


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one run, output discarded. GNU time forks the command from its
    own small process: a child forked from this one would start with this process's resident set."""
    started = time.monotonic()
    with open(os.devnull, "w") as sink:
        proc = subprocess.run(
            ["/usr/bin/time", "-f", "%M", *argv], stdout=sink, stderr=subprocess.PIPE, env=env, text=True, check=False
        )
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return wall, int(proc.stderr.strip().splitlines()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fiar-kubectl-"))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    print(f"# {args.nodes} nodes, {args.pods} managed pods, {args.rounds} rounds; work in {workdir}", flush=True)
    plane = ControlPlane(workdir / "plane", Tier.A)
    plane.start()
    try:
        populate(plane, args.nodes, args.pods)
        kubectl = str(build.binary_path("kubectl"))
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "KUBECONFIG": str(plane.kubeconfig)}
        labels = ",".join(
            (
                contract.LABEL_BACKEND,
                contract.LABEL_MULTICAST,
                *contract.RESULT_LABELS,
                contract.LABEL_GPUS,
                contract.LABEL_CLIQUE,
            )
        )
        commands = {
            "kubectl get nodes -L <fiar labels>": [kubectl, "get", "nodes", "-L", labels],
            "kubectl get pods -A -l fiar.io/policy": [kubectl, "get", "pods", "-A", "-l", contract.LABEL_POD_POLICY],
            "kubectl fiar status": [kubectl, "fiar", "status"],
            "kubectl fiar status -o json": [kubectl, "fiar", "status", "-o", "json"],
            "kubectl fiar report --html": [kubectl, "fiar", "report", "--html", str(workdir / "fleet.html")],
        }
        measure(commands["kubectl get nodes -L <fiar labels>"], env)  # warm the API server's caches
        found: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
        for _ in range(args.rounds):
            for name, argv in commands.items():
                found[name].append(measure(argv, env))
                print(
                    json.dumps(
                        {
                            "command": name,
                            "wall_s": round(found[name][-1][0], 2),
                            "rss_mib": round(found[name][-1][1], 1),
                        }
                    ),
                    flush=True,
                )
        base_wall = statistics.median(w for w, _ in found["kubectl get nodes -L <fiar labels>"])
        base_rss = statistics.median(r for _, r in found["kubectl get nodes -L <fiar labels>"])
        print(f"\n| command | wall s (median of {args.rounds}) | x get nodes | peak RSS MiB | x get nodes |")
        print("|---|---|---|---|---|")
        for name, runs in found.items():
            wall, rss = statistics.median(w for w, _ in runs), statistics.median(r for _, r in runs)
            print(f"| `{name}` | {wall:.2f} | {wall / base_wall:.1f} | {rss:.0f} | {rss / base_rss:.1f} |")
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
