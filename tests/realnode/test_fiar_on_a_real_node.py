"""fiar's own chart and images on a real kubelet node (tier D): what kwok nodes cannot show.

One release (non-default name and namespace) is installed once for the module; the tests run in file
order on it: the operator's pods on the real node behind restricted Pod Security, the agent labelling
its own node from its DaemonSet pod, a rolling upgrade under a stream of pod creations, the backend
inside a vLLM stand-in container for each verdict and after drift, the fallback while the operator is
down, a hung operator restarted by its probes (timed, printed with ``-s``), and a clean uninstall.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

import fiar_contract as contract
from devcluster.binaries import helm, kubectl, set_args
from devcluster.cluster import ControlPlane
from devcluster.realnode import RealNode
from devcluster.waiting import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.realnode]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fiar"
RELEASE = "gpu-fiar"
NAMESPACE = "fiar-e2e"
SIMULATED_HOST = "h200x2-host"  # recorded 2x H200 host: multicast disabled, trtllm passes
ENV = "VLLM_FLASHINFER_ALLREDUCE_BACKEND"
FUSION_FLAG = "-cc.pass_config.fuse_allreduce_rms="
PSA = "pod-security.kubernetes.io"


@dataclass
class Release:
    plane: ControlPlane
    node: RealNode
    kwok_node: str
    install_warnings: str
    workloads: str  # a namespace the policy covers
    created: list[tuple[str, str]] = field(default_factory=list)

    def api(self) -> Any:
        return self.plane.api_client()

    def helm(self, *args: str) -> str:
        return helm(*args, "--namespace", NAMESPACE, kubeconfig=self.plane.kubeconfig).stderr


def _install_values(plane: ControlPlane, node: RealNode) -> dict[str, Any]:
    refs = {name: image for name, image in node.images.items()}
    return {
        "operator.image.repository": refs["operator"].name,
        "operator.image.tag": refs["operator"].key,
        "agent.image.repository": refs["agent-sim"].name,
        "agent.image.tag": refs["agent-sim"].key,
        "agent.simulate": SIMULATED_HOST,
        "agent.probe.benchmark": False,
        "agent.kernelCacheHostPath": str(node.dir / "kernel-cache"),
        # Operator pods on the real node, not on the kwok node beside it.
        "operator.nodeSelector.kubernetes\\.io/hostname": node.name,
    }


@pytest.fixture(scope="module")
def release(plane_d: ControlPlane) -> Iterator[Release]:
    node = plane_d.real_node
    assert node is not None
    kwok_node = f"kwok-{uuid.uuid4().hex[:6]}"
    plane_d.add_node(kwok_node)
    with plane_d.api_client() as api:
        core = client.CoreV1Api(api)
        core.patch_node(node.name, {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
        # The agent's hostPath volume needs `privileged`; the operator's pods must meet `restricted`:
        # enforce what the chart needs, warn and audit at restricted.
        core.create_namespace(
            {
                "metadata": {
                    "name": NAMESPACE,
                    "labels": {
                        f"{PSA}/enforce": "privileged",
                        f"{PSA}/warn": "restricted",
                        f"{PSA}/audit": "restricted",
                    },
                }
            }
        )
        core.create_namespace({"metadata": {"name": "workloads"}})
    proc = helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait", "--timeout", "240s",
        *set_args(_install_values(plane_d, node)), kubeconfig=plane_d.kubeconfig,
    )  # fmt: skip
    rel = Release(plane_d, node, kwok_node, proc.stderr, "workloads")
    _create_policy(rel)
    try:
        yield rel
    finally:
        helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", kubeconfig=plane_d.kubeconfig, check=False)
        with plane_d.api_client() as api:
            core = client.CoreV1Api(api)
            for ns in (NAMESPACE, "workloads"):
                core.delete_namespace(ns)
            objs = client.CustomObjectsApi(api)
            objs.delete_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, "standin")


def _create_policy(rel: Release) -> None:
    body = {
        "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": "standin"},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "vllm-standin"}},
            "backends": ["mnnvl", "trtllm"],
            "fallbackBackend": "auto",
            "placement": "Anywhere",
        },
    }
    with rel.api() as api:
        objs = client.CustomObjectsApi(api)
        created = objs.create_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, body)
        generation = created["metadata"]["generation"]
        wait_for(
            lambda: (objs.get_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, "standin")
                     .get("status") or {}).get("observedGeneration") == generation,
            60,
            "the policy observed by the operator",
        )  # fmt: skip


def _pods(rel: Release, component: str) -> list[Any]:
    with rel.api() as api:
        selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        return list(client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=selector).items)


def _ready(pod: Any) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
    )


def _audit_events(rel: Release, namespace: str) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in rel.plane.audit_log.read_text().splitlines() if line.strip()]
    return [e for e in events if (e.get("objectRef") or {}).get("namespace") == namespace]


# -- the chart's workloads -------------------------------------------------------------------------
def test_operator_pods_run_ready_on_the_real_node(release: Release) -> None:
    pods = _pods(release, "operator")
    assert len(pods) == 2
    assert all(p.spec.node_name == release.node.name and _ready(p) for p in pods), [
        (p.metadata.name, p.spec.node_name, p.status.phase) for p in pods
    ]
    # Real containers: a pod IP on the node's bridge network, a container ID from containerd.
    assert all(p.status.pod_ip.startswith(release.node.state.subnet.rsplit(".", 1)[0]) for p in pods)
    assert all(s.container_id.startswith("containerd://") for p in pods for s in p.status.container_statuses)


def test_operator_pods_meet_restricted_pod_security_and_the_agent_needs_privileged(release: Release) -> None:
    operator_pods = {p.metadata.name for p in _pods(release, "operator")}
    (agent_pod,) = (p.metadata.name for p in _pods(release, "agent"))
    # warn=restricted: helm printed the API server's warning for the agent DaemonSet's pods only.
    warnings = [line for line in release.install_warnings.splitlines() if "PodSecurity" in line]
    assert len(warnings) == 1 and 'container \\"agent\\"' in warnings[0] and "hostPath" in warnings[0], warnings
    # audit=restricted: the operator pods were created without a finding, the agent's pod with one.
    # (Controllers create pods by generateName: the audit event names the controller, not the pod.)
    findings: dict[str, list[str]] = {"replicaset-controller": [], "daemon-set-controller": []}
    for event in _audit_events(release, NAMESPACE):
        controller = event.get("userAgent", "").rsplit("/", 1)[-1]
        if event["verb"] == "create" and event["stage"] == "ResponseComplete" and controller in findings:
            findings[controller].append((event.get("annotations") or {}).get(f"{PSA}/audit-violations", ""))
    assert len(findings["replicaset-controller"]) >= len(operator_pods), findings
    assert set(findings["replicaset-controller"]) == {""}, findings
    assert findings["daemon-set-controller"] and all("hostPath" in f for f in findings["daemon-set-controller"])
    # Enforcing restricted would reject only the agent (the API server checks, nothing is changed).
    proc = kubectl(
        release.plane.kubeconfig, "label", "--dry-run=server", "--overwrite", "namespace", NAMESPACE,
        f"{PSA}/enforce=restricted",
    )  # fmt: skip
    assert agent_pod in proc.stderr, proc.stderr
    assert not any(name in proc.stderr for name in operator_pods), proc.stderr


def test_agent_labels_its_own_node_through_its_service_account(release: Release) -> None:
    node = release.node
    with release.api() as api:
        core = client.CoreV1Api(api)
        labels = wait_for(
            lambda: (
                (core.read_node(node.name).metadata.labels or {}).get(contract.LABEL_BACKEND)
                and core.read_node(node.name).metadata.labels
            ),
            120,
            "the agent's verdict on the real node",
        )
        assert labels[contract.LABEL_BACKEND] == "trtllm"
        assert labels[contract.LABEL_MULTICAST] == "disabled"
        report = json.loads(core.read_node(node.name).metadata.annotations[contract.ANNOTATION_PROBE_REPORT])
        assert "simulated" in json.dumps(report)
        (agent,) = _pods(release, "agent")
        assert agent.spec.node_name == node.name
        # The token the kubelet mounted into the agent's container: bound to its pod, hence its node.
        token_files = list((node.dir / "kubelet" / "pods" / agent.metadata.uid / "volumes").glob(
            "kubernetes.io~projected/*/token"))  # fmt: skip
        assert token_files, "no service-account token mounted into the agent pod"
        token = token_files[0].read_text()
    as_agent = release.plane.write_kubeconfig(node.dir / "agent.kubeconfig", "agent", token=token)
    # One of the contract's labels, written again with the value it has: allowed on its own node only;
    # a fiar.io/ label outside the contract is refused there too.
    gpus = f"{contract.LABEL_GPUS}={labels[contract.LABEL_GPUS]}"
    own = kubectl(as_agent, "label", "node", node.name, gpus, "--overwrite", check=False)
    other = kubectl(as_agent, "label", "node", release.kwok_node, gpus, "--overwrite", check=False)
    extra = kubectl(as_agent, "label", "node", node.name, "fiar.io/e2e=own", "--overwrite", check=False)
    assert own.returncode == 0, own.stderr
    assert other.returncode != 0 and "denied" in other.stderr, other.stderr
    assert extra.returncode != 0 and "its own fiar.io/ labels" in extra.stderr, extra.stderr


# -- upgrade under load ----------------------------------------------------------------------------
@dataclass
class Creator:
    """Creates a policy-selected pod every 0.2 s and counts the ones refused or left unmutated."""

    rel: Release
    namespace: str
    created: int = 0
    failed: list[str] = field(default_factory=list)
    unmutated: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with self.rel.api() as api:
            core = client.CoreV1Api(api)
            while not self.stop.is_set():
                body = _standin_pod(f"roll-{self.created}", node=self.rel.kwok_node)
                try:
                    pod = core.create_namespaced_pod(self.namespace, body)
                except ApiException as exc:
                    self.failed.append(f"{exc.status} {exc.reason}")
                else:
                    if contract.LABEL_POD_POLICY not in (pod.metadata.labels or {}):
                        self.unmutated.append(pod.metadata.name)
                self.created += 1
                self.stop.wait(0.2)


def test_helm_upgrade_rolls_the_operator_without_a_failed_or_unmutated_pod(release: Release) -> None:
    with release.api() as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "roll"}})
    creator = Creator(release, "roll")
    thread = threading.Thread(target=creator.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: creator.created >= 5, 30, "pods created before the upgrade")
        before = creator.created
        # A replica more, and a changed argument: every operator pod is replaced. The agent goes
        # (the tests after this one set the node's verdicts themselves).
        values = {"operator.replicas": 3, "operator.verbose": True, "agent.enabled": False}
        release.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout", "240s", *set_args(values))
        wait_for(lambda: len([p for p in _pods(release, "operator") if _ready(p)]) == 3, 120, "3 ready operator pods")
        during = creator.created
        wait_for(lambda: creator.created >= during + 5, 30, "pods created after the upgrade")
    finally:
        creator.stop.set()
        thread.join(10)
    print(f"\npods created during the upgrade: {during - before}, in all: {creator.created}")
    assert creator.failed == [] and creator.unmutated == [], (creator.failed, creator.unmutated)
    pods = _pods(release, "operator")
    assert len(pods) == 3 and all("--verbose" in " ".join(p.spec.containers[0].args) for p in pods)
    assert not _pods(release, "agent")
    with release.api() as api:
        client.CoreV1Api(api).delete_namespace("roll")


# -- the value inside the workload -------------------------------------------------------------------
def _standin_pod(name: str, node: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "vllm",
                "image": "placeholder",  # set by _image
                "imagePullPolicy": "Never",
                # Exec form `vllm serve` (the stand-in is /usr/local/bin/vllm): fiar controls its fusion.
                "command": ["vllm"],
                "args": ["serve", "/models/stand-in", "--tensor-parallel-size", "2"],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "terminationGracePeriodSeconds": 2,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "vllm-standin", **(labels or {})}},
        "spec": spec,
    }


def _standin_on_real_node(rel: Release, name: str, namespace: str | None = None) -> dict[str, Any]:
    """A stand-in pod the scheduler binds to the real node (through the binding webhook)."""
    body = _standin_pod(name)
    body["spec"]["containers"][0]["image"] = rel.node.images["vllm-standin"].ref
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": rel.node.name}
    with rel.api() as api:
        client.CoreV1Api(api).create_namespaced_pod(namespace or rel.workloads, body)
    rel.created.append((namespace or rel.workloads, name))
    return body


def _printed(rel: Release, name: str, namespace: str | None = None, restarts: int = 0) -> dict[str, Any]:
    """What the stand-in printed in its (``restarts``-th) run: argv and environment."""
    ns = namespace or rel.workloads
    with rel.api() as api:
        core = client.CoreV1Api(api)

        def started() -> str | None:
            pod = core.read_namespaced_pod(name, ns)
            statuses = pod.status.container_statuses or []
            if statuses and statuses[0].restart_count >= restarts and statuses[0].state.running is not None:
                return str(statuses[0].container_id).split("://", 1)[1]
            return None

        container_id = wait_for(started, 120, f"{name} running (restart {restarts})")

        def line() -> dict[str, Any] | None:
            # Only the line of that very container: its cgroup path carries its ID.
            log = core.read_namespaced_pod_log(name, ns, container="vllm")
            for text in log.splitlines():
                if text.startswith("FIAR-STANDIN "):
                    doc: dict[str, Any] = json.loads(text.split(" ", 1)[1])
                    if container_id in doc["cgroup"]:
                        return doc
            return None

        return wait_for(line, 30, f"{name} printed its environment")


def _set_verdict(rel: Release, backend: str, trtllm: str | None, usable: str | None = None) -> None:
    labels = {contract.LABEL_BACKEND: backend, contract.LABEL_TRTLLM: trtllm}
    if usable is not None:
        labels[contract.LABEL_MULTICAST_USABLE] = usable
    with rel.api() as api:
        client.CoreV1Api(api).patch_node(rel.node.name, {"metadata": {"labels": labels}})


GUARD_ON = {g.env: g.off for g in contract.MULTICAST_GUARD}
GUARD_OFF = {g.env: g.own for g in contract.MULTICAST_GUARD}


def _guard(printed: dict[str, Any]) -> dict[str, str | None]:
    return {k: printed["env"].get(k) for k in GUARD_ON}


def _annotation(rel: Release, name: str) -> str | None:
    with rel.api() as api:
        pod = client.CoreV1Api(api).read_namespaced_pod(name, rel.workloads)
    value: str | None = (pod.metadata.annotations or {}).get(contract.ANNOTATION_POD_BACKEND)
    return value


def _kubelet_annotation(rel: Release, name: str) -> str | None:
    """The pod's backend annotation in the kubelet's own copy of the pod (its /pods, via the API server)."""
    with rel.api() as api:
        resp = client.CoreV1Api(api).connect_get_node_proxy_with_path(rel.node.name, "pods", _preload_content=False)
        pods = json.loads(resp.data)["items"]
    for pod in pods:
        if pod["metadata"]["name"] == name and pod["metadata"]["namespace"] == rel.workloads:
            value: str | None = pod["metadata"].get("annotations", {}).get(contract.ANNOTATION_POD_BACKEND)
            return value
    return None


def _diagnose(rel: Release, name: str) -> str:
    with rel.api() as api:
        core = client.CoreV1Api(api)
        pod = core.read_namespaced_pod(name, rel.workloads)
        events = core.list_namespaced_event(rel.workloads, field_selector=f"involvedObject.name={name}").items
    return "\n".join(
        [
            f"annotations: {pod.metadata.annotations}",
            f"kubelet's annotation: {_kubelet_annotation(rel, name)}",
            f"env: {pod.spec.containers[0].env}",
            f"statuses: {pod.status.container_statuses}",
            *(f"event {e.last_timestamp} {e.reason}: {e.message}" for e in events),
        ]
    )


def _restart_container(rel: Release, name: str, expected: str) -> None:
    """Once the kubelet has the new annotation, kill the container's process through containerd: the
    kubelet starts it again and resolves the env fieldRef from its copy of the pod."""
    wait_for(lambda: _kubelet_annotation(rel, name) == expected, 30, f"the kubelet sees {name} annotated {expected}")
    with rel.api() as api:
        pod = client.CoreV1Api(api).read_namespaced_pod(name, rel.workloads)
    container_id = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    rel.node.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)


def test_the_vllm_process_starts_with_the_backend_fiar_decided_for_each_verdict_and_after_drift(
    release: Release,
) -> None:
    # The agent left trtllm (multicast disabled). Each pod below is created only after the operator
    # has shown, by re-annotating the previous pod, that it has seen the node's new verdict.
    _set_verdict(release, "trtllm", "pass")
    _standin_on_real_node(release, "on-trtllm")
    first = _printed(release, "on-trtllm")
    assert first["env"][ENV] == "trtllm"
    # A verified backend: the fusion is the container's own (null), the standalone allreduce on.
    assert first["argv"][1:] == ["serve", "/models/stand-in", "--tensor-parallel-size", "2", FUSION_FLAG + "null"]
    assert first["env"][contract.ENV_ALLREDUCE_USE_FLASHINFER] == "1"
    # The agent found multicast forbidden by the host: NCCL's NVLS and the rest stay off multicast.
    assert _guard(first) == GUARD_ON
    # Decided by both webhooks, which the API server reached through the chart's Service: the pod
    # webhook at create (the policy label), the binding webhook when the scheduler bound it.
    with release.api() as api:
        pod = client.CoreV1Api(api).read_namespaced_pod("on-trtllm", release.workloads)
    assert pod.metadata.labels[contract.LABEL_POD_POLICY] == "standin"
    decision = json.loads(pod.metadata.annotations[contract.ANNOTATION_POD_DECISION])
    assert (decision["backend"], decision["trigger"]) == ("trtllm", "binding"), decision

    # mnnvl without a trtllm pass: trtllm is no longer verified, the pod drifts to mnnvl, and its
    # node's multicast is verified: the multicast consumers keep their own defaults.
    _set_verdict(release, "mnnvl", None, "verified")
    wait_for(lambda: _annotation(release, "on-trtllm") == "mnnvl", 60, "on-trtllm re-annotated after drift")
    _restart_container(release, "on-trtllm", "mnnvl")
    restarted = _printed(release, "on-trtllm", restarts=1)["env"][ENV]
    if restarted == "trtllm":
        # A kill that lands in a kubelet sync begun before the new annotation arrived (within a second
        # or so of the container's start) restarts it from that sync's older copy of the pod. The
        # next start takes the kubelet's current copy.
        _restart_container(release, "on-trtllm", "mnnvl")
        restarted = _printed(release, "on-trtllm", restarts=2)["env"][ENV]
    assert restarted == "mnnvl", _diagnose(release, "on-trtllm")
    _standin_on_real_node(release, "on-mnnvl")
    on_mnnvl = _printed(release, "on-mnnvl")
    assert on_mnnvl["env"][ENV] == "mnnvl"
    assert _guard(on_mnnvl) == GUARD_OFF, "NCCL reads the empty value as unset; torch and NVSHMEM read 0"

    # none: nothing verified, the policy's fallback.
    _set_verdict(release, "none", None, "broken")
    wait_for(lambda: _annotation(release, "on-mnnvl") == "auto", 60, "on-mnnvl re-annotated to the fallback")
    _standin_on_real_node(release, "on-none")
    on_none = _printed(release, "on-none")
    assert on_none["env"][ENV] == "auto"
    assert on_none["argv"][-1] == FUSION_FLAG + "false"
    assert on_none["env"][contract.ENV_ALLREDUCE_USE_FLASHINFER] == "0"
    assert _guard(on_none) == GUARD_ON

    # none with a passing trtllm test (the NVLink-bridge boards): trtllm, with the fusion off.
    _set_verdict(release, "none", "pass")
    wait_for(lambda: _annotation(release, "on-none") == "trtllm", 60, "on-none re-annotated to trtllm")
    _standin_on_real_node(release, "on-bridge")
    on_bridge = _printed(release, "on-bridge")
    assert (on_bridge["env"][ENV], on_bridge["argv"][-1]) == ("trtllm", FUSION_FLAG + "false")
    assert "" not in on_bridge["argv"]


def _sglang_on_real_node(rel: Release, name: str) -> None:
    """An SGLang stand-in (`sglang serve`, exec form) the scheduler binds to the real node."""
    body = _standin_pod(name)
    body["spec"]["containers"][0].update(
        image=rel.node.images["vllm-standin"].ref,
        command=["sglang"],
        args=["serve", "/models/stand-in", "--tp", "2", "--log-level", "warning"],
    )
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": rel.node.name}
    with rel.api() as api:
        client.CoreV1Api(api).create_namespaced_pod(rel.workloads, body)
    rel.created.append((rel.workloads, name))


def _sglang_flag(rel: Release, name: str) -> str | None:
    with rel.api() as api:
        pod = client.CoreV1Api(api).read_namespaced_pod(name, rel.workloads)
    value: str | None = (pod.metadata.annotations or {}).get(contract.ANNOTATION_POD_SGLANG_FLAG)
    return value


def _set_generation(rel: Release, value: str | None) -> str | None:
    """Label the node's GPU generation (None: remove the label); the value it had."""
    with rel.api() as api:
        core = client.CoreV1Api(api)
        was: str | None = (core.read_node(rel.node.name).metadata.labels or {}).get(contract.LABEL_COMPUTE_CAPABILITY)
        core.patch_node(rel.node.name, {"metadata": {"labels": {contract.LABEL_COMPUTE_CAPABILITY: value}}})
    return was


