"""The local demo: fiar end to end on the real control plane, with recorded and modelled GPU hosts.

1. Start the control plane (tier C) and add one fake GPU node per host fixture that ships with the
   agent (real recordings of 2x and 1x H200 hosts, and modelled hosts: healthy 8x H100 NVSwitch,
   H200-NVL with a null multicast pointer, PCIe without NVLink, GB200 NVL72).
2. Run one ``fiar-agent run --simulate <fixture>`` per node: the same agent code as on a real node,
   with the hardware read from the fixture. Each labels its own node.
3. Run ``fiar-operator run``, which installs its CRD and registers its webhooks on 127.0.0.1.
4. Create a FiAllreducePolicy and a Deployment of vLLM-like pods, one per node, and print what every
   pod got and why; then the same for a Deployment of SGLang pods beside them (one per node with a
   GPU left), and what SGLang option each got. Everything keeps running for you to explore until
   ``make down``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import fiar_contract as contract
from devcluster import build, workloads
from devcluster.cluster import ControlPlane, free_port
from devcluster.waiting import wait_for as _wait

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "node_agent" / "fixtures"
BIN = Path(sys.executable).parent
NAMESPACE = "inference"
FUSION = {"false": "off", "null": "on"}
"""fiar.io/fuse-allreduce-rms as the container reads it: off, or on (the container's own setting)."""
LABEL_COLUMNS = (contract.LABEL_GPUS, contract.LABEL_MULTICAST_USABLE, *contract.RESULT_LABELS, contract.LABEL_BACKEND)


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def node_name(fixture: Path) -> str:
    return fixture.stem.replace("_", "-").lower()[:50]


def gpu_count(fixture: Path) -> int:
    return len(json.loads(fixture.read_text()).get("gpus") or [])


GRACE_GPU_PREFIXES = ("NVIDIA GB", "NVIDIA GH")
"""GPUs of a Grace superchip (GB200, GB300, GH200): their node's CPUs are Grace, ``kubernetes.io/arch=arm64``."""


def node_arch(fixture: Path) -> str:
    """The CPU architecture of the fixture's host: arm64 beside Grace superchips, amd64 otherwise."""
    gpus = json.loads(fixture.read_text()).get("gpus") or []
    grace = gpus and all(str(g.get("name", "")).startswith(GRACE_GPU_PREFIXES) for g in gpus)
    return "arm64" if grace else "amd64"


def start_agents(plane: ControlPlane, fixtures: list[Path]) -> None:
    for fixture in fixtures:
        node = node_name(fixture)
        arch = node_arch(fixture)
        plane.add_node(
            node,
            labels={**workloads.GPU_PRESENT, contract.LABEL_ARCH: arch},
            capacity={"nvidia.com/gpu": str(max(gpu_count(fixture), 1))},
            taints=[dict(workloads.GPU_TAINT)],
        )
        port = free_port()
        plane.start_process(
            f"agent-{node}",
            [
                str(BIN / "fiar-agent"),
                "run",
                "--simulate",
                str(fixture),
                "--node-name",
                node,
                "--kubeconfig",
                str(plane.kubeconfig),
                "--metrics-addr",
                f"127.0.0.1:{port}",
            ],
            f"http://127.0.0.1:{port}/healthz",
        )
        _say(f"node {node} ({arch}): agent started (simulating {fixture.name})")


def start_operator(plane: ControlPlane) -> None:
    assert plane.ca is not None
    cert, key = plane.ca.issue("fiar-operator", hosts=("127.0.0.1",)).write(plane.pki_dir, "operator")
    webhook_port, metrics_port = free_port(), free_port()
    plane.start_process(
        "fiar-operator",
        [
            str(BIN / "fiar-operator"),
            "run",
            "--kubeconfig",
            str(plane.kubeconfig),
            "--standalone",
            "--install-crd",
            "--register-webhooks",
            f"https://127.0.0.1:{webhook_port}",
            "--webhook-ca",
            str(plane.ca_file),
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(webhook_port),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(metrics_port),
        ],
        f"http://127.0.0.1:{metrics_port}/readyz",
    )
    _say(f"operator ready: webhooks on https://127.0.0.1:{webhook_port}, metrics on :{metrics_port}")


VLLM = {"app.kubernetes.io/name": "vllm"}


def vllm_deployment(replicas: int) -> dict[str, Any]:
    """The demo's Deployment of vLLM-like pods, one per GPU node (spread by hostname)."""
    vllm = workloads.container(
        image="vllm/vllm-openai:latest",
        # The image's entrypoint is `vllm serve`: fiar appends the fusion flag to these args.
        args=["meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "1"],
        resources={"limits": {"nvidia.com/gpu": "1"}},
    )
    return workloads.vllm_deployment(
        replicas,
        vllm,
        name="llama",
        labels=VLLM,
        node_selector=workloads.GPU_PRESENT,
        tolerations=[workloads.GPU_TOLERATION],
    )


def deploy_vllm(plane: ControlPlane, replicas: int) -> None:
    from kubernetes import client

    with plane.api_client() as api:
        objs = client.CustomObjectsApi(api)
        _wait(lambda: _crd_ready(api), 30, "FiAllreducePolicy CRD")
        objs.create_cluster_custom_object(
            "fiar.io",
            "v1alpha1",
            "fiallreducepolicies",
            workloads.policy(
                "vllm",
                podSelector={"matchLabels": dict(VLLM)},
                backends=list(contract.BACKENDS),
                fallbackBackend="auto",
            ),
        )
        plane.create_namespace(NAMESPACE)
        deployment = vllm_deployment(replicas)
        pod_spec = deployment["spec"]["template"]["spec"]
        # The API server may take a moment to call a newly registered webhook: wait until a dry run
        # shows the policy's label, so that no pod of the demo is created unmanaged.
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "probe-", "labels": dict(VLLM)},
            "spec": pod_spec,
        }
        core = client.CoreV1Api(api)
        _wait(
            lambda: (core.create_namespaced_pod(NAMESPACE, probe, dry_run="All").metadata.labels or {}).get(
                "fiar.io/policy"
            ),
            30,
            "webhooks active",
        )
        client.AppsV1Api(api).create_namespaced_deployment(NAMESPACE, deployment)

        def running() -> list[Any] | None:
            pods = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=vllm").items
            done = len(pods) == replicas and all(p.status.phase == "Running" for p in pods)
            return pods if done else None

        _wait(running, 90, "vLLM pods Running")


