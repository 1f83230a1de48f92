"""One tenant cannot leave another tenant's pods unconfigured: through the real API server, a user
who may only create pods in its own namespace sends dry-run pods (no quota used) whose planning
would walk every node with half a million values, while another tenant creates vLLM pods."""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fiar_contract as contract
from devcluster import workloads
from devcluster.cluster import ControlPlane
from fiar_operator.core.errors import ApiError
from fiar_operator.core.policy import LWS_SIZE
from fiar_operator.state import kube

from .conftest import SESSION_LABEL, Kit, Operator

NODES = 300
VICTIM_PODS = 20
ATTACKERS = 8
MNNVL = {
    **workloads.GPU_PRESENT,
    contract.LABEL_BACKEND: "mnnvl",
    contract.LABEL_MNNVL: "pass",
    contract.LABEL_CLIQUE: "clique-a",
}


class Tenant:
    """A user authenticated by a client certificate of the plane's CA, allowed by RBAC to create pods
    in one namespace and nothing else; it posts compact JSON itself (the attack's 580,000 values fit
    in the API server's 3 MiB request limit only so)."""

    def __init__(self, plane: ControlPlane, workdir: Path, user: str, namespace: str) -> None:
        assert plane.ca is not None
        self.plane, self.user, self.namespace = plane, user, namespace
        crt, key = plane.ca.issue(user, client=True).write(workdir, user)
        self.context = ssl.create_default_context(cafile=str(plane.ca_file))
        self.context.load_cert_chain(str(crt), str(key))
        admin = kube.Kube(plane.api_client())
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list"]}
        admin.call("POST", f"{rbac}/roles", body={"metadata": {"name": "pods"}, "rules": [rule]})
        binding = {
            "metadata": {"name": f"pods-{user}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        admin.call("POST", f"{rbac}/rolebindings", body=binding)

    def create(self, pod: dict[str, Any], namespace: str | None = None, dry_run: bool = False) -> tuple[int, Any]:
        address = urlsplit(self.plane.server)
        conn = http.client.HTTPSConnection(address.hostname or "", address.port, context=self.context, timeout=30)
        path = f"/api/v1/namespaces/{namespace or self.namespace}/pods" + ("?dryRun=All" if dry_run else "")
        body = json.dumps({"apiVersion": "v1", "kind": "Pod", **pod}, separators=(",", ":")).encode()
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            conn.close()


def attack_pod(node: str) -> dict[str, Any]:
    """The reported pod: a LeaderWorkerSet of size 2 bound at once to an mnnvl node, with one
    node-affinity expression of 580,000 two-character values (2.9 MB)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    values = [alphabet[i % 36] + alphabet[i // 36 % 36] for i in range(580_000)]
    expression = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": values}  # every node has it
    affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
    }
    return {
        "metadata": {"generateName": "attack-", "labels": {"app": "vllm"}, "annotations": {LWS_SIZE: "2"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}],
            "affinity": {"nodeAffinity": affinity},
        },
    }


def victim_pod(index: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"vllm-{index}", "labels": {"app": "vllm"}},
        "spec": {
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai", "args": ["--model", "m"]}],
            "nodeSelector": {"fiar-test/no-such-pool": "x"},  # stays Pending: only its admission counts
        },
    }


def configured(pod: dict[str, Any]) -> bool:
    annotations = pod["metadata"].get("annotations") or {}
    env = pod["spec"]["containers"][0].get("env") or []
    return contract.ANNOTATION_POD_DECISION in annotations and any(e.get("name") == contract.ENV_VAR for e in env)


def test_a_tenants_dry_run_pods_leave_another_tenants_pods_configured(
    operator: Operator, kit: Kit, unique: str, tmp_path: Path
) -> None:
    plane = operator.plane
    attacker_ns, victim_ns = (
        plane.create_namespace(f"op-{role}-{unique}", {SESSION_LABEL: operator.selector_value})
        for role in ("attacker", "victim")
    )
    for name in (attacker_ns, victim_ns):
        operator.wait_active(name)
    within = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [attacker_ns, victim_ns]}
        ]
    }
    kit.policy(f"tenants-{unique}", victim_ns, namespaceSelector=within)
    attacker = Tenant(plane, tmp_path, f"tenant-a-{unique}", attacker_ns)
    victim = Tenant(plane, tmp_path, f"tenant-b-{unique}", victim_ns)
    nodes = [f"mnnvl-{unique}-{i:03d}" for i in range(NODES)]
    before_nodes = operator.counter("fiar_index_objects", index="nodes")
    try:
        for name in nodes:
            plane.add_node(name, labels=MNNVL)
        kit.wait(
            lambda: operator.counter("fiar_index_objects", index="nodes") >= before_nodes + NODES,
            60,
            "the operator indexed the nodes",
        )
        assert attacker.create(victim_pod(0), namespace=victim_ns)[0] == 403  # a tenant of its namespace only

        body = attack_pod(nodes[0])
        stop, statuses = threading.Event(), Counter[Any]()
        oversized = operator.counter("fiar_admission_requests_total", webhook="pods", result="oversized")
        reviews = operator.counter("fiar_admission_requests_total", webhook="pods")

        def attack() -> None:
            while not stop.is_set():
                status, _ = attacker.create(body, dry_run=True)
                statuses[status] += 1

        threads = [threading.Thread(target=attack, daemon=True) for _ in range(ATTACKERS)]
        for thread in threads:
            thread.start()
        created = []
        try:
            kit.wait(  # the attack is under way: its reviews reach the operator (the API server takes seconds)
                lambda: operator.counter("fiar_admission_requests_total", webhook="pods") >= reviews + ATTACKERS,
                120,
                "the attack's reviews reach the operator",
            )
            for i in range(VICTIM_PODS):
                status, pod = victim.create(victim_pod(i))
                assert status == 201, pod
                created.append(pod)
                time.sleep(0.25)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        assert statuses[201] >= ATTACKERS, statuses  # the attack ran, and the API server admitted its pods
        unconfigured = [p["metadata"]["name"] for p in created if not configured(p)]
        assert not unconfigured, f"{len(unconfigured)} of {VICTIM_PODS} unconfigured; attack answers {dict(statuses)}"
        answered = operator.counter("fiar_admission_requests_total", webhook="pods", result="oversized") - oversized
        assert answered >= ATTACKERS  # fiar answered the attack's reviews (unchanged, with a warning)
    finally:
        admin = kube.Kube(plane.api_client())
        for name in nodes:
            with contextlib.suppress(ApiError):
                admin.delete(kube.NODES, name)