def test_the_sglang_process_starts_with_the_option_its_node_allows(release: Release) -> None:
    # trtllm verified, multicast forbidden by the host, the node's GPUs labelled SM100: SGLang's own auto
    # would pick mnnvl there, so off.
    _set_verdict(release, "trtllm", "pass", "forbidden")
    agents = _set_generation(release, "10.0")
    _sglang_on_real_node(release, "sglang-trtllm")
    first = _printed(release, "sglang-trtllm")
    off = "--" + contract.SGLANG_FLAGS["off"]
    assert first["argv"][1:3] == ["serve", "/models/stand-in"] and off in first["argv"], first["argv"]
    assert first["argv"][-4:] == ["--tp", "2", "--log-level", "warning"], "the user's options, after fiar's"
    assert "" not in first["argv"]
    assert "NCCL_NVLS_ENABLE" not in first["env"], "SGLang sets it to 0 itself"
    assert first["env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and first["env"]["NVSHMEM_DISABLE_NVLS"] == "1"

    # The same verdict on SM90 (what this H200 host is): SGLang's own auto is trtllm, verified.
    own = contract.SGLANG_FLAGS["engine"]
    _set_generation(release, "9.0")
    wait_for(lambda: _sglang_flag(release, "sglang-trtllm") == own, 60, "sglang-trtllm re-annotated on SM90")
    _set_generation(release, agents)

    # Every backend SGLang can pick verified: its own choice (the option that restates a default, which
    # the user's own --log-level after it overrides).
    _set_verdict(release, "mnnvl", "pass", "verified")
    _sglang_on_real_node(release, "sglang-mnnvl")
    second = _printed(release, "sglang-mnnvl")
    assert "--" + own in second["argv"] and off not in second["argv"], second["argv"]
    assert second["argv"][-2:] == ["--log-level", "warning"]
    assert second["env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "0" and second["env"]["NVSHMEM_DISABLE_NVLS"] == "0"
    _set_verdict(release, "none", "pass", "broken")


EVAL_SCRIPT = 'eval "exec vllm serve /models/stand-in --tensor-parallel-size 2 ${VLLM_ADDITIONAL_ARGS} $@"'
HOSTILE = "false $(echo --injected-uid-$(id -u)) --trust-remote-code"


def _eval_form(rel: Release, name: str, **container: Any) -> dict[str, Any]:
    """A stand-in started as KServe's LLMInferenceService starts vLLM: bash evaluates a script that
    expands VLLM_ADDITIONAL_ARGS and the args."""
    body = _standin_pod(name)
    body["spec"]["containers"][0].update(
        {
            "image": rel.node.images["vllm-standin"].ref,
            "command": ["/bin/bash", "-c", EVAL_SCRIPT, "--"],
            "args": ["--max-model-len=4096"],
            "env": [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--enable-prefix-caching"}],
            **container,
        }
    )
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": rel.node.name}
    return body


def test_a_value_that_reaches_a_shell_is_one_argument_and_only_fiars_values_are_written(release: Release) -> None:
    with release.api() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(release.workloads, _eval_form(release, "eval-form"))
        release.created.append((release.workloads, "eval-form"))
        printed = _printed(release, "eval-form")
        assert printed["argv"][1:] == [
            "serve",
            "/models/stand-in",
            "--tensor-parallel-size",
            "2",
            "--enable-prefix-caching",
            printed["argv"][6],
            "--max-model-len=4096",
        ]
        assert printed["argv"][6].startswith(FUSION_FLAG), printed["argv"]
        pod = core.read_namespaced_pod("eval-form", release.workloads)
        env = api.sanitize_for_serialization(pod.spec.containers[0].env)  # as the API spells it

        # The operator's token cannot write text into the annotation the script reads.
        token = release.plane.service_account_token(NAMESPACE, f"{RELEASE}-operator")
        kubeconfig = release.plane.write_kubeconfig(
            release.plane.workdir / "operator-d.kubeconfig", "operator", token=token
        )
        from kubernetes import config

        with config.new_client_from_config(str(kubeconfig)) as operator_api, pytest.raises(ApiException) as denied:
            client.CoreV1Api(operator_api).patch_namespaced_pod(
                "eval-form",
                release.workloads,
                {"metadata": {"annotations": {contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: HOSTILE}}},
            )
        assert denied.value.status == 422 and contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS in denied.value.body

        # Only the cluster admin may write it; where fiar does not look, with fiar's variables copied,
        # bash still expands it once, quoted: one argument, no command run.
        ignored = release.plane.create_namespace("ignored-shell", {contract.NAMESPACE_IGNORE_LABEL: ""})
        try:
            body = _eval_form(release, "hostile", env=env)
            body["metadata"]["annotations"] = {
                **(pod.metadata.annotations or {}),
                contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: HOSTILE,
            }
            core.create_namespaced_pod(ignored, body)
            hostile = _printed(release, "hostile", namespace=ignored)
        finally:
            core.delete_namespace(ignored)
    assert FUSION_FLAG + HOSTILE in hostile["argv"], hostile["argv"]
    assert not any(a.startswith("--injected-uid-") or a == "--trust-remote-code" for a in hostile["argv"])


def test_a_pod_created_while_the_operator_is_down_starts_on_the_fallback(release: Release) -> None:
    deployment = f"{RELEASE}-operator"
    with release.api() as api:
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        apps.patch_namespaced_deployment_scale(deployment, NAMESPACE, {"spec": {"replicas": 0}})
        wait_for(lambda: not _pods(release, "operator"), 60, "no operator pod")
        try:
            _standin_on_real_node(release, "while-down")
            printed = _printed(release, "while-down")
            pod = core.read_namespaced_pod("while-down", release.workloads)
        finally:
            apps.patch_namespaced_deployment_scale(deployment, NAMESPACE, {"spec": {"replicas": 3}})
            wait_for(lambda: len([p for p in _pods(release, "operator") if _ready(p)]) == 3, 120, "operators back")
    # Never configured: no variable at all (vLLM's default, auto), never an empty one.
    assert ENV not in printed["env"], printed["env"].get(ENV)
    assert printed["argv"][1:] == ["serve", "/models/stand-in", "--tensor-parallel-size", "2"]
    assert contract.LABEL_POD_POLICY not in (pod.metadata.labels or {})


def _running(core: Any, namespace: str, name: str) -> bool:
    statuses = core.read_namespaced_pod(name, namespace).status.container_statuses or []
    return bool(statuses) and statuses[0].state.running is not None


def test_pod_start_on_the_real_node_with_and_without_the_webhooks(release: Release) -> None:
    """Times a stand-in from create to its container running, in a covered and an ignored namespace."""
    with release.api() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": "ignored", "labels": {"fiar.io/ignore": "true"}}})
        times: dict[str, list[float]] = {"with webhooks": [], "without": []}
        try:
            for i in range(5):
                for ns, key in ((release.workloads, "with webhooks"), ("ignored", "without")):
                    name = f"timed-{i}"
                    start = time.monotonic()
                    _standin_on_real_node(release, name, ns)
                    wait_for(lambda ns=ns, name=name: _running(core, ns, name), 60, f"{ns}/{name} running", 0.02)
                    times[key].append(time.monotonic() - start)
            # The covered pods went through both webhooks (whatever the node's verdict is by now).
            annotations = core.read_namespaced_pod("timed-0", release.workloads).metadata.annotations or {}
            decision = json.loads(annotations[contract.ANNOTATION_POD_DECISION])
            assert decision["trigger"] == "binding", decision
            ignored = core.read_namespaced_pod("timed-0", "ignored").metadata.annotations or {}
            assert contract.ANNOTATION_POD_DECISION not in ignored
        finally:
            core.delete_namespace("ignored")
    summary = {k: round(statistics.median(v), 3) for k, v in times.items()}
    print(f"\npod start on the real node (median of 5, create to running): {summary}")


# -- a hung operator -------------------------------------------------------------------------------
def _container_pids(container_id: str) -> list[int]:
    """The host PIDs of the processes in one container: those whose cgroup path names its ID."""
    cid = container_id.split("://", 1)[-1]
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if cid in (proc / "cgroup").read_text():
                pids.append(int(proc.name))
        except OSError:
            continue  # ended meanwhile
    return pids


@dataclass
class Timed:
    """Pod CREATEs of one kind at a steady pace, each timed; managed ones also until bound."""

    rel: Release
    namespace: str
    managed: bool
    samples: list[tuple[float, float, float | None, bool]] = field(default_factory=list)
    """(start on the monotonic clock, CREATE seconds, seconds to bound or None, mutated)."""
    failed: list[tuple[float, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with self.rel.api() as api:
            core = client.CoreV1Api(api)
            i = 0
            while not self.stop.is_set():
                i += 1
                labels = None if self.managed else {"app.kubernetes.io/name": "web"}
                name = f"{'managed' if self.managed else 'plain'}-{i}"
                body = _standin_pod(name, node=None if self.managed else self.rel.kwok_node, labels=labels)
                if self.managed:  # bound by the scheduler, through the binding webhook
                    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": self.rel.kwok_node}
                began = time.monotonic()
                try:
                    pod = core.create_namespaced_pod(self.namespace, body)
                except ApiException as exc:
                    self.failed.append((began, f"{exc.status} {exc.reason}"))
                    continue
                created = time.monotonic() - began
                bound = None
                if self.managed:
                    while time.monotonic() - began < 10:
                        if core.read_namespaced_pod(pod.metadata.name, self.namespace).spec.node_name:
                            bound = time.monotonic() - began - created
                            break
                        time.sleep(0.02)
                mutated = contract.LABEL_POD_POLICY in (pod.metadata.labels or {})
                self.samples.append((began, created, bound, mutated))
                core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0)
                self.stop.wait(0.25)


def _summary(timed: Timed, start: float, end: float) -> dict[str, Any]:
    within = [s for s in timed.samples if start <= s[0] < end]
    waits = [s[1] for s in within]
    binds = [s[2] for s in within if s[2] is not None]
    return {
        "pods": len(within),
        "create_max_s": round(max(waits, default=0), 2),
        "create_waited_0.9s": sum(w >= 0.9 for w in waits),
        **({"bind_max_s": round(max(binds, default=0), 2), "bind_waited_0.9s": sum(b >= 0.9 for b in binds)}
           if timed.managed else {}),
        "unmutated": sum(not s[3] for s in within) if timed.managed else None,
        "failed": len([f for f in timed.failed if start <= f[0] < end]),
    }  # fmt: skip


def test_a_hung_operator_is_restarted_by_its_liveness_probe(release: Release) -> None:
    """Stops every operator process (SIGSTOP from the host) and measures the time until each
    operator pod was restarted and is ready again, and what pod creations saw meanwhile."""
    with release.api() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": "hang"}})
        operators = [p for p in _pods(release, "operator") if _ready(p)]
        restarts = {p.metadata.name: p.status.container_statuses[0].restart_count for p in operators}
        pids = [pid for p in operators for pid in _container_pids(p.status.container_statuses[0].container_id)]
        assert pids, "the operator containers' processes"
        timers = [Timed(release, "hang", managed=True), Timed(release, "hang", managed=False)]
        threads = [threading.Thread(target=t.run, daemon=True) for t in timers]
        for thread in threads:
            thread.start()
        restarted: dict[str, float] = {}
        ready: dict[str, float] = {}
        try:
            time.sleep(5)  # pods created with the operator well
            hung = time.monotonic()
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)

            def recovered() -> bool:
                for pod in core.list_namespaced_pod(NAMESPACE, label_selector=f"app.kubernetes.io/instance={RELEASE},"
                                                    "app.kubernetes.io/component=operator").items:  # fmt: skip
                    name, status = pod.metadata.name, (pod.status.container_statuses or [None])[0]
                    if status is None or name not in restarts:
                        continue
                    if status.restart_count > restarts[name]:
                        restarted.setdefault(name, time.monotonic() - hung)
                        if _ready(pod):
                            ready.setdefault(name, time.monotonic() - hung)
                return len(ready) == len(restarts)

            wait_for(recovered, 240, "every hung operator restarted and ready", interval=0.2)

            def mutating() -> float | None:  # the first managed pod created after the hang and mutated
                return next((s[0] - hung for s in list(timers[0].samples) if s[0] > hung + 1 and s[3]), None)

            try:
                mutated_after = wait_for(mutating, 180, "a managed pod mutated again", interval=0.2)
            except Exception:
                for pod in _pods(release, "operator"):
                    log = core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE, tail_lines=30)
                    print(f"\n--- {pod.metadata.name}\n{log}")
                raise
            time.sleep(5)  # pods created after the recovery
        finally:
            for pid in pids:  # processes the kubelet has not killed yet (none, once all restarted)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            for timer in timers:
                timer.stop.set()
            for thread in threads:
                thread.join(20)
            core.delete_namespace("hang")
    kinds = {"managed": timers[0], "unmanaged": timers[1]}
    report = {
        "restarted_s": sorted(round(v, 1) for v in restarted.values()),
        "ready_s": sorted(round(v, 1) for v in ready.values()),
        "mutating_again_s": round(mutated_after, 1),
        "before": {k: _summary(t, hung - 5, hung) for k, t in kinds.items()},
        "hung": {k: _summary(t, hung, hung + mutated_after) for k, t in kinds.items()},
        "after": {k: _summary(t, hung + mutated_after, hung + mutated_after + 5) for k, t in kinds.items()},
    }
    print(f"\nhung operator (all {len(restarts)} replicas stopped): {json.dumps(report)}")
    assert set(ready) == set(restarts)


def test_helm_uninstall_leaves_nothing_of_the_release(release: Release) -> None:
    with release.api() as api:
        core = client.CoreV1Api(api)
        for ns, name in release.created:
            try:
                core.delete_namespaced_pod(name, ns, grace_period_seconds=1)
            except ApiException as exc:
                if exc.status != 404:  # gone already, with its namespace
                    raise
    release.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    selector = f"app.kubernetes.io/instance={RELEASE}"
    with release.api() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        admission, rbac = client.AdmissionregistrationV1Api(api), client.RbacAuthorizationV1Api(api)
        left = [
            *(d.metadata.name for d in apps.list_namespaced_deployment(NAMESPACE, label_selector=selector).items),
            *(d.metadata.name for d in apps.list_namespaced_daemon_set(NAMESPACE, label_selector=selector).items),
            *(s.metadata.name for s in core.list_namespaced_service(NAMESPACE, label_selector=selector).items),
            *(s.metadata.name for s in core.list_namespaced_secret(NAMESPACE, label_selector=selector).items),
            *(s.metadata.name for s in core.list_namespaced_service_account(NAMESPACE, label_selector=selector).items),
            *(w.metadata.name for w in admission.list_mutating_webhook_configuration(label_selector=selector).items),
            *(p.metadata.name for p in admission.list_validating_admission_policy(label_selector=selector).items),
            *(r.metadata.name for r in rbac.list_cluster_role(label_selector=selector).items),
            *(b.metadata.name for b in rbac.list_cluster_role_binding(label_selector=selector).items),
        ]
        assert left == []
        wait_for(lambda: not core.list_namespaced_pod(NAMESPACE).items, 60, "the release's pods gone")
