"""The in-memory indexes: ordering of updates, pods by node and policy, the admission memo."""

from __future__ import annotations

import json
import sys
from typing import Any

import fiar_contract as contract
from fiar_operator.core.decide import parse_decision
from fiar_operator.core.pods import FIELD_PATH, pod_record
from fiar_operator.core.strings import Kept, Shared
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


def test_pods_are_indexed_by_node_and_policy_and_leave_when_they_lose_the_policy_label() -> None:
    store = Store()
    store.put_pod(pod("a", "u1", "1"))
    assert store.pods_of_policy("p")[0].name == "a" and store.pods_on_node("n") == []
    store.put_pod(pod("a", "u1", "2", node="n"))
    assert [p.name for p in store.pods_on_node("n")] == ["a"]
    store.put_pod(pod("a", "u1", "3", node="n", policy=None))
    assert store.pods_on_node("n") == [] and store.pods_of_policy("p") == []
    assert store.sizes()["pods"] == 0 and store.sizes()["managed_pods"] == 0, "the pod watch no longer selects it"


def test_a_pod_without_the_policy_label_is_never_indexed() -> None:
    store = Store()
    record = store.put_pod(pod("web", "u2", "1", node="n", policy=None))
    assert record.name == "web" and not record.managed
    assert store.pods == {} and store.by_node == {} and store.by_policy == {}


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


def deployment_pod(i: int) -> dict[str, Any]:
    """A pod of a Deployment as a watch event decodes it: every string its own object."""
    return json.loads(
        json.dumps(
            {
                "metadata": {
                    "name": f"web-7d9f8c6b5-{i:05d}",
                    "namespace": "ml",
                    "uid": f"uid-{i}",
                    "resourceVersion": str(100 + i),
                    "generateName": "web-7d9f8c6b5-",
                    "labels": {"app": "web", "pod-template-hash": "7d9f8c6b5"},
                },
                "spec": {"nodeName": "node-1", "containers": [{"name": "web", "image": "vllm/vllm-openai:v0.33.0"}]},
                "status": {"phase": "Running"},
            }
        )
    )


def test_records_of_pods_alike_share_their_strings_and_their_empty_parts() -> None:
    """What repeats from pod to pod is held once in the index: 20,000 pods take about 1.0 KiB each
    instead of 2.3 KiB (docs/operator.md, "Indexes under bad input and failures")."""
    first, second = pod_record(deployment_pod(1)), pod_record(deployment_pod(2))
    for a, b in ((first.namespace, second.namespace), (first.node, second.node), (first.phase, second.phase)):
        assert a == b and a is b
    for (key_a, value_a), (key_b, value_b) in zip(first.labels.items(), second.labels.items(), strict=True):
        assert key_a is key_b and value_a is value_b
    assert first.containers[0][0] is second.containers[0][0] and first.releases[0][1] is second.releases[0][1]
    empty = (first.container_starts, second.uncontrolled_reasons, first.reads, second.imex_claims)
    assert all(
        part is other
        for part, other in zip(
            empty, (second.container_starts, first.uncontrolled_reasons, second.reads, first.imex_claims), strict=True
        )
    )
    assert first.constraint is second.constraint


def managed_deployment_pod(i: int, node: str = "gpu-1") -> dict[str, Any]:
    """A managed pod of a Deployment, bound and decided, as a watch event decodes it."""
    decision = {"backend": "trtllm", "fusion": "on", "guard": True, "node": node, "policy": "p", "reason": "Verified"}
    injected = {"name": contract.ENV_VAR, "valueFrom": {"fieldRef": {"fieldPath": FIELD_PATH}}}
    decoded: dict[str, Any] = json.loads(
        json.dumps(
            {
                "metadata": {
                    "name": f"vllm-7d9f8c6b5-{i:05d}",
                    "namespace": "ml",
                    "uid": f"uid-{i}",
                    "resourceVersion": str(100 + i),
                    "generation": 1,
                    "labels": {"app": "vllm", "pod-template-hash": "7d9f8c6b5", contract.LABEL_POD_POLICY: "p"},
                    "annotations": {
                        contract.ANNOTATION_POD_BACKEND: "trtllm",
                        contract.ANNOTATION_POD_SGLANG_FLAG: contract.SGLANG_FLAGS["off"],
                        **{g.annotation: g.off for g in contract.MULTICAST_GUARD},
                        contract.ANNOTATION_POD_DECISION: json.dumps(decision),
                    },
                },
                "spec": {
                    "nodeName": node,
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.33.0",
                            "command": ["vllm", "serve", "m"],
                            "env": [injected],
                        }
                    ],
                },
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {"name": "vllm", "state": {"running": {"startedAt": "2026-12-06T04:50:12Z"}}}
                    ],
                },
            }
        )
    )
    return decoded


