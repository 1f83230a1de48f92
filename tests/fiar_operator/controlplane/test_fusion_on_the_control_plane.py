"""End to end on the real control plane: a Deployment over nodes with different verdicts. Each bound
pod's annotations, expanded as the kubelet does, give its vLLM container the fusion its node allows;
a node whose verdict changes flips them; the multicast guard follows each node's multicast fact; a
command fiar cannot change is reported."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fiar_contract as contract
from devcluster import workloads
from devcluster.kubelet import container_process

pytestmark = pytest.mark.controlplane

COMMAND = ["vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "8000", "--tensor-parallel-size", "2"]
OFF = "-cc.pass_config.fuse_allreduce_rms=false"
U = contract.LABEL_MULTICAST_USABLE
GUARDED = {g.env: g.off for g in contract.MULTICAST_GUARD}
OPEN = {g.env: g.own for g in contract.MULTICAST_GUARD}


def guard_env(env: dict[str, str]) -> dict[str, str]:
    return {k: env[k] for k in GUARDED}


ON = "-cc.pass_config.fuse_allreduce_rms=null"


def process(pod: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    return container_process(pod, pod["spec"]["containers"][0])


def get(kit: Any, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = kit.kube.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod


def test_bound_pods_run_with_the_fusion_their_node_allows_and_drift_flips_it(
    operator: Any, kit: Any, namespace: str
) -> None:
    nodes = {
        f"m-{kit.unique}": (
            {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_TRTLLM: "pass", U: "verified"},
            "mnnvl",
            ON,
            "1",
        ),
        # The fabric-manager-down row: trtllm verified, multicast broken.
        f"t-{kit.unique}": (
            {contract.LABEL_BACKEND: "trtllm", contract.LABEL_TRTLLM: "pass", U: "broken"},
            "trtllm",
            ON,
            "1",
        ),
        # The NVL-bridge row: mnnvl failed, trtllm passed but is slower than NCCL.
        f"n-{kit.unique}": (
            {contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "pass", U: "broken"},
            "trtllm",
            OFF,
            "0",
        ),
        f"p-{kit.unique}": (
            {contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "fail", U: "absent"},
            "auto",
            OFF,
            "0",
        ),
    }
    for name, (labels, *_rest) in nodes.items():
        kit.node(name, None, **labels)
    policy = f"fusion-{kit.unique}"
    kit.policy(policy, namespace)
    replicas = 8
    deployment = workloads.vllm_deployment(
        replicas,
        workloads.container(image="vllm/vllm-openai:v0.33.0", command=COMMAND),
        node_selector={f"pool-{kit.unique}": "gpu"},
    )
    kit.kube.call("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=deployment)
    pods = kit.running(namespace, replicas, "app=vllm", timeout=90)
    on_node: dict[str, list[str]] = {}
    for pod in pods:
        node = pod["spec"]["nodeName"]
        _labels, backend, flag, standalone = nodes[node]
        argv, env = process(pod)
        assert argv == [*COMMAND, flag], "the user's arguments, then the fusion flag, never an empty one"
        assert env[contract.ENV_VAR] == backend
        assert env[contract.ENV_ALLREDUCE_USE_FLASHINFER] == standalone
        assert guard_env(env) == (OPEN if node.startswith("m-") else GUARDED)
        decision = json.loads(pod["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])
        assert decision["trigger"] == "binding" and decision["fusion"] == ("on" if flag == ON else "off")
        assert decision["guard"] is (not node.startswith("m-"))
        on_node.setdefault(node, []).append(pod["metadata"]["name"])
    assert set(on_node) == set(nodes)

    def fusion_off(count: int) -> bool:
        counted: Any = (kit.get_policy(policy).get("status") or {}).get("pods", {}).get("fusionOff")
        return bool(counted == count)

    kit.wait(lambda: fusion_off(len(on_node[f"n-{kit.unique}"]) + len(on_node[f"p-{kit.unique}"])), 30, "fusionOff")

    def counted(key: str, count: int) -> bool:
        return bool((kit.get_policy(policy).get("status") or {}).get("pods", {}).get(key) == count)

    guarded = sum(len(on_node[n]) for n in nodes if not n.startswith("m-"))
    kit.wait(lambda: counted("multicastGuarded", guarded), 30, "multicastGuarded")
    # vLLM 0.33.0 on the none nodes, whose mnnvl workspace end is not known: the model-level paths stay on.
    kit.wait(
        lambda: counted("flashinferNotTurnedOff", len(on_node[f"n-{kit.unique}"]) + len(on_node[f"p-{kit.unique}"])),
        30,
        "flashinferNotTurnedOff",
    )
    name = on_node[f"n-{kit.unique}"][0]
    (warning, *_more) = kit.wait(
        lambda: [e for e in kit.events(namespace, name) if e["reason"] == "FlashInferNotTurnedOff"],
        30,
        "FlashInferNotTurnedOff",
    )
    assert "model-level" in warning["message"] and "0.33.0" in warning["message"]

    # The NVL-bridge node verifies trtllm after a fabric repair: its pods get the fusion back.
    bridge = f"n-{kit.unique}"
    kit.relabel(bridge, {contract.LABEL_BACKEND: "trtllm", U: "verified"})
    # The healthy node loses its verdict: its pods get the fusion off and the guard on.
    healthy = f"m-{kit.unique}"
    kit.relabel(healthy, {contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "fail", U: "broken"})
    for node, flag, backend, standalone in ((bridge, ON, "trtllm", "1"), (healthy, OFF, "auto", "0")):
        for name in on_node[node]:

            def flipped(name: str = name, flag: str = flag) -> bool:
                return process(get(kit, namespace, name))[0][-1] == flag

            kit.wait(flipped, 30, f"pod {name} on {node} re-annotated")
            _argv, env = process(get(kit, namespace, name))
            assert (env[contract.ENV_VAR], env[contract.ENV_ALLREDUCE_USE_FLASHINFER]) == (backend, standalone)
            assert guard_env(env) == (OPEN if node == bridge else GUARDED)

            def warned(name: str = name) -> list[dict[str, Any]]:
                return [e for e in kit.events(namespace, name) if e["reason"] == "NodeVerdictChanged"]

            (event, *_more) = kit.wait(warned, 30, f"NodeVerdictChanged event on {name}")
            assert "fusion" in event["message"] and "multicast guard" in event["message"]
    decision = json.loads(
        get(kit, namespace, on_node[bridge][0])["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION]
    )
    assert (decision["fusion"], decision["previousFusion"], decision["trigger"]) == ("on", "off", "reconcile")
    kit.wait(lambda: fusion_off(len(on_node[healthy]) + len(on_node[f"p-{kit.unique}"])), 30, "fusionOff recounted")


def test_a_command_fiar_does_not_understand_is_left_alone_and_reported(operator: Any, kit: Any, namespace: str) -> None:
    kit.node(f"u-{kit.unique}", None, **{contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "pass"})
    policy = f"uncontrolled-{kit.unique}"
    kit.policy(policy, namespace)
    shell = {"name": "vllm", "image": "vllm/vllm-openai", "command": ["sh", "-c", "vllm serve m --port 8000"]}
    created = kit.pod(namespace, "shell", shell)
    assert created["spec"]["containers"][0]["command"] == shell["command"]
    assert "args" not in created["spec"]["containers"][0]
    kit.running(namespace, 1)
    pod = get(kit, namespace, "shell")
    _argv, env = process(pod)
    assert env == {contract.ENV_VAR: "trtllm", **GUARDED}, "the backend that runs and the guard, nothing else"

    def warned() -> list[dict[str, Any]]:
        return [e for e in kit.events(namespace, "shell") if e["reason"] == "FusionNotControlled"]

    (event,) = kit.wait(warned, 30, "FusionNotControlled event")
    assert event["type"] == "Warning" and "$(FIAR_VLLM_ARGS)" in event["message"]
    kit.wait(
        lambda: (kit.get_policy(policy).get("status") or {}).get("pods", {}).get("fusionUncontrolled") == 1,
        30,
        "fusionUncontrolled in the policy status",
    )


SGLANG = ["python3", "-m", "sglang.launch_server"]
SGLANG_ARGS = ["--model-path", "Qwen/Qwen3-30B-A3B", "--host", "0.0.0.0", "--port", "30000", "--tp", "2"]
SGLANG_OFF = "--enforce-disable-flashinfer-allreduce-fusion"
SGLANG_OWN = "--log-level=info"


def test_sglang_pods_beside_vllm_get_the_option_their_node_allows_and_drift_flips_it(
    operator: Any, kit: Any, namespace: str
) -> None:
    b, m, mn, t = contract.LABEL_BACKEND, contract.LABEL_MULTICAST, contract.LABEL_MNNVL, contract.LABEL_TRTLLM
    cc = contract.LABEL_COMPUTE_CAPABILITY
    nodes = {
        # both backends verified, generation not known (an agent that predates the label): either is verified
        f"sm-{kit.unique}": ({b: "mnnvl", m: "supported", mn: "pass", t: "pass"}, SGLANG_OWN),
        # h200x2-host: SM90, trtllm verified, multicast disabled by host policy: SGLang's auto is trtllm
        f"st-{kit.unique}": ({b: "trtllm", m: "disabled", mn: "skipped", t: "pass", cc: "9.0"}, SGLANG_OWN),
        # the same on SM100: SGLang's auto is mnnvl, not verified
        f"sd-{kit.unique}": ({b: "trtllm", m: "disabled", mn: "skipped", t: "pass", cc: "10.0"}, SGLANG_OFF),
        f"sp-{kit.unique}": ({b: "none", m: "unsupported", mn: "fail", t: "fail", cc: "9.0"}, SGLANG_OFF),
    }
    for name, (labels, _flag) in nodes.items():
        kit.node(name, None, **labels, **{f"pool-{kit.unique}": "sglang"})
    policy = f"sglang-{kit.unique}"
    kit.policy(policy, namespace, podSelector={"matchLabels": {"app": "sglang"}})
    replicas = 4
    container = {"name": "sglang", "image": "lmsysorg/sglang:v0.5.23", "command": SGLANG, "args": SGLANG_ARGS}
    deployment = workloads.sglang_deployment(replicas, container, node_selector={f"pool-{kit.unique}": "sglang"})
    kit.kube.call("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=deployment)
    pods = kit.running(namespace, replicas, "app=sglang", timeout=90)
    on_node: dict[str, str] = {}
    for pod in pods:
        node = pod["spec"]["nodeName"]
        argv, env = process(pod)
        assert argv == [*SGLANG, nodes[node][1], *SGLANG_ARGS], "fiar's option first, then the user's"
        assert contract.ENV_ALLREDUCE_USE_FLASHINFER not in env
        on_node[node] = pod["metadata"]["name"]
    assert set(on_node) == set(nodes)
    kit.wait(
        lambda: (kit.get_policy(policy).get("status") or {}).get("pods", {}).get("fusionOff") == 2, 30, "fusionOff"
    )

    # The SM90 node's host policy is lifted: mnnvl passes, trtllm now fails, and SGLang's auto there is trtllm.
    changed = f"st-{kit.unique}"
    kit.relabel(changed, {b: "mnnvl", m: "supported", mn: "pass", t: "fail"})
    name = on_node[changed]
    kit.wait(lambda: process(get(kit, namespace, name))[0][3] == SGLANG_OFF, 30, f"pod {name} re-annotated")

    def warned() -> list[dict[str, Any]]:
        return [e for e in kit.events(namespace, name) if e["reason"] == "NodeVerdictChanged"]

    (event, *_more) = kit.wait(warned, 30, f"NodeVerdictChanged event on {name}")
    assert f"SGLang --log-level=info -> {SGLANG_OFF}" in event["message"]
