"""What the operator's indexes hold at fleet scale, this tree beside another, in one run.

Each tree's ``Store`` is filled in a fresh process with ``--nodes`` nodes and ``--pods`` bound pods
of ``operator_fleet.py``'s shapes (a vLLM Deployment's pods on GPU nodes), each object decoded from
JSON as a watch event is, through the tree's own ``kinds`` rows. Reported per tree, alternated over
``--runs``: the Python heap the nodes and the pods keep (tracemalloc), bytes per pod, the process's
RSS growth over the imports (a run without tracemalloc) and the CPU microseconds per pod indexed.

    .venv/bin/python bench/operator_index_memory.py [--before TREE] [--nodes 10000 --pods 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import gc, json, sys, time, tracemalloc
from operator_fleet import NAMESPACES, node_body, pod_body
from fiar_operator.state import kinds
from fiar_operator.state.store import Store

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))

nodes, pods, traced = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
node_docs = [json.dumps(node_body(i)) for i in range(nodes)]
pod_docs = []
for i in range(pods):
    body = pod_body(i, f"node-{i // 2:05d}", f"fleet-{i % NAMESPACES}")
    body["metadata"].update(uid=f"6f1c2d3e-{i:04x}-4a5b-8c7d-0123456789ab", resourceVersion=str(100_000 + i))
    pod_docs.append(json.dumps(body))
gc.collect()
base = rss()
if traced:
    tracemalloc.start()
store = Store()
for doc in node_docs:
    kinds.NODES.put(store, json.loads(doc))
gc.collect()
after_nodes = tracemalloc.get_traced_memory()[0] if traced else 0
cpu = time.process_time()
for doc in pod_docs:
    kinds.PODS.put(store, json.loads(doc))
cpu = time.process_time() - cpu
gc.collect()
after_pods = tracemalloc.get_traced_memory()[0] if traced else 0
print(json.dumps({"nodes_mib": after_nodes / 2**20, "pods_mib": (after_pods - after_nodes) / 2**20,
                  "rss_growth_mib": rss() - base, "us_per_pod": cpu * 1e6 / pods}))
"""


def measure(tree: Path, nodes: int, pods: int, traced: bool) -> dict[str, float]:
    path = os.pathsep.join(str(p) for p in (tree / "operator", tree, ROOT / "bench", ROOT / "tools"))
    argv = [sys.executable, "-c", CHILD, str(nodes), str(pods), "1" if traced else "0"]
    out = subprocess.run(argv, env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another source tree (e.g. a git worktree)")
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    trees = [("before", args.before)] if args.before else []
    trees.append(("after", ROOT))
    found: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for _ in range(args.runs):
        for name, tree in trees:
            heap = measure(tree, args.nodes, args.pods, traced=True)
            plain = measure(tree, args.nodes, args.pods, traced=False)
            found[name].append({**heap, "rss_growth_mib": plain["rss_growth_mib"], "us_per_pod": plain["us_per_pod"]})
    print(f"{args.nodes} nodes, {args.pods} pods; medians of {args.runs} runs (fresh processes, alternated)")
    header = f"{'tree':8} {'nodes MiB':>10} {'pods MiB':>9} {'B per pod':>10} {'RSS growth MiB':>15}"
    print(f"{header} {'CPU µs per pod':>15}")
    for name, runs in found.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(
            f"{name:8} {med['nodes_mib']:10.1f} {med['pods_mib']:9.1f} {med['pods_mib'] * 2**20 / args.pods:10.0f} "
            f"{med['rss_growth_mib']:15.1f} {med['us_per_pod']:15.1f}"
        )


if __name__ == "__main__":
    main()