def test_managed_pods_alike_hold_one_copy_of_each_part_their_records_read() -> None:
    """Labels, the decision of one node, what one template's spec gives and the annotations' values
    are held once however many pods hold them (a record holds about 0.65 KiB of its own,
    docs/operator.md "Indexes under bad input and failures")."""
    first, second = pod_record(managed_deployment_pod(1)), pod_record(managed_deployment_pod(2))
    assert first.labels is second.labels and first.container_starts is second.container_starts
    assert first.decision is second.decision and first.decision == parse_decision(
        managed_deployment_pod(1)["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION]
    )
    for name in ("containers", "reads", "releases", "guard", "constraint", "backend", "sglang", "uncontrolled"):
        assert getattr(first, name) is getattr(second, name), name
    assert first.reads and first.guarded and first.constraint.node_selector and first.releases
    elsewhere = pod_record(managed_deployment_pod(4, node="gpu-2"))
    assert elsewhere.decision is not None and first.decision is not None and elsewhere.decision["node"] == "gpu-2"
    assert all(a is b for a, b in zip(first.decision, elsewhere.decision, strict=True))  # keys
    assert elsewhere.decision["backend"] is first.decision["backend"]
    assert elsewhere.labels is first.labels
    assert not hasattr(first, "__dict__")  # a record's fields are slots: no dict per record


def test_a_decision_that_is_not_ours_is_no_decision_whether_kept_or_not() -> None:
    pod = managed_deployment_pod(1)
    for raw in ("[1, 2]", "{", "x" * 5000, ""):
        pod["metadata"]["annotations"][contract.ANNOTATION_POD_DECISION] = raw
        assert pod_record(pod).decision is None and pod_record(pod).decision is None


def test_the_table_of_kept_values_starts_over_when_full_and_keeps_no_large_value() -> None:
    """What a tenant writes decides what the table holds: it is bounded in entries and in bytes, and
    what it forgot is kept again from the next time it is seen."""
    made: list[str] = []

    def make(key: str) -> list[str]:
        made.append(key)
        return [key]

    table: Kept[str, list[str]] = Kept(entries=2, size=100)
    first = table("a", make, 10)
    assert table("a", make, 10) is first and made == ["a"]
    table("b", make, 10)
    table("c", make, 10)  # the third: the table starts over
    assert len(table) == 1 and table("a", make, 10) is not first and made == ["a", "b", "c", "a"]
    table("big", make, 100)  # as large as the bound: made, never kept
    assert len(table) == 2 and table("big", make, 100) == ["big"] and made.count("big") == 2
    by_size: Kept[str, list[str]] = Kept(entries=100, size=100)
    by_size("x", make, 60)
    by_size("y", make, 60)  # past the bytes: the table starts over
    assert len(by_size) == 1


def test_node_labels_alike_are_held_once() -> None:
    store = Store()
    for name in ("n1", "n2"):
        store.put_node(json.loads(json.dumps({"metadata": {"name": name, "labels": {"zone": "a"}}})))
    ((key1, value1),), ((key2, value2),) = store.nodes["n1"].items(), store.nodes["n2"].items()
    assert key1 is key2 and value1 is value2


def test_the_table_of_shared_strings_starts_over_when_full_and_keeps_no_long_string() -> None:
    """Tenants write the strings: the table is bounded whatever they write, and what it forgot is
    shared again from the next time it is seen."""
    table = Shared(entries=4, size=100_000, longest=10)
    first = [table(f"v{i}") for i in range(4)]
    assert len(table) == 4 and table("".join(["v", "0"])) is first[0]
    table("v4")  # the fifth: the table starts over
    assert len(table) == 1
    again = table("".join(["v", "1"]))
    assert again == "v1" and table("".join(["v", "1"])) is again
    long = "x" * 11
    assert table(long) is long and len(table) == 2
    by_size = Shared(entries=100, size=2 * sys.getsizeof("abc"), longest=10)
    by_size("abc"), by_size("def")
    by_size("ghi")
    assert len(by_size) == 1
    wide = Shared(entries=100, size=2 * sys.getsizeof("abc"), longest=10)
    wide("\U0001f600" * 3)  # four bytes a character: the bound is in bytes, not characters
    wide("abc")
    assert len(wide) == 1


def managed_pod(generation: Any, uid: str = "u-1", image: str = "vllm/vllm-openai:v0.33.0") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ml",
            "name": "vllm-0",
            "uid": uid,
            "generation": generation,
            "resourceVersion": "1",
            "labels": {"app": "vllm", contract.LABEL_POD_POLICY: "p"},
        },
        "spec": {"containers": [{"name": "vllm", "image": image, "command": ["sh", "-c", "vllm serve m"]}]},
        "status": {"phase": "Pending"},
    }


