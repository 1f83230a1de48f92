"""``fiar-agent run`` against a real kube-apiserver: labels its own Node and no other, removes stale
labels it owns, honours and clears ``fiar.io/reprobe``, re-probes on a driver change, stops on SIGTERM."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import fiar_contract as contract
from devcluster.cluster import ControlPlane
from node_agent import report

pytestmark = pytest.mark.controlplane

EXPECTED_H200X2 = {
    contract.LABEL_BACKEND: "trtllm",
    contract.LABEL_MULTICAST: "disabled",
    contract.LABEL_MNNVL: "skipped",
    contract.LABEL_TRTLLM: "pass",
    contract.LABEL_GPUS: "2",
}


def node(plane: ControlPlane, name: str) -> Any:
    with plane.api_client() as api:
        return client.CoreV1Api(api).read_node(name)


def fiar_labels(plane: ControlPlane, name: str) -> dict[str, str]:
    labels = node(plane, name).metadata.labels or {}
    return {k: v for k, v in labels.items() if k in contract.AGENT_LABELS}


def annotate(plane: ControlPlane, name: str, key: str, value: str | None) -> None:
    with plane.api_client() as api:
        client.CoreV1Api(api).patch_node(name, {"metadata": {"annotations": {key: value}}})


def test_daemon_labels_its_own_node_and_no_other(
    plane_a: ControlPlane, unique: str, daemon: Callable[..., Any], eventually_fn: Callable[..., Any]
) -> None:
    own, other = f"gpu-{unique}", f"peer-{unique}"
    plane_a.add_node(
        own,
        labels={
            contract.LABEL_CLIQUE: "stale-clique.1",  # owned, no longer true: removed
            contract.LABEL_MNNVL: "pass",  # owned, stale value: replaced
            "fiar.io/team": "ml",  # not owned: kept
        },
    )
    plane_a.add_node(other, labels={contract.LABEL_BACKEND: "mnnvl"})
    other_before = node(plane_a, other).metadata.resource_version

    d = daemon(plane_a.kubeconfig, own, Path("h200x2-host"), via_env=True)
    eventually_fn(lambda: fiar_labels(plane_a, own) == EXPECTED_H200X2, what="the verdict on the own node")

    labels = node(plane_a, own).metadata.labels
    assert labels["fiar.io/team"] == "ml"
    assert contract.LABEL_CLIQUE not in labels
    doc = report.loads(node(plane_a, own).metadata.annotations[contract.ANNOTATION_PROBE_REPORT])
    assert doc is not None
    assert doc["node"] == own
    assert doc["labels"] == EXPECTED_H200X2
    assert node(plane_a, other).metadata.resource_version == other_before, "the other node was never written"

    status, body = d.get("/healthz")
    assert (status, body.strip()) == (200, "ok")
    assert d.metric("fiar_agent_probes_total") == 1
    assert d.metric("process_resident_memory_bytes") > 0
    assert d.stop() == 0
    assert "stopping" in d.output()


def test_reprobe_annotation_is_honoured_and_cleared(
    plane_a: ControlPlane,
    unique: str,
    daemon: Callable[..., Any],
    host_file: Callable[..., Path],
    eventually_fn: Callable[..., Any],
) -> None:
    own = f"gpu-{unique}"
    plane_a.add_node(own)
    fixture = host_file("h200x2-host")
    d = daemon(plane_a.kubeconfig, own, fixture)
    eventually_fn(lambda: fiar_labels(plane_a, own) == EXPECTED_H200X2, what="first verdict")
    first = report.loads(node(plane_a, own).metadata.annotations[contract.ANNOTATION_PROBE_REPORT])
    assert first is not None

    # the host changes (trtllm now fails) and an admin asks for a new probe
    doc = json.loads(fixture.read_text())
    doc["simulate"] = {"smoke": {"trtllm": {"outcome": "fail", "message": "simulated regression"}}}
    fixture.write_text(json.dumps(doc))
    annotate(plane_a, own, contract.ANNOTATION_REPROBE, "please")

    eventually_fn(lambda: fiar_labels(plane_a, own).get(contract.LABEL_TRTLLM) == "fail", what="the re-probed verdict")
    eventually_fn(
        lambda: contract.ANNOTATION_REPROBE not in (node(plane_a, own).metadata.annotations or {}),
        what="the reprobe annotation to be cleared",
    )
    assert fiar_labels(plane_a, own)[contract.LABEL_BACKEND] == "none"
    second = report.loads(node(plane_a, own).metadata.annotations[contract.ANNOTATION_PROBE_REPORT])
    assert second is not None and second["probe_time"] >= first["probe_time"]
    assert d.metric("fiar_agent_reprobe_requests_total") == 1
    assert d.metric("fiar_agent_probes_total") == 2

    # asking again with the same value is a new request once the old one was cleared
    annotate(plane_a, own, contract.ANNOTATION_REPROBE, "please")
    eventually_fn(lambda: d.metric("fiar_agent_probes_total") == 3, what="a third probe")
    eventually_fn(
        lambda: contract.ANNOTATION_REPROBE not in (node(plane_a, own).metadata.annotations or {}),
        what="the second reprobe to be cleared",
    )
    assert d.stop() == 0


def test_driver_change_triggers_a_probe(
    plane_a: ControlPlane,
    unique: str,
    daemon: Callable[..., Any],
    host_file: Callable[..., Path],
    eventually_fn: Callable[..., Any],
) -> None:
    own = f"gpu-{unique}"
    plane_a.add_node(own)
    fixture = host_file("h200x2-host")
    d = daemon(plane_a.kubeconfig, own, fixture)
    eventually_fn(lambda: fiar_labels(plane_a, own) == EXPECTED_H200X2, what="first verdict")

    doc = json.loads(fixture.read_text())
    doc["driver_version"] = "590.10.01"
    fixture.write_text(json.dumps(doc))

    def driver_in_report() -> Any:
        text = (node(plane_a, own).metadata.annotations or {}).get(contract.ANNOTATION_PROBE_REPORT)
        parsed = report.loads(text)
        return parsed is not None and parsed["versions"]["driver"] == "590.10.01"

    eventually_fn(driver_in_report, what="a report of the new driver")
    assert "driver version changed: 580.159.04 -> 590.10.01" in d.output()
    assert d.stop() == 0
