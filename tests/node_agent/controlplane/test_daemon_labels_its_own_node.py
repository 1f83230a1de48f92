"""``fiar-agent run`` against a real kube-apiserver: labels its own Node and no other, removes stale
labels it owns, honours and clears ``fiar.io/reprobe``, re-probes on a driver change, stops on SIGTERM;
after a probe that could not test it keeps the verdict of the same hardware (or writes no backend)
and retries after ``--retry-interval``; a hostile report annotation does not stop it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import fiar_contract as contract
from devcluster.cluster import ControlPlane
from devcluster.waiting import wait_for
from node_agent import report

pytestmark = pytest.mark.controlplane

EXPECTED_H200X2 = {
    contract.LABEL_BACKEND: "trtllm",
    contract.LABEL_MULTICAST: "disabled",
    contract.LABEL_MULTICAST_USABLE: "forbidden",
    contract.LABEL_MNNVL: "skipped",
    contract.LABEL_TRTLLM: "pass",
    contract.LABEL_GPUS: "2",
    contract.LABEL_COMPUTE_CAPABILITY: "9.0",
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


def _software(fixture: Path, torch: str | None) -> None:
    doc = json.loads(fixture.read_text())
    doc["simulate"] = {"software": {"torch": torch, "flashinfer": "0.6.13"}}
    fixture.write_text(json.dumps(doc))


def _report(plane: ControlPlane, name: str) -> dict[str, Any] | None:
    return report.loads((node(plane, name).metadata.annotations or {}).get(contract.ANNOTATION_PROBE_REPORT))


def _first_verdict(
    plane: ControlPlane, unique: str, daemon: Callable[..., Any], fixture: Path, *args: str
) -> tuple[str, Any, dict[str, Any]]:
    """A node, a daemon on it simulating ``fixture``, and the report of its first (h200x2) verdict."""
    own = f"gpu-{unique}"
    plane.add_node(own)
    d = daemon(plane.kubeconfig, own, fixture, *args)
    wait_for(lambda: fiar_labels(plane, own) == EXPECTED_H200X2, 60, "first verdict")
    first = _report(plane, own)
    assert first is not None
    return own, d, first


def test_inconclusive_probe_keeps_the_verdict_and_retries_sooner(
    plane_a: ControlPlane,
    unique: str,
    daemon: Callable[..., Any],
    host_file: Callable[..., Path],
    eventually_fn: Callable[..., Any],
) -> None:
    fixture = host_file("h200x2-host")
    own, d, first = _first_verdict(plane_a, unique, daemon, fixture, "--retry-interval", "1")
    assert first["status"] == "ok"
    time.sleep(2)
    assert d.metric("fiar_agent_probes_total") == 1, "an ok probe waits for --interval, not --retry-interval"

    _software(fixture, None)  # torch disappears from the image: nothing can be tested
    annotate(plane_a, own, contract.ANNOTATION_REPROBE, "now")

    def kept() -> Any:
        doc = _report(plane_a, own)
        return doc is not None and doc["status"] == "degraded" and doc.get("labels_kept_from") == first["probe_time"]

    eventually_fn(kept, what="a degraded report that keeps the first verdict")
    assert fiar_labels(plane_a, own) == EXPECTED_H200X2, "the verified labels stay"
    probes = d.metric("fiar_agent_probes_total")
    eventually_fn(lambda: d.metric("fiar_agent_probes_total") >= probes + 2, what="retries after --retry-interval")
    assert fiar_labels(plane_a, own) == EXPECTED_H200X2
    assert "next probe in 1s (--retry-interval)" in d.output()
    assert d.stop() == 0


def _simulate(fixture: Path, **settings: Any) -> None:
    doc = json.loads(fixture.read_text())
    doc["simulate"] = settings
    fixture.write_text(json.dumps(doc))


def test_unreadable_gpus_in_between_do_not_lose_the_verdict(
    plane_a: ControlPlane,
    unique: str,
    daemon: Callable[..., Any],
    host_file: Callable[..., Path],
    eventually_fn: Callable[..., Any],
) -> None:
    fixture = host_file("h200x2-host")
    own, d, first = _first_verdict(plane_a, unique, daemon, fixture, "--retry-interval", "600")

    _simulate(fixture, nvml="missing")  # NVML fails for a while
    annotate(plane_a, own, contract.ANNOTATION_REPROBE, "nvml")
    eventually_fn(lambda: d.metric("fiar_agent_probes_total") == 2, what="a probe with unreadable GPUs")
    eventually_fn(lambda: (_report(plane_a, own) or {}).get("fingerprint") is None, what="its report written")
    assert fiar_labels(plane_a, own) == EXPECTED_H200X2, "unreadable GPUs keep the verdict and GPU count"

    doc = json.loads(fixture.read_text())
    doc["simulate"] = {}
    doc["gpus"][1]["compute_processes"] = 1  # readable again, but busy: nothing can be tested
    fixture.write_text(json.dumps(doc))
    annotate(plane_a, own, contract.ANNOTATION_REPROBE, "busy")
    eventually_fn(lambda: d.metric("fiar_agent_probes_total") == 3, what="a probe on busy GPUs")
    eventually_fn(lambda: (_report(plane_a, own) or {}).get("fingerprint") is not None, what="its report written")
    third = _report(plane_a, own)
    assert third is not None and third["tests"]["trtllm"]["reused_from"] == first["probe_time"], "busy: kept result"
    assert fiar_labels(plane_a, own) == EXPECTED_H200X2, "compared with the last readable probe, not the blind one"
    assert d.stop() == 0


def test_inconclusive_probe_on_a_node_without_a_verdict_writes_no_backend(
    plane_a: ControlPlane,
    unique: str,
    daemon: Callable[..., Any],
    host_file: Callable[..., Path],
    eventually_fn: Callable[..., Any],
) -> None:
    own = f"gpu-{unique}"
    plane_a.add_node(own, labels={contract.LABEL_BACKEND: "none"})  # stale, with no report behind it
    fixture = host_file("h200x2-host")
    _software(fixture, None)
    d = daemon(plane_a.kubeconfig, own, fixture, "--retry-interval", "1")
    untested = {k: v for k, v in EXPECTED_H200X2.items() if k != contract.LABEL_BACKEND}
    untested[contract.LABEL_TRTLLM] = "skipped"
    untested[contract.LABEL_FLASHINFER] = "0.6.13"  # the installed one: no test ran
    eventually_fn(lambda: fiar_labels(plane_a, own) == untested, what="labels without fiar.io/backend")
    doc = _report(plane_a, own)
    assert doc is not None and contract.LABEL_BACKEND not in doc["labels"]
    assert any(r.startswith("no verdict") for r in doc["reasons"])

    _software(fixture, "2.11.0")  # the software is back: the next retry, not the 6 h interval, finds it
    verdict = {**EXPECTED_H200X2, contract.LABEL_FLASHINFER: "0.6.13"}
    eventually_fn(lambda: fiar_labels(plane_a, own) == verdict, what="the verdict from a retry")
    assert d.metric("fiar_agent_reprobe_requests_total") == 0
    assert d.stop() == 0


def test_hostile_report_annotation_is_no_previous_report(
    plane_a: ControlPlane, unique: str, daemon: Callable[..., Any], eventually_fn: Callable[..., Any]
) -> None:
    own = f"gpu-{unique}"
    plane_a.add_node(own, annotations={contract.ANNOTATION_PROBE_REPORT: "[" * 60_000 + "]" * 60_000})
    d = daemon(plane_a.kubeconfig, own, Path("h200x2-host"))
    eventually_fn(lambda: fiar_labels(plane_a, own) == EXPECTED_H200X2, what="a verdict despite the annotation")
    assert d.proc.poll() is None
    assert "no previous report" in d.output() and "RecursionError" in d.output()
    assert _report(plane_a, own) is not None, "replaced by a real report"
    assert d.stop() == 0
