"""Latency of the operator's admission webhooks answering from memory.

Builds the operator's in-memory indexes at cluster scale (nodes, namespaces, policies, pods), then
times whole AdmissionReview round trips through ``Admission`` (JSON parse, lookup, decision, JSONPatch,
response): the work done per request, without the HTTP server. Optionally also times the HTTPS server
end to end on 127.0.0.1 (``--https``), which adds TLS, aiohttp and the client.

    .venv/bin/python bench/operator_admission_latency.py [--nodes 5000] [--pods 50000] [--https]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import fiar_contract as contract
from fiar_operator.admission.review import Admission, parse_review
from fiar_operator.core.metrics import Metrics
from fiar_operator.state.store import Store

VERDICTS = ("mnnvl", "trtllm", "none")


def build_store(nodes: int, pods: int, namespaces: int, policies: int) -> Store:
    store = Store()
    for i in range(nodes):
        labels = {contract.LABEL_BACKEND: VERDICTS[i % 3], "kubernetes.io/hostname": f"gpu-{i}"}
        store.put_node({"metadata": {"name": f"gpu-{i}", "resourceVersion": "1", "labels": labels}})
    for i in range(namespaces):
        store.put_namespace({"metadata": {"name": f"ns-{i}", "labels": {"team": f"t{i % 10}"}}})
    store.put_namespace({"metadata": {"name": "web", "labels": {"team": "web"}}})
    for i in range(policies):
        store.put_policy({"metadata": {"name": f"policy-{i}"}, "spec": {
            "podSelector": {"matchLabels": {"app": f"vllm-{i}"}},
            "namespaceSelector": {"matchLabels": {"team": f"t{i % 10}"}}, "priority": i % 3}})
    for i in range(pods):
        labels = {"app": f"vllm-{i % policies}"}
        if i % 2 == 0:
            labels[contract.LABEL_POD_POLICY] = f"policy-{i % policies}"
        store.put_pod({"metadata": {"name": f"pod-{i}", "namespace": f"ns-{i % namespaces}", "uid": f"u-{i}",
                                    "labels": labels, "resourceVersion": "1"}, "spec": {}})
    return store


def review(request: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "8b2c7d5e-0000-4000-8000-000000000000", **request}}).encode()


def binding(namespace: str, name: str, uid: str, node: str) -> bytes:
    return review({"operation": "CREATE", "namespace": namespace, "name": name, "subResource": "binding",
                   "kind": {"group": "", "version": "v1", "kind": "Binding"},
                   "resource": {"group": "", "version": "v1", "resource": "pods"},
                   "userInfo": {"username": "system:kube-scheduler"},
                   "object": {"apiVersion": "v1", "kind": "Binding",
                              "metadata": {"name": name, "namespace": namespace, "uid": uid},
                              "target": {"apiVersion": "v1", "kind": "Node", "name": node}}})


def vllm_pod(namespace: str, app: str) -> bytes:
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.26.0",
                 "args": ["--model", "m", "--tensor-parallel-size", "8"],
                 "env": [{"name": "HF_HOME", "value": "/cache"}],
                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    return review({"operation": "CREATE", "namespace": namespace,
                   "resource": {"group": "", "version": "v1", "resource": "pods"},
                   "object": {"metadata": {"generateName": f"{app}-7d9f8c-", "labels": {"app": app}},
                              "spec": {"containers": [container, {"name": "sidecar", "image": "envoy"}]}}})


def timed(fn: Callable[[], Any], rounds: int) -> dict[str, float]:
    for _ in range(min(1000, rounds)):
        fn()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - started) / 1000)
    samples.sort()
    return {"p50_us": samples[len(samples) // 2], "p99_us": samples[int(len(samples) * 0.99)],
            "mean_us": statistics.fmean(samples), "max_us": samples[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--namespaces", type=int, default=200)
    parser.add_argument("--policies", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--https", action="store_true", help="also time the HTTPS server end to end")
    args = parser.parse_args()

    started = time.perf_counter()
    store = build_store(args.nodes, args.pods, args.namespaces, args.policies)
    admission = Admission(store, Metrics(store.sizes))
    built = time.perf_counter() - started
    # A pod admitted here (generated name), whose watch event has not arrived: found in the memo.
    admission.pod_create(parse_review(vllm_pod("ns-4", "vllm-4")))
    cases = {
        "binding: managed pod, from the pod index": binding("ns-0", "pod-0", "u-0", "gpu-1"),
        "binding: managed pod, before its watch event (admission memo)": binding("ns-4", "vllm-4-7d9f8c-x2k4q",
                                                                                 "u-new", "gpu-0"),
        "binding: unmanaged pod in a covered namespace": binding("ns-1", "pod-1", "u-1", "gpu-2"),
        "binding: namespace no policy covers": binding("web", "web-1", "u-w", "gpu-2"),
        "pod CREATE: vLLM pod, env + label + annotations": vllm_pod("ns-3", "vllm-3"),
    }
    results: dict[str, Any] = {}
    for name, body in cases.items():
        handler = admission.pod_create if name.startswith("pod CREATE") else admission.binding
        answer = handler(parse_review(body))
        assert isinstance(answer, dict), f"{name}: needed an API read"
        results[name] = timed(lambda body=body, handler=handler: handler(parse_review(body)), args.rounds)
    print(f"indexes: {args.nodes} nodes, {args.pods} pods, {args.namespaces} namespaces, {args.policies} policies "
          f"(built in {built:.1f}s); {platform.python_implementation()} {platform.python_version()}, "
          f"{platform.machine()}")
    print(f"{'case':66} {'p50 µs':>8} {'p99 µs':>8} {'mean µs':>8}")
    for name, r in results.items():
        print(f"{name:66} {r['p50_us']:8.1f} {r['p99_us']:8.1f} {r['mean_us']:8.1f}")
    if args.https:
        https(admission, store, cases, min(args.rounds, 2000))


def https(admission: Admission, store: Store, cases: dict[str, bytes], rounds: int) -> None:
    """End-to-end HTTPS round trips on 127.0.0.1 with a keep-alive client (as the API server does)."""
    import http.client
    import ssl
    import tempfile
    from pathlib import Path

    from devcluster import pki  # the test harness's tiny CA
    from fiar_operator.admission.server import Server
    from fiar_operator.core.settings import Settings

    ca = pki.CertificateAuthority()
    workdir = Path(tempfile.mkdtemp())
    crt, key = ca.issue("bench", hosts=("127.0.0.1",)).write(workdir, "serving")
    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    settings = Settings(webhook_host="127.0.0.1", webhook_port=0, tls_cert=crt, tls_key=key, metrics_port=None)
    server = Server(admission, admission.metrics, settings, None, lambda: store.synced)
    server.start()
    ctx = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx)
    print(f"\nHTTPS round trip on 127.0.0.1 (keep-alive), {rounds} requests each")
    for name, body in cases.items():
        path = "/mutate/pods" if name.startswith("pod CREATE") else "/mutate/binding"

        def call(body: bytes = body, path: str = path) -> None:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            assert response.status == 200

        r = timed(call, rounds)
        print(f"{name:66} {r['p50_us']:8.1f} {r['p99_us']:8.1f} {r['mean_us']:8.1f}")
    connection.close()
    server.stop()


if __name__ == "__main__":
    main()
