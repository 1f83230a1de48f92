"""The reconciler takes every pending change at once and reviews each pod they concern once, its
PATCHes side by side: a node's verdict restored while its pods' own changes still wait behind it
re-annotates them together, not one PATCH after another. And it never waits for its events to be
posted: a verdict restored right after its removal is not held up by the removal's events."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping
from typing import Any

import fiar_contract as contract
from devcluster.feed import feed
from fiar_operator.core.decide import decide
from fiar_operator.core.liveness import Heartbeats
from fiar_operator.core.policy import parse_policy
from fiar_operator.core.settings import Settings
from fiar_operator.reconcile.reconciler import BATCH
from fiar_operator.runtime import Runtime
from fiar_operator.state import kube
from fiar_operator.state.changes import change_of

POLICY = {"metadata": {"name": "vllm", "uid": "p-1"}, "spec": {"podSelector": {}}}
VERIFIED = {"metadata": {"name": "gpu-1", "labels": {contract.LABEL_BACKEND: "trtllm"}}}


class SlowKube(kube.Kube):
    """Answers each pod PATCH after a round trip's time, and counts the PATCHes in flight at once;
    holds every Event POST until ``release`` is set."""

    def __init__(self, pods: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.pods = pods
        self.annotated: list[str] = []
        self.in_flight = self.most_at_once = 0
        self._lock = threading.Lock()
        self.release = threading.Event()
        self.posted: list[str] = []

    def call(self, method: str, path: str, query: Any = None, body: Any = None, **_: Any) -> Any:
        assert method == "POST" and path.endswith("/events"), (method, path)
        self.release.wait(30)
        with self._lock:
            self.posted.append(body["reason"])
        return body

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> dict[str, Any]:
        with self._lock:
            self.in_flight += 1
            self.most_at_once = max(self.most_at_once, self.in_flight)
        time.sleep(0.02)
        with self._lock:
            self.in_flight -= 1
            self.annotated.append(name)
        patched = copy.deepcopy(self.pods[(namespace, name)])
        patched["metadata"]["annotations"].update(annotations)
        patched["metadata"]["resourceVersion"] = "2"
        return patched


def fallen_back_pod(i: int) -> dict[str, Any]:
    """A running managed pod on gpu-1, re-annotated to the fallback while gpu-1 had no verdict."""
    fallback = decide(parse_policy(POLICY), "gpu-1", {}, trigger="reconcile")
    return {
        "metadata": {
            "name": f"vllm-{i}",
            "namespace": "ml",
            "uid": f"uid-{i}",
            "resourceVersion": "1",
            "labels": {contract.LABEL_POD_POLICY: "vllm"},
            "annotations": dict(fallback.annotations()),
        },
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {"phase": "Running"},
    }


def indexed(client: SlowKube, policy: bool = True, verified: bool = True) -> Runtime:
    """A standalone Runtime whose indexes hold namespace ml and every pod of ``client``, with POLICY
    and gpu-1's verdict unless told otherwise."""
    runtime = Runtime(Settings(metrics_port=None, standalone=True), client)
    if policy:
        runtime.store.put_policy(POLICY)
    runtime.store.put_namespace({"metadata": {"name": "ml", "labels": {}}})
    if verified:
        runtime.store.put_node(VERIFIED)
    for pod in client.pods.values():
        runtime.store.put_pod(pod)
    return runtime


def test_pods_waiting_behind_their_nodes_restored_verdict_are_patched_together_once_each() -> None:
    pods = {("ml", f"vllm-{i}"): fallen_back_pod(i) for i in range(16)}
    client = SlowKube(pods)
    runtime = indexed(client)
    for pod in pods.values():  # the MODIFIED events of the PATCHes that took the verdict away
        runtime.reconciler.changes.put(change_of("pods", "MODIFIED", pod))
    runtime.reconciler.changes.put(change_of("nodes", "MODIFIED", VERIFIED))  # the verdict comes back

    events = runtime.reconciler.apply_all(runtime.reconciler.changes.take_all(0, BATCH))

    assert sorted(client.annotated) == sorted(name for _, name in pods), "each pod patched once"
    assert client.most_at_once > 1, "the PATCHes went out side by side"
    assert {runtime.store.pods[key].backend for key in pods} == {"trtllm"}
    assert [e.reason for e in events] == ["NodeVerdictChanged"] * len(pods)
    assert len(runtime.reconciler.changes) == 0