SGLANG_APP = "sglang"
SGLANG_COMMAND = ["python3", "-m", "sglang.launch_server"]
SGLANG_ARGS = ["--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "1", "--port", "30000"]


def deploy_sglang(plane: ControlPlane, replicas: int) -> None:
    """A policy for SGLang pods and a Deployment of them, one per node that has a GPU left."""
    from kubernetes import client

    labels = {"app.kubernetes.io/name": SGLANG_APP}
    with plane.api_client() as api:
        client.CustomObjectsApi(api).create_cluster_custom_object(
            "fiar.io",
            "v1alpha1",
            "fiallreducepolicies",
            workloads.policy(SGLANG_APP, podSelector={"matchLabels": labels}),
        )
        sglang = workloads.container(
            "sglang",
            "lmsysorg/sglang:latest",
            # fiar inserts its SGLang option right after the module, before these args.
            command=SGLANG_COMMAND,
            args=SGLANG_ARGS,
            resources={"limits": {"nvidia.com/gpu": "1"}},
        )
        deployment = workloads.sglang_deployment(
            replicas,
            sglang,
            name="qwen-moe",
            labels=labels,
            node_selector=workloads.GPU_PRESENT,
            spread="ScheduleAnyway",
            tolerations=[workloads.GPU_TOLERATION],
        )
        pod_spec = deployment["spec"]["template"]["spec"]
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "probe-", "labels": labels}}
        core = client.CoreV1Api(api)
        _wait(
            lambda: (
                (
                    core.create_namespaced_pod(NAMESPACE, {**probe, "spec": pod_spec}, dry_run="All").metadata.labels
                    or {}
                ).get("fiar.io/policy")
                == SGLANG_APP
            ),
            30,
            "the SGLang policy in force",
        )
        client.AppsV1Api(api).create_namespaced_deployment(NAMESPACE, deployment)

        def running() -> list[Any] | None:
            pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"app.kubernetes.io/name={SGLANG_APP}").items
            done = len(pods) == replicas and all(p.status.phase == "Running" for p in pods)
            return pods if done else None

        _wait(running, 90, "SGLang pods Running")


def sglang_table(plane: ControlPlane) -> str:
    """What each SGLang pod got: its node's GPU generation and verdict, and the option its command reads."""
    from kubernetes import client

    with plane.api_client() as api:
        core = client.CoreV1Api(api)
        nodes = {n.metadata.name: n.metadata.labels or {} for n in core.list_node().items}
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"app.kubernetes.io/name={SGLANG_APP}").items
        rows = [("SGLANG POD", "NODE", "COMPUTE", "VERDICT", "SGLANG OPTION", "REASON")]
        for pod in sorted(pods, key=lambda p: p.spec.node_name or ""):
            flag = (pod.metadata.annotations or {}).get(contract.ANNOTATION_POD_SGLANG_FLAG)
            labels = nodes.get(pod.spec.node_name, {})
            decision = json.loads((pod.metadata.annotations or {}).get("fiar.io/decision", "{}"))
            rows.append(
                (
                    pod.metadata.name,
                    pod.spec.node_name,
                    labels.get(contract.LABEL_COMPUTE_CAPABILITY, "-"),
                    labels.get(contract.LABEL_BACKEND, "-"),
                    f"--{flag}" if flag else "-",  # what $(FIAR_SGLANG_ARGS) expands to
                    str(decision.get("reason", "-")),
                )
            )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)


