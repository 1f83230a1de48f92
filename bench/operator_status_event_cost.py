"""What one policy event costs the reconciler at fleet scale, before and after, side by side.

The operator rewrites a policy's status every half second while its pods change, and each write
comes back as a MODIFIED policy. This benchmark indexes 20,000 running managed pods of one policy
on 10,000 nodes (no API server: the pods' PATCHes are answered in memory), then times on the
reconciler's path (``Runtime.apply_all``) the CPU of five status-only events and of one event with
a new generation (a spec change), for each source tree in a child process of its own.

    .venv/bin/python bench/operator_status_event_cost.py --before /tmp/fiar-before
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PODS, NODES = 20_000, 10_000


def measure() -> dict[str, Any]:
    import fiar_contract as contract
    from fiar_operator.core.settings import Settings
    from fiar_operator.runtime import Runtime
    from fiar_operator.state import kube
    from fiar_operator.state.changes import change_of

    pods: dict[tuple[str, str], dict[str, Any]] = {}

    class InMemory(kube.Kube):
        """Answers pod PATCHes from memory."""

        def __init__(self) -> None:
            pass

        def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Any) -> dict[str, Any]:
            patched = copy.deepcopy(pods[(namespace, name)])
            patched["metadata"]["annotations"].update(annotations)
            patched["metadata"]["resourceVersion"] = str(int(patched["metadata"]["resourceVersion"]) + 1)
            pods[(namespace, name)] = patched
            return patched

    runtime = Runtime(Settings(metrics_port=None, standalone=True), InMemory())
    policy: dict[str, Any] = {
        "metadata": {"name": "vllm", "uid": "p-1", "generation": 1, "resourceVersion": "1"},
        "spec": {"podSelector": {}},
    }
    runtime.store.put_namespace({"metadata": {"name": "ml", "labels": {}}})
    runtime.store.put_policy(policy)
    for i in range(NODES):
        runtime.store.put_node({"metadata": {"name": f"gpu-{i}", "labels": {contract.LABEL_BACKEND: "trtllm"}}})
    for i in range(PODS):
        pod = {
            "metadata": {
                "name": f"vllm-{i}",
                "namespace": "ml",
                "uid": f"uid-{i}",
                "resourceVersion": "1",
                "labels": {contract.LABEL_POD_POLICY: "vllm"},
                "annotations": {},
            },
            "spec": {
                "nodeName": f"gpu-{i % NODES}",
                "containers": [{"name": "vllm", "image": "vllm/vllm-openai", "command": ["vllm", "serve", "m"]}],
            },
            "status": {"phase": "Running"},
        }
        pods[("ml", f"vllm-{i}")] = pod
        runtime.store.put_pod(pod)
    for _ in range(2):  # the first sight of the policy decides every pod; the second finds them decided
        runtime.reconciler.apply_all([change_of("policies", "MODIFIED", policy)])

    def timed(obj: dict[str, Any]) -> float:
        runtime.store.put_policy(obj)
        began = time.process_time()
        runtime.reconciler.apply_all([change_of("policies", "MODIFIED", obj)])
        return time.process_time() - began

    status_only = []
    for k in range(5):
        written = copy.deepcopy(policy)
        written["metadata"]["resourceVersion"] = str(2 + k)
        written["status"] = {"pods": {"managed": PODS}, "observedAt": k}
        status_only.append(timed(written))
    new_spec = copy.deepcopy(policy)
    new_spec["metadata"].update(generation=2, resourceVersion="10")
    return {"status_event_cpu_s": status_only, "new_generation_cpu_s": timed(new_spec)}


def run(tree: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "operator"), str(tree)])}
    out = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, check=True, capture_output=True, text=True, timeout=600
    )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="source tree to compare with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure()))
        return
    print(f"# {PODS} running managed pods of one policy on {NODES} nodes; CPU seconds on the reconciler's path")
    here = Path(__file__).resolve().parent.parent
    trees = ([("before", args.before)] if args.before else []) + [("after", here)]
    results = {name: run(tree) for name, tree in trees}
    for name, result in results.items():
        events = result["status_event_cpu_s"]
        print(
            json.dumps(
                {
                    "tree": name,
                    "status_event_cpu_s": [round(t, 4) for t in events],
                    "status_event_mean_s": round(sum(events) / len(events), 4),
                    "new_generation_cpu_s": round(result["new_generation_cpu_s"], 3),
                }
            )
        )


if __name__ == "__main__":
    main()
