"""Multi-pod groups (LeaderWorkerSet size > 1): mnnvl only within one NVLink clique, never trtllm."""

from __future__ import annotations

import json
from typing import Any

import pytest

import fiar_contract as contract
from fiar_operator.core.policy import LWS_GROUP_KEY, LWS_SIZE

pytestmark = pytest.mark.controlplane


def lws_pod(kit: Any, namespace: str, name: str, group: str) -> dict[str, Any]:
    created: dict[str, Any] = kit.pod(
        namespace, name, labels={"app": "vllm", LWS_GROUP_KEY: group}, annotations={LWS_SIZE: "2"}
    )
    return created


def test_group_is_kept_in_one_clique_and_gets_mnnvl(kit: Any, namespace: str) -> None:
    clique_a, clique_b = f"uuid-{kit.unique}.1", f"uuid-{kit.unique}.2"
    kit.node(f"a1-{kit.unique}", "mnnvl", **{contract.LABEL_CLIQUE: clique_a})
    kit.node(f"b1-{kit.unique}", "mnnvl", **{contract.LABEL_CLIQUE: clique_b})
    kit.node(f"b2-{kit.unique}", "mnnvl", **{contract.LABEL_CLIQUE: clique_b})
    kit.node(f"t1-{kit.unique}", "trtllm", **{contract.LABEL_CLIQUE: clique_a})
    kit.policy(f"group-{kit.unique}", namespace, placement="VerifiedNodesOnly", imexChannel="Provided")
    created = lws_pod(kit, namespace, "lws-0", "g1")
    assert (
        created["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"]
        == contract.LABEL_CLIQUE
    )
    lws_pod(kit, namespace, "lws-0-1", "g1")
    pods = kit.running(namespace, 2)
    nodes = {p["spec"]["nodeName"] for p in pods}
    cliques = {clique_a if n.startswith("a1-") else clique_b for n in nodes}
    assert len(cliques) == 1 and not any(n.startswith("t1-") for n in nodes)
    for pod in pods:
        decision = json.loads(pod["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])
        assert (decision["backend"], decision["reason"], decision["group"]) == ("mnnvl", "Verified", "g1")


def test_group_gets_the_fallback_and_a_warning_when_mnnvl_is_not_allowed(kit: Any, namespace: str) -> None:
    kit.node(f"t-{kit.unique}", "trtllm")
    kit.policy(f"trtllm-only-{kit.unique}", namespace, backends=["trtllm"], fallbackBackend="auto")
    lws_pod(kit, namespace, "lws-0", "g2")
    (pod,) = kit.running(namespace, 1)
    notes = pod["metadata"]["annotations"]
    assert notes[contract.ANNOTATION_POD_BACKEND] == "auto"
    assert json.loads(notes[contract.ANNOTATION_POD_DECISION])["reason"] == "MultiNodeNeedsMnnvl"

    def warned() -> list[dict[str, Any]]:
        return [e for e in kit.events(namespace, "lws-0") if e["reason"] == "MultiNodeFallback"]

    (event,) = kit.wait(warned, 30, "MultiNodeFallback event")
    assert event["type"] == "Warning" and "trtllm is invalid across pods" in event["message"]


def test_each_pod_of_a_group_falling_back_on_an_unprobed_node_gets_a_warning(kit: Any, namespace: str) -> None:
    kit.node(f"u-{kit.unique}", None, **{"nvidia.com/gpu.present": "true"})
    kit.policy(f"anywhere-{kit.unique}", namespace, placement="Anywhere")
    for name in ("lws-0", "lws-0-1"):
        lws_pod(kit, namespace, name, "g3")
    for pod in kit.running(namespace, 2):
        decision = json.loads(pod["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION])
        assert (decision["backend"], decision["reason"]) == ("auto", "NotProbed")
    for name in ("lws-0", "lws-0-1"):

        def warned(name: str = name) -> list[dict[str, Any]]:
            return [e for e in kit.events(namespace, name) if e["reason"] == "MultiNodeFallback"]

        (event,) = kit.wait(warned, 30, f"MultiNodeFallback event on {name}")
        assert event["type"] == "Warning" and "never probed" in event["message"]


def test_a_member_on_an_unchanged_node_falls_back_when_another_members_node_loses_mnnvl(
    kit: Any, namespace: str
) -> None:
    clique = f"uuid-{kit.unique}.1"
    a1 = kit.node(f"a1-{kit.unique}", "mnnvl", **{contract.LABEL_CLIQUE: clique})
    a2 = kit.node(f"a2-{kit.unique}", "mnnvl", **{contract.LABEL_CLIQUE: clique})
    kit.policy(f"drift-{kit.unique}", namespace, placement="Anywhere", imexChannel="Provided")
    for name, node in (("lws-0", a1), ("lws-0-1", a2)):
        kit.pod(
            namespace, name, labels={"app": "vllm", LWS_GROUP_KEY: "g4"}, annotations={LWS_SIZE: "2"}, nodeName=node
        )
    for pod in kit.running(namespace, 2):
        assert pod["metadata"]["annotations"][contract.ANNOTATION_POD_BACKEND] == "mnnvl"

    kit.relabel(a1, {contract.LABEL_BACKEND: "trtllm"})

    def backend(name: str) -> str:
        (pod,) = [p for p in kit.pods(namespace) if p["metadata"]["name"] == name]
        value: str = pod["metadata"]["annotations"][contract.ANNOTATION_POD_BACKEND]
        return value

    # The member whose own node kept mnnvl is re-checked with its group, not at its next pod event.
    kit.wait(lambda: backend("lws-0-1") == "auto", 30, "lws-0-1 falls back with its group")
    # The two PATCHes go out together (the reconciler's patch threads): either may land first.
    kit.wait(lambda: backend("lws-0") == "auto", 30, "lws-0 falls back on its own node")
    (event,) = kit.wait(
        lambda: [e for e in kit.events(namespace, "lws-0-1") if e["reason"] == "GroupInconsistent"],
        30,
        "GroupInconsistent event on lws-0-1",
    )
    assert a1 in event["message"]
