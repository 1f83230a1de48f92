"""The in-memory indexes: ordering of updates, pods by node and policy, the admission memo."""

from __future__ import annotations

from typing import Any

import fiar_contract as contract
from fiar_operator.core.pods import pod_record
from fiar_operator.state import kinds
from fiar_operator.state.store import MEMO_TTL, Store


def pod(name: str, uid: str, rv: str, node: str | None = None, policy: str | None = "p") -> dict[str, Any]:
    labels = {contract.LABEL_POD_POLICY: policy} if policy else {}
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": rv, "labels": labels},
        "spec": {"nodeName": node} if node else {},
    }


def test_older_updates_never_replace_newer_ones() -> None:
    store = Store()
    store.put_node({"metadata": {"name": "n", "resourceVersion": "20", "labels": {contract.LABEL_BACKEND: "trtllm"}}})
    store.put_node({"metadata": {"name": "n", "resourceVersion": "19", "labels": {contract.LABEL_BACKEND: "mnnvl"}}})
    assert store.nodes["n"][contract.LABEL_BACKEND] == "trtllm"
    store.put_pod(pod("a", "u1", "7", node="n"))
    store.put_pod(pod("a", "u1", "5"))
    assert store.pods[("ml", "a")].node == "n"


def test_pods_are_indexed_by_node_and_policy_and_moved_on_update() -> None:
    store = Store()
    store.put_pod(pod("a", "u1", "1"))
    assert store.pods_of_policy("p")[0].name == "a" and store.pods_on_node("n") == []
    store.put_pod(pod("a", "u1", "2", node="n"))
    assert [p.name for p in store.pods_on_node("n")] == ["a"]
    store.put_pod(pod("a", "u1", "3", node="n", policy=None))
    assert store.pods_on_node("n") == [] and store.pods_of_policy("p") == []
    assert store.sizes()["pods"] == 1 and store.sizes()["managed_pods"] == 0


def test_deleting_a_predecessor_keeps_its_same_named_successor() -> None:
    store = Store()
    store.put_pod(pod("lws-0", "new", "9", node="n"))
    store.delete_pod("ml", "lws-0", uid="old")
    assert store.pods[("ml", "lws-0")].uid == "new"
    store.delete_pod("ml", "lws-0", uid="new")
    assert ("ml", "lws-0") not in store.pods and store.pods_on_node("n") == []


def test_memo_recalls_generated_names_by_prefix_until_it_expires() -> None:
    now = [1000.0]
    store = Store(clock=lambda: now[0])
    store.remember(
        pod_record(
            {
                "metadata": {
                    "generateName": "vllm-6c8d9f-",
                    "namespace": "ml",
                    "labels": {contract.LABEL_POD_POLICY: "p"},
                }
            }
        )
    )
    recalled = store.recall("ml", "vllm-6c8d9f-x7k2p")
    assert recalled is not None and recalled.policy == "p"
    assert store.recall("ml", "vllm-6c8d9f-x7k2p-extra") is None
    assert store.recall("other", "vllm-6c8d9f-x7k2p") is None
    now[0] += MEMO_TTL + 1
    assert store.recall("ml", "vllm-6c8d9f-x7k2p") is None


def test_memo_uses_the_truncated_prefix_of_long_generate_names() -> None:
    store = Store()
    base = "a" * 70
    store.remember(pod_record({"metadata": {"generateName": base, "namespace": "ml"}}))
    assert store.recall("ml", "a" * 58 + "xyz12") is not None


def test_relist_replaces_everything_and_marks_the_kind_synced() -> None:
    store = Store()
    store.put_pod(pod("gone", "u0", "1", node="n"))
    store.replace_all(kinds.PODS, [pod("kept", "u1", "2", node="m")])
    assert list(store.pods) == [("ml", "kept")] and store.pods_on_node("n") == []
    assert store.synced == {"pods": True}


def test_invalid_policy_is_kept_aside_with_its_error() -> None:
    store = Store()
    store.put_policy({"metadata": {"name": "bad"}, "spec": {"backends": []}})
    assert "bad" not in store.policies and "podSelector is required" in store.policy_errors["bad"]
    store.put_policy({"metadata": {"name": "bad"}, "spec": {"podSelector": {}}})
    assert "bad" in store.policies and "bad" not in store.policy_errors
