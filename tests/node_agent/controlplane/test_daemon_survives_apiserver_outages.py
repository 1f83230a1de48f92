"""The daemon outlives its API server: it probes while the API is down, backs off, writes the labels
once the API is back, and after a restart its watch reconnects and still sees ``fiar.io/reprobe``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import fiar_contract as contract
from devcluster.cluster import ControlPlane, Tier

pytestmark = pytest.mark.controlplane


def annotations(plane: ControlPlane, name: str) -> dict[str, str]:
    with plane.api_client() as api:
        return dict(client.CoreV1Api(api).read_node(name).metadata.annotations or {})


def labels(plane: ControlPlane, name: str) -> dict[str, str]:
    with plane.api_client() as api:
        return dict(client.CoreV1Api(api).read_node(name).metadata.labels or {})


def test_labels_are_written_when_the_api_comes_back_and_a_restart_is_survived(
    private_plane: Callable[[Tier], ControlPlane],
    unique: str,
    daemon: Callable[..., Any],
    eventually_fn: Callable[..., Any],
) -> None:
    plane = private_plane(Tier.A)
    own = f"gpu-{unique}"
    plane.add_node(own)
    plane.stop_component("kube-apiserver")

    d = daemon(plane.kubeconfig, own, Path("gb200-nvl72-clique"))
    eventually_fn(lambda: d.metric("fiar_agent_publish_failures_total") >= 2, what="failed writes while down")
    assert d.metric("fiar_agent_publish_pending") == 1
    assert d.metric("fiar_agent_probes_total") == 1, "the probe ran without the API"
    assert d.get("/healthz")[0] == 200, "an unreachable API server does not make the agent unhealthy"

    plane.start_component("kube-apiserver")
    eventually_fn(lambda: labels(plane, own).get(contract.LABEL_BACKEND) == "mnnvl", what="labels after the outage")
    assert labels(plane, own)[contract.LABEL_CLIQUE] == "6f1c2b8e-4d3a-4f0e-9b7c-5a1d2e3f4a5b.32766"
    assert d.metric("fiar_agent_publish_pending") == 0
    assert d.metric("fiar_agent_probes_total") == 1, "the pending verdict was written, not re-probed"

    plane.restart_apiserver(downtime=2.0)
    with plane.api_client() as api:
        client.CoreV1Api(api).patch_node(own, {"metadata": {"annotations": {contract.ANNOTATION_REPROBE: "1"}}})
    eventually_fn(lambda: d.metric("fiar_agent_probes_total") == 2, what="a probe after the restart")
    eventually_fn(
        lambda: contract.ANNOTATION_REPROBE not in annotations(plane, own),
        what="the reprobe annotation cleared after the restart",
    )
    assert d.proc.poll() is None, "the daemon never exited"
    assert d.stop() == 0


def test_a_verdict_on_the_node_survives_an_inconclusive_probe_made_while_the_api_was_down(
    private_plane: Callable[[Tier], ControlPlane],
    unique: str,
    daemon: Callable[..., Any],
    host_file: Callable[..., Path],
    eventually_fn: Callable[..., Any],
) -> None:
    """The previous report could not be read at start, so the probe could not keep it; once the API
    answers, the agent reads it and probes again instead of writing "no verdict" over it."""
    plane = private_plane(Tier.A)
    own = f"gpu-{unique}"
    plane.add_node(own)
    first = daemon(plane.kubeconfig, own, Path("h200x2-host"))
    eventually_fn(lambda: labels(plane, own).get(contract.LABEL_BACKEND) == "trtllm", what="a first verdict")
    assert first.stop() == 0

    busy = host_file("h200x2-host", lambda doc: doc["gpus"][1].update(compute_processes=1))
    plane.stop_component("kube-apiserver")
    d = daemon(plane.kubeconfig, own, busy)
    eventually_fn(lambda: d.metric("fiar_agent_probes_total") == 1, what="a probe while the API is down")
    plane.start_component("kube-apiserver")
    eventually_fn(lambda: d.metric("fiar_agent_probes_total") == 2, what="a second probe with the node's report")
    eventually_fn(lambda: d.metric("fiar_agent_publish_pending") == 0, what="the verdict written")
    assert labels(plane, own).get(contract.LABEL_BACKEND) == "trtllm", "the verdict was kept, not removed"
    assert "earlier verdict found on node" in d.output()
    assert d.stop() == 0
