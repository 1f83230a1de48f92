"""fiar's arm64 images from the chart on a real kubelet node (tier D), and a mixed fleet around it.

The operator and agent-sim images the chart runs here are the arm64 manifests of their
multi-architecture images: the node's runc starts them under qemu (binfmt_misc registered by the
test setup, ``devcluster/binfmt.py``), and each container's processes are qemu-aarch64 running them.
The agent probes a simulated GB200 tray (Grace: arm64) and labels its node; a vLLM stand-in there
gets the verified backend. The real kubelet writes its own ``kubernetes.io/arch`` (Go's GOARCH,
amd64 here) back at every status update, so the fleet's architectures are kwok nodes beside it: an
arm64 GPU node gets an agent pod from the DaemonSet controller, a GPU node of an architecture fiar
ships no image for gets none, and ``kubectl fiar status`` names it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

import fiar_contract as contract
from devcluster import binfmt
from devcluster.binaries import helm, set_args
from devcluster.cluster import ControlPlane
from devcluster.realnode import RealNode
from devcluster.waiting import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.realnode]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fiar"
RELEASE = "grace-fiar"
NAMESPACE = "fiar-grace"
WORKLOADS = "grace-workloads"
ARCH = "arm64"
SIMULATED_HOST = "gb200-nvl72-clique"  # modelled GB200 NVL72 tray: mnnvl verified
OTHER_ARCH = "s390x"


@dataclass
class Grace:
    plane: ControlPlane
    node: RealNode
    refs: dict[str, str]
    grace_node: str
    other_node: str

    def api(self) -> Any:
        return self.plane.api_client()


def _pods(g: Grace, component: str) -> list[Any]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
    with g.api() as api:
        return list(client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=selector).items)


def _ready(pod: Any) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
    )


@pytest.fixture(scope="module")
def grace(plane_d: ControlPlane) -> Iterator[Grace]:
    node = plane_d.real_node
    assert node is not None
    reason = binfmt.unavailable_reason(ARCH)
    if reason and os.environ.get("FIAR_REQUIRE_REALNODE"):
        pytest.fail(f"FIAR_REQUIRE_REALNODE is set but {reason}")
    if reason:
        pytest.skip(reason)
    refs = {name: node.import_platform(name, ARCH) for name in ("operator", "agent-sim")}
    suffix = uuid.uuid4().hex[:6]
    grace_node, other = f"kwok-{ARCH}-{suffix}", f"kwok-{OTHER_ARCH}-{suffix}"
    for name, arch in ((grace_node, ARCH), (other, OTHER_ARCH)):
        plane_d.add_node(name, labels={"nvidia.com/gpu.present": "true", contract.LABEL_ARCH: arch})
    with plane_d.api_client() as api:
        core = client.CoreV1Api(api)
        before = dict(core.read_node(node.name).metadata.labels or {})
        # The verdict and report an earlier release's agent (or a test) left go: only this agent's count.
        labels: dict[str, str | None] = {k: None for k in contract.AGENT_LABELS}
        labels["nvidia.com/gpu.present"] = "true"
        annotations = {contract.ANNOTATION_PROBE_REPORT: None}
        core.patch_node(node.name, {"metadata": {"labels": labels, "annotations": annotations}})
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        core.create_namespace({"metadata": {"name": WORKLOADS}})
    values = {
        "operator.image.repository": refs["operator"].rsplit(":", 1)[0],
        "operator.image.tag": refs["operator"].rsplit(":", 1)[1],
        "operator.replicas": 1,
        "agent.image.repository": refs["agent-sim"].rsplit(":", 1)[0],
        "agent.image.tag": refs["agent-sim"].rsplit(":", 1)[1],
        "agent.simulate": SIMULATED_HOST,
        "agent.probe.benchmark": False,
        "operator.nodeSelector.kubernetes\\.io/hostname": node.name,
    }
    helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait", "--timeout", "300s", *set_args(values),
        kubeconfig=plane_d.kubeconfig,
    )  # fmt: skip
    try:
        yield Grace(plane_d, node, refs, grace_node, other)
    finally:
        helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", kubeconfig=plane_d.kubeconfig, check=False)
        with plane_d.api_client() as api:
            core = client.CoreV1Api(api)
            for ns in (NAMESPACE, WORKLOADS):
                core.delete_namespace(ns)
            restore = {"nvidia.com/gpu.present": before.get("nvidia.com/gpu.present")}
            restore.update({k: None for k in contract.AGENT_LABELS})
            core.patch_node(node.name, {"metadata": {"labels": restore}})
            for name in (grace_node, other):
                core.delete_node(name)
            objs = client.CustomObjectsApi(api)
            with contextlib.suppress(ApiException):
                objs.delete_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, "grace")


def _emulated(container_id: str) -> list[str]:
    """The executables of a container's processes as the kernel runs them (qemu for a foreign arch)."""
    cid = container_id.split("://", 1)[-1]
    exes = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if cid in (proc / "cgroup").read_text():
                exes.append(os.readlink(proc / "exe"))
        except OSError:
            continue
    return exes