def running(pod: dict[str, Any], node: str = "gpu-1") -> dict[str, Any]:
    started = {"name": "vllm", "state": {"running": {"startedAt": "2026-12-03T12:00:00Z"}}}
    return {
        **pod,
        "spec": {**pod["spec"], "nodeName": node},
        "status": {"phase": "Running", "containerStatuses": [started]},
    }


def test_a_pods_status_changes_keep_what_its_spec_gave_and_read_the_rest_again() -> None:
    first = pod_record(managed_pod(1))
    later = pod_record(running(managed_pod(1)), previous=first)
    assert first.uncontrolled == ("vllm",) and first.releases == (("vllm", "0.33.0"),)
    assert later.containers is first.containers and later.uncontrolled_reasons is first.uncontrolled_reasons
    assert (later.node, later.phase, later.generation) == ("gpu-1", "Running", 1)
    assert later.container_starts == {"vllm": "2026-12-03T12:00:00Z"}
    assert later == pod_record(running(managed_pod(1)))  # the same record as one read whole


def test_a_changed_spec_a_new_pod_or_no_generation_is_read_whole() -> None:
    first = pod_record(managed_pod(1))
    changed = pod_record(managed_pod(2, image="vllm/vllm-openai:v0.26.0"), previous=first)
    assert changed.releases == (("vllm", "0.26.0"),)
    recreated = pod_record(managed_pod(1, uid="u-2", image="vllm/vllm-openai:v0.26.0"), previous=first)
    assert recreated.releases == (("vllm", "0.26.0"),)
    for odd in (None, "1", 0, -1, True):
        unknown = pod_record(managed_pod(odd, image="vllm/vllm-openai:v0.26.0"), previous=first)
        assert unknown.releases == (("vllm", "0.26.0"),) and unknown.generation == 0


def test_a_pod_that_becomes_managed_has_its_commands_read() -> None:
    unlabelled = managed_pod(1)
    del unlabelled["metadata"]["labels"][contract.LABEL_POD_POLICY]
    first = pod_record(unlabelled)
    assert first.uncontrolled == ()
    assert pod_record(managed_pod(1), previous=first).uncontrolled == ("vllm",)


def test_the_index_keeps_the_spec_part_of_a_pod_across_its_status_changes() -> None:
    store = Store()
    first = store.put_pod(managed_pod(1))
    moved = running(managed_pod(1))
    moved["metadata"] = {**moved["metadata"], "resourceVersion": "2"}
    later = store.put_pod(moved)
    assert later.containers is first.containers and later.node == "gpu-1"
    assert store.pods_on_node("gpu-1") == [later]
