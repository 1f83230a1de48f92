"""Cost of the reconciler's bookkeeping for pods the pod webhook never configured.

The pod informer tells the reconciler of every pod change (not only of labelled pods), which checks whether a
policy selects an unlabelled pod. This times that per-event work through ``devcluster.feed.feed`` beside
the work every pod event already costs (``Store.put_pod``, the informer's indexing), in one run, and
times the full recomputation over the pod index that a policy change triggers.

    .venv/bin/python bench/operator_reconciler_cost.py [--pods 50000] [--policies 20]

No API call is made: the pods measured need no re-annotation, and events are returned, not posted.
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any

from kubernetes import client
from operator_admission_latency import timed  # the same timing loop as the admission benchmark

import fiar_contract as contract
from devcluster.feed import feed
from fiar_operator.core.settings import Settings
from fiar_operator.runtime import Runtime
from fiar_operator.state.kube import Kube


def pod(i: int, policies: int, namespaces: int, labelled: bool, app: str | None = None) -> dict[str, Any]:
    labels = {"app": app or f"vllm-{i % policies}", "pod-template-hash": "7d9f8c6b5"}
    if labelled:
        labels[contract.LABEL_POD_POLICY] = f"policy-{i % policies}"
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.26.0",
        "env": [{"name": "HF_HOME", "value": "/cache"}],
    }
    return {
        "metadata": {
            "name": f"pod-{i}",
            "namespace": f"ns-{i % namespaces}",
            "uid": f"u-{i}",
            "labels": labels,
            "resourceVersion": "1",
        },
        "spec": {"containers": [container, {"name": "sidecar", "image": "envoy"}]},
        "status": {"phase": "Pending"},
    }


def build(pods: int, namespaces: int, policies: int) -> Runtime:
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:1"  # never called
    runtime = Runtime(Settings(standalone=True, metrics_port=None), kube=Kube(cfg))
    store = runtime.store
    for i in range(namespaces):
        store.put_namespace({"metadata": {"name": f"ns-{i}", "labels": {"team": f"t{i % 10}"}}})
    for i in range(policies):
        store.put_policy(
            {
                "metadata": {"name": f"policy-{i}", "generation": 1},
                "spec": {
                    "podSelector": {"matchLabels": {"app": f"vllm-{i}"}},
                    "namespaceSelector": {"matchLabels": {"team": f"t{i % 10}"}},
                    "priority": i % 3,
                },
            }
        )
    for i in range(pods):
        # half configured by the webhook, a quarter unconfigured, a quarter not selected by any policy
        store.put_pod(pod(i, policies, namespaces, labelled=i % 2 == 0, app="web" if i % 4 == 1 else None))
    return runtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--namespaces", type=int, default=200)
    parser.add_argument("--policies", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20_000)
    args = parser.parse_args()
    runtime = build(args.pods, args.namespaces, args.policies)
    n, p = args.namespaces, args.policies

    cases = {
        "unconfigured pod (selected, no policy label)": pod(3, p, n, labelled=False),
        "pod no policy selects": pod(1, p, n, labelled=False, app="web"),
    }
    print(
        f"indexes: {args.pods} pods ({args.pods // 4} unconfigured), {n} namespaces, {p} policies; "
        f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}"
    )
    print(f"{'pod event':48} {'put_pod p50 µs':>15} {'on_pod p50 µs':>14} {'on_pod p99 µs':>14} {'ratio':>6}")
    for name, body in cases.items():
        base = timed(lambda body=body: runtime.store.put_pod(body), args.rounds)
        full = timed(lambda body=body: feed(runtime, "pods", body), args.rounds)
        ratio = full["p50_us"] / base["p50_us"]
        print(f"{name:48} {base['p50_us']:15.1f} {full['p50_us']:14.1f} {full['p99_us']:14.1f} {ratio:6.2f}")

    sweeps = []
    for generation in range(2, 12):  # a policy change each time: the whole index is recomputed
        runtime.store.put_policy(
            {
                "metadata": {"name": "policy-0", "generation": generation},
                "spec": {"podSelector": {"matchLabels": {"app": "vllm-0"}}, "priority": generation % 3},
            }
        )
        started = time.perf_counter()
        events = runtime.reconciler.unconfigured.sweep()
        sweeps.append(time.perf_counter() - started)
        assert generation > 2 or events, "the first sweep reports the unconfigured pods"
    counted = sum(len(runtime.reconciler.unconfigured.pods(name)) for name in runtime.store.policies)
    sweeps.sort()
    print(
        f"recomputation after a policy change over {args.pods} pods: median {sweeps[len(sweeps) // 2] * 1000:.1f} ms, "
        f"max {sweeps[-1] * 1000:.1f} ms ({counted} unconfigured pods found)"
    )


if __name__ == "__main__":
    main()