def _crd_ready(api: Any) -> bool:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        crd = client.ApiextensionsV1Api(api).read_custom_resource_definition("fiallreducepolicies.fiar.io")
    except ApiException:
        return False
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))


def table(plane: ControlPlane) -> str:
    from kubernetes import client

    with plane.api_client() as api:
        core = client.CoreV1Api(api)
        nodes = {n.metadata.name: n.metadata.labels or {} for n in core.list_node().items}
        pods = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=vllm").items
    results = (b.upper() for b in contract.BACKENDS)
    rows = [("NODE", "GPUS", "MULTICAST", *results, "VERDICT", "POD", "POD BACKEND", "FUSION", "GUARD", "REASON")]
    for pod in sorted(pods, key=lambda p: p.spec.node_name or ""):
        labels = nodes.get(pod.spec.node_name, {})
        decision = json.loads((pod.metadata.annotations or {}).get("fiar.io/decision", "{}"))
        rows.append(
            (
                pod.spec.node_name,
                *(labels.get(k, "-") for k in LABEL_COLUMNS),
                pod.metadata.name,
                (pod.metadata.annotations or {}).get("fiar.io/backend", "-"),
                FUSION.get((pod.metadata.annotations or {}).get("fiar.io/fuse-allreduce-rms", ""), "-"),
                {True: "on", False: "off"}.get(decision.get("guard"), "-"),
                str(decision.get("reason", "-")),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)


def run(plane: ControlPlane) -> None:
    fixtures = sorted(FIXTURES.glob("*.json"))
    start_operator(plane)
    start_agents(plane, fixtures)
    from kubernetes import client

    with plane.api_client() as api:
        core = client.CoreV1Api(api)
        names = [node_name(f) for f in fixtures]
        _wait(
            lambda: all((core.read_node(n).metadata.labels or {}).get("fiar.io/backend") for n in names),
            120,
            "every agent's verdict",
        )
    _say("every node is labelled; deploying a policy and a vLLM Deployment")
    deploy_vllm(plane, len(fixtures))
    print()
    print(table(plane))
    print()
    _say("deploying an SGLang policy and Deployment beside them")
    deploy_sglang(plane, sum(1 for f in fixtures if gpu_count(f) > 1))
    print()
    print(sglang_table(plane))
    print()
    print("SGLang pods get their own choice of FlashInfer allreduce fusion only where every backend it may pick")
    print("is verified, else --enforce-disable-flashinfer-allreduce-fusion (docs/sglang.md).")
    print()
    print("The same on any cluster, with why each node got its verdict and what needs attention (kubectl plugin):")
    print(f"  PATH={BIN}:$PATH {build.binary_path('kubectl')} fiar status --kubeconfig {plane.kubeconfig}")
    print()
    print("Nodes with verdict none verify no backend: their pods run with vLLM's FlashInfer allreduce fusion off")
    print("(where vLLM's own guess crashes or crawls), and with trtllm where the node's trtllm test passed, so a")
    print("container whose command fiar cannot change still runs. `placement: VerifiedNodesOnly` keeps pods off them.")
    print()
    kubectl = build.binary_path("kubectl")
    print(f"export KUBECONFIG={plane.kubeconfig}")
    print(f"{kubectl} get nodes -L {','.join(LABEL_COLUMNS)}")
    print(f"export PATH={BIN}:$PATH   # kubectl finds its plugin kubectl-fiar here")
    print(f"{kubectl} fiar status                # nodes by verdict, policies, what needs attention first")
    print(f"{kubectl} fiar why <node>            # the node's probe report in words")
    print(f"{kubectl} fiar why pod {NAMESPACE}/<pod>  # what a pod got, from which node facts and policy")
    print(f"{kubectl} fiar report --html fleet.html   # one self-contained page of the fleet")
    print(f"{kubectl} get fiarp -o wide")
    print(
        f"{kubectl} -n {NAMESPACE} get pods -o custom-columns="
        "POD:.metadata.name,NODE:.spec.nodeName,BACKEND:.metadata.annotations.fiar\\.io/backend,"
        "FUSE_ALLREDUCE_RMS:.metadata.annotations.fiar\\.io/fuse-allreduce-rms"
    )
    print(f"{kubectl} annotate node <node> fiar.io/reprobe=now   # ask an agent for a new probe")
    devcluster = f"PYTHONPATH=tools {sys.executable} -m devcluster --dir {plane.workdir}"
    print(f"{devcluster} stop fiar-operator   # then start it again: ... start fiar-operator")
    print(f"logs: {plane.log_dir}    stop everything: make down")
