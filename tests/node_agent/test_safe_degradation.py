"""Broken or busy hosts degrade to labels with reasons; the probe itself never raises for them."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from node_agent import report
from node_agent.hardware import SimulatedHardware
from node_agent.probe import ProbeConfig, probe

B, M, MN, T, G = (
    contract.LABEL_BACKEND,
    contract.LABEL_MULTICAST,
    contract.LABEL_MNNVL,
    contract.LABEL_TRTLLM,
    contract.LABEL_GPUS,
)


def _sim(**settings: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc.setdefault("simulate", {}).update(settings)

    return edit


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"nvml": "missing"}, "inventory unavailable: nvml: NVML Shared Library Not Found"),
        ({"native_probe": "crash"}, "inventory unavailable: the NVML/CUDA probe crashed with SIGSEGV"),
        ({"native_probe": "hang"}, "inventory unavailable: the NVML/CUDA probe did not answer within 2s"),
    ],
)
def test_unreadable_gpus_give_a_degraded_verdict(
    host_file: Callable[..., Path], settings: dict[str, str], reason: str
) -> None:
    start = time.monotonic()
    result = probe(
        SimulatedHardware(host_file("h100x8-nvswitch-healthy", _sim(**settings))),
        ProbeConfig(inventory_timeout_s=2.0),
        environ={},
    )
    assert time.monotonic() - start < 20
    assert result.labels == {B: "none", M: "unknown", MN: "skipped", T: "skipped", G: "0"}
    assert result.exit_code == 1
    assert result.report["reasons"][0].startswith(reason)
    assert result.report["inventory"] == {"error": result.report["reasons"][0]}


def _busy(doc: dict[str, Any]) -> None:
    doc["gpus"][1]["compute_processes"] = 2


def test_busy_gpus_are_not_tested(host_file: Callable[..., Path], recorder: Callable[[Path], Any]) -> None:
    hw = recorder(host_file("h200x2-host", _busy))
    result = probe(hw, ProbeConfig(), environ={})
    assert hw.workers == []
    assert result.labels == {B: "none", M: "disabled", MN: "skipped", T: "skipped", G: "2"}
    assert result.report["tests"]["trtllm"]["kind"] == "busy"
    assert "GPU 1: 2" in result.report["tests"]["trtllm"]["reason"]
    assert result.exit_code == 1


def test_force_tests_busy_gpus(host_file: Callable[..., Path], recorder: Callable[[Path], Any]) -> None:
    hw = recorder(host_file("h200x2-host", _busy))
    result = probe(hw, ProbeConfig(force=True), environ={})
    assert hw.workers == ["trtllm"]
    assert result.labels[T] == "pass"
    assert result.exit_code == 0


def test_busy_gpus_keep_the_last_proven_result(host_file: Callable[..., Path]) -> None:
    idle = probe(SimulatedHardware(host_file("h200x2-host")), ProbeConfig(), environ={})
    previous = report.loads(report.dumps(idle.report))
    busy = probe(SimulatedHardware(host_file("h200x2-host", _busy)), ProbeConfig(), environ={}, previous=previous)
    assert busy.labels == idle.labels
    assert busy.report["tests"]["trtllm"]["reused_from"] == idle.report["probe_time"]
    assert busy.exit_code == 0


def test_results_of_another_driver_are_not_reused(host_file: Callable[..., Path]) -> None:
    idle = probe(SimulatedHardware(host_file("h200x2-host")), ProbeConfig(), environ={})

    def busy_new_driver(doc: dict[str, Any]) -> None:
        _busy(doc)
        doc["driver_version"] = "590.1"

    busy = probe(
        SimulatedHardware(host_file("h200x2-host", busy_new_driver)), ProbeConfig(), environ={}, previous=idle.report
    )
    assert busy.labels[T] == "skipped"


def _single(doc: dict[str, Any]) -> None:
    doc["gpus"] = doc["gpus"][:1]
    doc["cuda_attributes"] = doc["cuda_attributes"][:1]
    doc["p2p"] = {}
    doc["env"] = {}


def test_one_gpu_is_a_clean_verdict(host_file: Callable[..., Path], recorder: Callable[[Path], Any]) -> None:
    hw = recorder(host_file("h200x2-host", _single))
    result = probe(hw, ProbeConfig(), environ={})
    assert hw.workers == []
    assert result.labels == {B: "none", M: "unknown", MN: "skipped", T: "skipped", G: "1"}
    assert result.exit_code == 0, "one GPU is not a degraded node"
    assert any("1 GPU, no allreduce between GPUs" in r for r in result.report["reasons"])


def test_no_gpus_is_a_clean_verdict(host_file: Callable[..., Path]) -> None:
    def none(doc: dict[str, Any]) -> None:
        doc.update(gpus=[], cuda_attributes=[], p2p={}, env={})

    result = probe(SimulatedHardware(host_file("h200x2-host", none)), ProbeConfig(), environ={})
    assert result.labels == {B: "none", M: "unknown", MN: "skipped", T: "skipped", G: "0"}
    assert result.exit_code == 0


@pytest.mark.parametrize("missing", ["torch", "flashinfer"])
def test_missing_software_skips_the_tests(
    host_file: Callable[..., Path], recorder: Callable[[Path], Any], missing: str
) -> None:
    software = {"torch": "2.11.0", "flashinfer": "0.6.13", missing: None}
    hw = recorder(host_file("h100x8-nvswitch-healthy", _sim(software=software)))
    result = probe(hw, ProbeConfig(), environ={})
    assert hw.workers == []
    assert result.labels == {B: "none", M: "unknown", MN: "skipped", T: "skipped", G: "8"}
    assert f"{missing} not installed" in result.report["tests"]["trtllm"]["reason"]
    assert result.exit_code == 1


def test_three_gpus_test_the_largest_supported_world_size(host_file: Callable[..., Path]) -> None:
    def three(doc: dict[str, Any]) -> None:
        doc["gpus"] = doc["gpus"][:3]
        doc["cuda_attributes"] = doc["cuda_attributes"][:3]
        doc["p2p"] = {k: v for k, v in doc["p2p"].items() if all(int(i) < 3 for i in k.split("->"))}

    result = probe(SimulatedHardware(host_file("h100x8-nvswitch-healthy", three)), ProbeConfig(), environ={})
    assert result.report["tests"]["trtllm"]["devices"] == [0, 1]
    assert result.labels[G] == "3"
