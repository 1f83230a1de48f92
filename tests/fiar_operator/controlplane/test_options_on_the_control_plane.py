"""End to end on the real control plane: a Deployment whose vLLM command enables HiSparse, on a node that
verifies mnnvl, and one with Muse Spark's latency-specialized decode, on a node that verifies no backend.
Neither pod gets a value its option makes vLLM refuse; each decision says what it left out, one Warning
event per pod says why, and the policy status counts them."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fiar_contract as contract
from devcluster import workloads
from devcluster.kubelet import container_process

pytestmark = pytest.mark.controlplane

HISPARSE = ["vllm", "serve", "deepseek-ai/DeepSeek-V3.2", "-tp", "8", "-ac", '{"hisparse_config":{}}']
MUSE = [
    "vllm",
    "serve",
    "meta/muse-spark",
    "--tensor-parallel-size",
    "8",
    "--additional-config.decode_backend=latency_specialized",
]
U = contract.LABEL_MULTICAST_USABLE
MNNVL_NODE = {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_TRTLLM: "pass", U: "verified"}
NONE_NODE = {contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "pass", U: "absent"}


def counted(kit: Any, policy: str, key: str, count: int) -> bool:
    return bool((kit.get_policy(policy).get("status") or {}).get("pods", {}).get(key) == count)


@pytest.mark.parametrize(
    ("case", "command", "labels", "backend", "standalone"),
    [
        # mnnvl verified, trtllm verified too: vLLM's own auto under HiSparse gives trtllm on one node.
        ("hisparse", HISPARSE, MNNVL_NODE, "trtllm", "1"),
        # No backend verified: fusion off, but the standalone allreduce stays and trtllm never comes at TP 8.
        ("muse", MUSE, NONE_NODE, "auto", "1"),
    ],
)
def test_a_pod_is_never_given_a_value_its_option_makes_vllm_refuse(
    operator: Any,
    kit: Any,
    namespace: str,
    case: str,
    command: list[str],
    labels: dict[str, str],
    backend: str,
    standalone: str,
) -> None:
    node = kit.node(f"{case}-{kit.unique}", None, **labels)
    policy = f"options-{case}-{kit.unique}"
    kit.policy(policy, namespace)
    deployment = workloads.vllm_deployment(
        1,
        workloads.container(image="vllm/vllm-openai:v0.34.0", command=command),
        node_selector={f"pool-{kit.unique}": "gpu"},
    )
    kit.kube.call("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=deployment)
    (pod,) = kit.running(namespace, 1, "app=vllm", timeout=90)
    assert pod["spec"]["nodeName"] == node
    argv, env = container_process(pod, pod["spec"]["containers"][0])
    assert argv[: len(command)] == command, "the user's option is left as it was"
    assert env[contract.ENV_VAR] == backend
    assert env[contract.ENV_ALLREDUCE_USE_FLASHINFER] == standalone
    decision = json.loads(pod["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])
    assert decision["release"] == "0.34.0" and decision["notApplied"]
    kit.wait(lambda: counted(kit, policy, "valuesNotApplied", 1), 30, "valuesNotApplied")
    name = pod["metadata"]["name"]
    (warning,) = kit.wait(
        lambda: [e for e in kit.events(namespace, name) if e["reason"] == "ValueNotApplied"], 30, "ValueNotApplied"
    )
    assert ("HiSparse" if case == "hisparse" else "Muse Spark") in warning["message"]


def test_a_release_fiar_has_not_qualified_runs_with_the_fusion_off_and_is_reported_once(
    operator: Any, kit: Any, namespace: str
) -> None:
    for i in range(2):
        kit.node(f"unq{i}-{kit.unique}", None, **MNNVL_NODE)
    policy = f"unqualified-{kit.unique}"
    kit.policy(policy, namespace)
    command = ["vllm", "serve", "meta-llama/Llama-3.1-8B", "-tp", "8"]
    deployment = workloads.vllm_deployment(
        2,
        workloads.container(image="vllm/vllm-openai:v0.35.0", command=command),
        node_selector={f"pool-{kit.unique}": "gpu"},
    )
    kit.kube.call("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=deployment)
    pods = kit.running(namespace, 2, "app=vllm", timeout=90)
    for pod in pods:
        argv, env = container_process(pod, pod["spec"]["containers"][0])
        assert argv[-1] == "-cc.pass_config.fuse_allreduce_rms=false"
        assert (env[contract.ENV_VAR], env[contract.ENV_ALLREDUCE_USE_FLASHINFER]) == ("mnnvl", "0")
        decision = json.loads(pod["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])
        assert decision["releaseQualified"] is False and decision["reason"] == "Verified"
    kit.wait(lambda: counted(kit, policy, "releaseNotQualified", 2), 30, "releaseNotQualified")

    def warned() -> list[dict[str, Any]]:
        found = [e for p in pods for e in kit.events(namespace, p["metadata"]["name"])]
        return [e for e in found if e["reason"] == "ReleaseNotQualified"]

    (warning,) = kit.wait(warned, 30, "ReleaseNotQualified")
    assert "vLLM 0.35.0" in warning["message"] and "bench/engine_release.py" in warning["message"]
    kit.wait(lambda: counted(kit, policy, "releaseNotQualified", 2), 5, "still two pods")
    assert len(warned()) == 1, "one Warning per policy and release"
