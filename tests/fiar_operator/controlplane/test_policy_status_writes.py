"""Policy status writes against the real API server: a node flip rewrites only the policies whose
own figures changed, and a failing write backs off instead of retrying every pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from devcluster import workloads
from fiar_operator.reconcile.status import NODE_COUNTS_REFRESH, StatusWriter
from fiar_operator.state import kube
from fiar_operator.state.store import Store

pytestmark = pytest.mark.controlplane


def mnnvl_node(store: Store, version: str, verdict: str = "mnnvl") -> None:
    labels = {contract.LABEL_BACKEND: verdict, contract.LABEL_TRTLLM: "pass"}
    store.put_node({"metadata": {"name": "gpu-0", "resourceVersion": version, "labels": labels}})


def test_a_node_flip_rewrites_only_the_policies_whose_own_counts_changed(kit: Any) -> None:
    store, now = Store(), [0.0]
    for i in range(20):
        body = workloads.policy(
            f"flip-{kit.unique}-{i}",
            podSelector={"matchLabels": {"app": f"none-{i}"}},
            backends=["mnnvl" if i % 2 else "trtllm"],
        )
        store.put_policy(kit.kube.call("POST", kube.POLICIES, body=body))
        kit.policies.append(body["metadata"]["name"])
    mnnvl_node(store, "1")
    writer = StatusWriter(store, kit.kube, 0.5, monotonic=lambda: now[0])
    writer.mark()
    assert writer.flush() == 20

    now[0] += 1
    mnnvl_node(store, "2", verdict="trtllm")  # mnnvl lost: only the 10 mnnvl policies' own count changes
    writer.mark()
    assert writer.flush() == 10
    # As the API server answered each write (an operator the session runs may write them too).
    statuses = [store.policy_objects[name]["status"] for name in kit.policies]
    assert [s["nodes"]["verified"] for s in statuses[1::2]] == [0] * 10
    assert all(s["nodes"]["mnnvl"] == 1 for s in statuses[0::2])  # stale cluster-wide count, for now

    now[0] += NODE_COUNTS_REFRESH
    assert writer.flush() == 10  # the deferred refresh of the cluster-wide counts
    assert all(store.policy_objects[name]["status"]["nodes"]["mnnvl"] == 0 for name in kit.policies)
    writer.mark()
    assert writer.flush() == 0


def test_a_failing_status_write_backs_off(kit: Any, crd_c: Any, tmp_path: Path) -> None:
    denied = kube.Kube(kube.configuration(str(crd_c.write_kubeconfig(tmp_path / "bad", "nobody", token="bogus"))))
    store, now = Store(), [0.0]
    store.put_policy(
        {"metadata": {"name": f"backoff-{kit.unique}", "resourceVersion": "1"}, "spec": {"podSelector": {}}}
    )
    writer = StatusWriter(store, denied, 0.5, monotonic=lambda: now[0])
    writer.mark(f"backoff-{kit.unique}")
    while now[0] < 300:
        writer.flush()
        now[0] += 0.5
    assert 6 <= writer.failures(f"backoff-{kit.unique}") <= 20  # a retry every pass would be 600 attempts