def test_the_arm64_operator_and_agent_images_run_under_emulation_on_the_real_node(grace: Grace) -> None:
    (operator,) = _pods(grace, "operator")
    (agent,) = wait_for(
        lambda: [p for p in _pods(grace, "agent") if p.spec.node_name == grace.node.name and _ready(p)] or None,
        120,
        "the agent pod ready on the real node",
    )
    for pod, ref in ((operator, grace.refs["operator"]), (agent, grace.refs["agent-sim"])):
        assert pod.spec.node_name == grace.node.name
        assert pod.spec.containers[0].image == ref
        status = pod.status.container_statuses[0]
        exes = _emulated(status.container_id)
        assert exes and all(f"qemu-{binfmt.QEMU_CPU[ARCH]}" in e or "aarch64-binfmt" in e for e in exes), exes
    assert _ready(operator)


def test_the_arm64_agent_labels_its_node_and_a_vllm_pod_gets_the_verified_backend(grace: Grace) -> None:
    with grace.api() as api:
        core = client.CoreV1Api(api)

        def verdict() -> dict[str, str] | None:
            meta = core.read_node(grace.node.name).metadata
            report = (meta.annotations or {}).get(contract.ANNOTATION_PROBE_REPORT) or ""
            found = (meta.labels or {}).get(contract.LABEL_BACKEND) and SIMULATED_HOST in report
            return dict(meta.labels) if found else None

        labels = wait_for(verdict, 240, "the arm64 agent's verdict on the node")
        assert labels[contract.LABEL_BACKEND] == "mnnvl"
        report = json.loads(core.read_node(grace.node.name).metadata.annotations[contract.ANNOTATION_PROBE_REPORT])
        assert SIMULATED_HOST in report["hardware"]
        objs = client.CustomObjectsApi(api)
        policy = {
            "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
            "kind": contract.KIND,
            "metadata": {"name": "grace"},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "grace-standin"}},
                "backends": ["mnnvl", "trtllm"],
                "fallbackBackend": "auto",
                "placement": "Anywhere",
            },
        }
        generation = objs.create_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, policy)[
            "metadata"
        ]["generation"]
        wait_for(
            lambda: (objs.get_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, "grace")
                     .get("status") or {}).get("observedGeneration") == generation,
            120,
            "the policy observed by the arm64 operator",
        )  # fmt: skip
        pod = {
            "metadata": {"name": "vllm-on-grace", "labels": {"app.kubernetes.io/name": "grace-standin"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": grace.node.name},
                "containers": [
                    {
                        "name": "vllm",
                        "image": grace.node.images["vllm-standin"].ref,
                        "imagePullPolicy": "Never",
                        "command": ["vllm"],
                        "args": ["serve", "/models/stand-in", "--tensor-parallel-size", "4"],
                    }
                ],
                "terminationGracePeriodSeconds": 2,
            },
        }
        core.create_namespaced_pod(WORKLOADS, pod)

        def printed() -> dict[str, Any] | None:
            p = core.read_namespaced_pod("vllm-on-grace", WORKLOADS)
            if p.status.phase != "Running":
                return None
            for text in core.read_namespaced_pod_log("vllm-on-grace", WORKLOADS, container="vllm").splitlines():
                if text.startswith("FIAR-STANDIN "):
                    doc: dict[str, Any] = json.loads(text.split(" ", 1)[1])
                    return doc
            return None

        doc = wait_for(printed, 120, "the stand-in printed its environment")
        assert doc["env"][contract.ENV_VAR] == "mnnvl"


def test_a_gpu_node_of_an_arch_without_an_image_gets_no_agent_and_is_named_by_kubectl_fiar(grace: Grace) -> None:
    with grace.api() as api:
        apps = client.AppsV1Api(api)
        (ds,) = apps.list_namespaced_daemon_set(NAMESPACE).items
        assert ds.status.desired_number_scheduled == 2  # the real (amd64) node and the arm64 one
    placed = {p.spec.node_name for p in _pods(grace, "agent")}
    assert placed == {grace.node.name, grace.grace_node}
    plugin = Path(sys.executable).parent / "kubectl-fiar"
    proc = subprocess.run(
        [str(plugin), "status", "--kubeconfig", str(grace.plane.kubeconfig)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.split() and ln.split()[0] == grace.other_node)
    assert f"no agent for arch {OTHER_ARCH}" in line
