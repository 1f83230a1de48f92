"""``fiar.io/reprobe`` against a real kube-apiserver: any value is cleared once answered (also ones
that Python and Go encode differently, and ``""``), the same value set again is a new request, and
a value changed while the agent was clearing is kept."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import fiar_contract as contract
from devcluster.cluster import ControlPlane
from node_agent.publish import NodePublisher, NodeState, load_client_config

pytestmark = pytest.mark.controlplane

HOSTILE_VALUES = ["prüfen", "a&b", "<now>", "", "now", "x\ny", '"quoted" \\ and \u2028']


def annotate(plane: ControlPlane, name: str, value: str | None) -> None:
    with plane.api_client() as api:
        client.CoreV1Api(api).patch_node(name, {"metadata": {"annotations": {contract.ANNOTATION_REPROBE: value}}})


def reprobe(plane: ControlPlane, name: str) -> str | None:
    with plane.api_client() as api:
        notes = client.CoreV1Api(api).read_node(name).metadata.annotations or {}
    return notes.get(contract.ANNOTATION_REPROBE)


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_any_reprobe_value_is_cleared(plane_a: ControlPlane, unique: str, value: str) -> None:
    own = f"gpu-{unique}"
    plane_a.add_node(own)
    annotate(plane_a, own, value)
    publisher = NodePublisher(load_client_config(str(plane_a.kubeconfig)), own)
    assert publisher.read().reprobe == value
    assert publisher.clear_reprobe(value) is True
    assert reprobe(plane_a, own) is None


class RacingPublisher(NodePublisher):
    """A publisher whose Node gets a new reprobe value from an admin right after each read."""

    def __init__(self, plane: ControlPlane, node: str, new_values: list[str]) -> None:
        super().__init__(load_client_config(str(plane.kubeconfig)), node)
        self.plane = plane
        self.new_values = new_values

    def read(self) -> NodeState:
        state = super().read()
        if self.new_values:
            annotate(self.plane, self.node_name, self.new_values.pop(0))
        return state


def test_a_request_made_while_clearing_is_kept(plane_a: ControlPlane, unique: str) -> None:
    own = f"gpu-{unique}"
    plane_a.add_node(own)
    annotate(plane_a, own, "first")
    publisher = RacingPublisher(plane_a, own, ["second"])
    assert publisher.clear_reprobe("first") is False
    assert reprobe(plane_a, own) == "second"


def test_a_node_that_changed_elsewhere_is_read_again_and_cleared(plane_a: ControlPlane, unique: str) -> None:
    own = f"gpu-{unique}"
    plane_a.add_node(own)
    annotate(plane_a, own, "now")
    publisher = RacingPublisher(plane_a, own, ["now"])  # rewritten with the same value: a new resourceVersion
    with plane_a.api_client() as api:
        before = client.CoreV1Api(api).read_node(own).metadata.resource_version
    assert publisher.clear_reprobe("now") is True
    assert reprobe(plane_a, own) is None
    with plane_a.api_client() as api:
        assert client.CoreV1Api(api).read_node(own).metadata.resource_version != before


def test_the_daemon_clears_every_request_and_honours_the_same_value_again(
    plane_a: ControlPlane,
    unique: str,
    daemon: Callable[..., Any],
    host_file: Callable[..., Path],
    eventually_fn: Callable[..., Any],
) -> None:
    own = f"gpu-{unique}"
    plane_a.add_node(own)
    d = daemon(plane_a.kubeconfig, own, host_file("h200x2-host"))
    eventually_fn(lambda: d.metric("fiar_agent_probes_total") == 1, what="the first probe")
    probes = 1
    for value in ["prüfen", "prüfen", "a&b", "<now>", "", ""]:
        eventually_fn(lambda: reprobe(plane_a, own) is None, what="no pending reprobe")
        annotate(plane_a, own, value)
        probes += 1
        eventually_fn(lambda n=probes: d.metric("fiar_agent_probes_total") == n, what=f"a probe for {value!r}")
        eventually_fn(lambda: reprobe(plane_a, own) is None, what=f"{value!r} to be cleared")
    assert d.metric("fiar_agent_reprobe_requests_total") == 6
    assert d.stop() == 0
