"""Whether Kyverno, with fiar's job written as its policies, gives the demo's pods the values fiar gives.

On the demo's plane (tier C: scheduler, kwok nodes, one simulated agent per host fixture, each
labelling its node), fiar's operator deploys the demo's vLLM Deployment as ``make demo`` does, and
each pod's values are read: the annotation ``fiar.io/backend`` and the ``vllm`` container's
``VLLM_FLASHINFER_ALLREDUCE_BACKEND`` entry. Then that Deployment is deleted, and the same Deployment
goes to a namespace fiar ignores (label ``fiar.io/ignore``), with Kyverno running the policies of
bench/kyverno for that namespace; its pods are read the same way. One row per node, as Markdown.

    PYTHONPATH=tools:bench .venv/bin/python bench/kyverno_same_values.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import kyverno_peer

import fiar_contract as contract
from devcluster import demo
from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for
from fiar_operator.state import kube

KYVERNO_NS = "inference-kyverno"
DECIDED = (
    "(contains(['mnnvl', 'trtllm'], metadata.labels.\"fiar.io/backend\" || '') && metadata.labels.\"fiar.io/backend\")"
    " || (metadata.labels.\"fiar.io/trtllm\" == 'pass' && 'trtllm') || 'auto'"
)
"""The binding rule's JMESPath that follows fiar's rule for one pod under the demo's policy (every
backend allowed, fallback auto): the node's verdict where it names a backend, else trtllm where the
node's trtllm smoke test passed, else auto. The sample's reading copies the label, ``none`` included."""
DEPLOYMENTS = "/apis/apps/v1/namespaces/{}/deployments"


def pod_values(client: kube.Kube, namespace: str) -> dict[str, dict[str, str]]:
    """Node -> what its pod of the demo's Deployment got: backend annotation, env entry, fusion."""
    pods = client.call("GET", f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": "app.kubernetes.io/name=vllm"})
    out: dict[str, dict[str, str]] = {}
    for pod in pods["items"]:
        annotations = pod["metadata"].get("annotations") or {}
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")
        entry = next((e for e in container.get("env") or [] if e["name"] == contract.ENV_VAR), None)
        if entry is None:
            env = "missing"
        elif "value" in entry:
            env = f"value {entry['value']}"
        else:
            env = f"fieldRef {entry['valueFrom']['fieldRef']['fieldPath']}"
        out[pod["spec"].get("nodeName") or "?"] = {
            "backend": annotations.get(contract.ANNOTATION_POD_BACKEND, "missing"),
            "env": env,
            "fusion": annotations.get("fiar.io/fuse-allreduce-rms", "-"),
        }
    return out


def running(client: kube.Kube, namespace: str, replicas: int) -> bool:
    pods = client.call("GET", f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": "app.kubernetes.io/name=vllm"})
    items = pods["items"]
    return len(items) == replicas and all((p.get("status") or {}).get("phase") == "Running" for p in items)


def table(nodes: dict[str, dict[str, str]], fiar: dict[str, dict[str, str]], peer: dict[str, dict[str, str]]) -> str:
    rows = [
        "| node | node's fiar.io/backend | fiar.io/trtllm | fiar: pod backend | Kyverno: pod backend "
        "| env entry (fiar / Kyverno) | fiar's fusion | same |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for node in sorted(nodes):
        f, k = fiar.get(node, {}), peer.get(node, {})
        same = f.get("backend") == k.get("backend") and f.get("env") == k.get("env")
        env = f.get("env", "-") if f.get("env") == k.get("env") else f"{f.get('env', '-')} / {k.get('env', '-')}"
        rows.append(
            f"| {node} | {nodes[node].get(contract.LABEL_BACKEND, '-')} | {nodes[node].get('fiar.io/trtllm', '-')} "
            f"| {f.get('backend', '-')} | {k.get('backend', '-')} | {env} | {f.get('fusion', '-')} "
            f"| {'yes' if same else '**no**'} |"
        )
    return "\n".join(rows)


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="fiar-kyverno-values-"))
    plane = ControlPlane(workdir / "plane", Tier.C)
    plane.start()
    peer: kyverno_peer.KyvernoProcess | None = None
    try:
        client = kube.Kube(plane.api_client())
        fixtures = sorted(demo.FIXTURES.glob("*.json"))
        names = [demo.node_name(f) for f in fixtures]
        demo.start_operator(plane)
        demo.start_agents(plane, fixtures)

        def labelled() -> bool:
            return all(
                contract.LABEL_BACKEND in (client.call("GET", f"{kube.NODES}/{n}")["metadata"].get("labels") or {})
                for n in names
            )

        wait_for(labelled, 120, "every agent's verdict")
        demo.deploy_vllm(plane, len(fixtures))
        fiar_values = pod_values(client, demo.NAMESPACE)
        nodes = {n: client.call("GET", f"{kube.NODES}/{n}")["metadata"].get("labels") or {} for n in names}
        client.call("DELETE", f"{DEPLOYMENTS.format(demo.NAMESPACE)}/llama")
        wait_for(lambda: running(client, demo.NAMESPACE, 0), 120, "fiar's demo pods gone")

        client.call(
            "POST",
            kube.NAMESPACES,
            body={"metadata": {"name": KYVERNO_NS, "labels": {contract.NAMESPACE_IGNORE_LABEL: "true"}}},
        )
        kyverno_peer.install(client)
        readings: dict[str, dict[str, dict[str, str]]] = {}
        for reading, backend in (("sample", None), ("decided", DECIDED)):
            docs = kyverno_peer.policies({"app.kubernetes.io/name": "vllm"}, [KYVERNO_NS], backend)
            peer = kyverno_peer.start(client, plane.kubeconfig, workdir, docs)
            client.call("POST", DEPLOYMENTS.format(KYVERNO_NS), body=demo.vllm_deployment(len(fixtures)))
            wait_for(lambda: running(client, KYVERNO_NS, len(fixtures)), 120, "Kyverno's demo pods Running")
            readings[reading] = pod_values(client, KYVERNO_NS)
            client.call("DELETE", f"{DEPLOYMENTS.format(KYVERNO_NS)}/llama")
            wait_for(lambda: running(client, KYVERNO_NS, 0), 120, "Kyverno's demo pods gone")
            peer.stop()
            peer = None
            kyverno_peer.remove_webhooks(client)
        print(json.dumps({"nodes": nodes, "fiar": fiar_values, **readings}, sort_keys=True))
        for reading, values in readings.items():
            print(f"\nKyverno, binding rule {reading}:\n")
            print(table(nodes, fiar_values, values))
            same = sum(
                (fiar_values.get(n, {}).get("backend"), fiar_values.get(n, {}).get("env"))
                == (values.get(n, {}).get("backend"), values.get(n, {}).get("env"))
                for n in names
            )
            print(f"\nsame values on {same} of {len(names)} nodes")
    finally:
        if peer is not None:
            peer.stop()
        plane.stop()


if __name__ == "__main__":
    main()