def test_take_all_returns_every_pending_change_oldest_first_up_to_the_limit() -> None:
    runtime = Runtime(Settings(metrics_port=None, standalone=True), SlowKube({}))
    for name in ("a", "b", "c"):
        runtime.reconciler.changes.put(change_of("nodes", "MODIFIED", {"metadata": {"name": name}}))
    assert [c.name for c in runtime.reconciler.changes.take_all(0, 2)] == ["a", "b"]
    assert [c.name for c in runtime.reconciler.changes.take_all(0, 2)] == ["c"]
    assert runtime.reconciler.changes.take_all(0, 2) == []


def test_the_reconciler_goes_on_while_its_events_are_posted() -> None:
    pods = {("ml", f"vllm-{i}"): fallen_back_pod(i) for i in range(4)}
    client = SlowKube(pods)
    runtime = indexed(client, verified=False)
    events = feed(runtime, "nodes", VERIFIED)
    assert len(events) == 4
    handed = threading.Thread(target=runtime.reconciler.post, args=(events,))
    handed.start()
    handed.join(10)
    try:
        assert not handed.is_alive(), "post returned while every Event POST was still held"
        assert client.posted == []
    finally:
        client.release.set()
    deadline = time.monotonic() + 10
    while len(client.posted) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.posted == ["NodeVerdictChanged"] * 4


def test_a_policy_whose_status_alone_changed_concerns_none_of_its_pods() -> None:
    """The operator rewrites a policy's status every half second while its pods change, and each write
    comes back as a MODIFIED policy: reviewing all the policy's pods for it made every write cost work
    in proportion to them. Only a change the parsed policy shows (its spec: a new generation) does."""
    pods = {("ml", f"vllm-{i}"): fallen_back_pod(i) for i in range(4)}
    client = SlowKube(pods)
    runtime = indexed(client, policy=False, verified=False)
    policy = copy.deepcopy(POLICY)
    policy["metadata"].update(generation=1, resourceVersion="1")
    feed(runtime, "policies", policy)
    assert client.annotated == [], "gpu-1 has no verdict yet: the fallback stays"
    runtime.store.put_node(VERIFIED)  # its change is still on its way to the reconciler

    status_only = copy.deepcopy(policy)
    status_only["metadata"]["resourceVersion"] = "2"
    status_only["status"] = {"pods": {"managed": 4}}
    feed(runtime, "policies", status_only)
    assert client.annotated == [], "a status write reviewed the policy's pods"

    new_spec = copy.deepcopy(status_only)
    new_spec["metadata"].update(generation=2, resourceVersion="3")
    feed(runtime, "policies", new_spec)
    assert sorted(client.annotated) == sorted(name for _, name in pods), "a new generation reviews every pod"


class TimedKube(SlowKube):
    """SlowKube that notes when each PATCH ended."""

    def __init__(self, pods: dict[tuple[str, str], dict[str, Any]]) -> None:
        super().__init__(pods)
        self.ended: list[float] = []

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> dict[str, Any]:
        patched = super().annotate_pod(namespace, name, uid, annotations)
        self.ended.append(time.monotonic())
        return patched


class RecordedBeats(Heartbeats):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def beat(self, name: str) -> None:
        self.times.append(time.monotonic())
        super().beat(name)


def test_the_reconciler_beats_while_its_patches_go_out() -> None:
    """The reviews come first, in memory; the PATCHes after them can take minutes at fleet scale
    (20,000 pods, 8 at a time), which the liveness probe must not take for a hung reconciler."""
    pods = {("ml", f"vllm-{i}"): fallen_back_pod(i) for i in range(16)}
    client = TimedKube(pods)
    runtime = indexed(client)
    runtime.reconciler.heartbeats = beats = RecordedBeats()
    runtime.reconciler.apply_all([change_of("nodes", "MODIFIED", VERIFIED)])
    assert len(client.annotated) == 16
    first_done = min(client.ended)
    assert sum(t > first_done for t in beats.times) >= 8, "no beat once the first PATCH was answered"
