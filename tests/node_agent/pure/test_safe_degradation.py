"""Broken or busy hosts degrade to labels with reasons; the probe itself never raises for them.

A degraded probe that tested nothing conclusively never claims ``fiar.io/backend=none``: it keeps
the verdict of an earlier report of the same hardware, or leaves the backend label out."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from node_agent import inventory, report
from node_agent.hardware import SimulatedHardware
from node_agent.probe import ProbeConfig, arch_mismatch, probe

B, M, U, MN, T, G, CC, F = (
    contract.LABEL_BACKEND,
    contract.LABEL_MULTICAST,
    contract.LABEL_MULTICAST_USABLE,
    contract.LABEL_MNNVL,
    contract.LABEL_TRTLLM,
    contract.LABEL_GPUS,
    contract.LABEL_COMPUTE_CAPABILITY,
    contract.LABEL_FLASHINFER,
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
    assert result.labels == {M: "unknown", U: "unknown", MN: "skipped", T: "skipped", G: "0", F: "0.6.13"}, (
        "no backend label: not probed"
    )
    assert result.exit_code == 1
    assert result.report["reasons"][0].startswith(reason)
    assert result.report["inventory"] == {"error": result.report["reasons"][0]}


def _busy(doc: dict[str, Any]) -> None:
    doc["gpus"][1]["compute_processes"] = 2


def test_busy_gpus_are_not_tested(host_file: Callable[..., Path], recorder: Callable[[Path], Any]) -> None:
    hw = recorder(host_file("h200x2-host", _busy))
    result = probe(hw, ProbeConfig(), environ={})
    assert hw.workers == []
    assert result.labels == {M: "disabled", U: "forbidden", MN: "skipped", T: "skipped", G: "2", CC: "9.0"}, (
        "busy is not a verified none"
    )
    assert any(
        r.startswith("no verdict: no backend passed and trtllm could not be tested") for r in result.report["reasons"]
    )
    assert result.report["tests"]["trtllm"]["kind"] == "busy"
    assert "GPU 1: 2" in result.report["tests"]["trtllm"]["reason"]
    assert result.exit_code == 1


def test_a_stopping_agent_starts_no_smoke_test(host_file: Callable[..., Path], recorder: Callable[[Path], Any]) -> None:
    stopping = threading.Event()
    stopping.set()
    hw = recorder(host_file("h200x2-host"))
    result = probe(hw, ProbeConfig(), environ={}, cancel=stopping)
    assert hw.workers == [], "no rank was started after SIGTERM"
    assert result.report["tests"]["trtllm"]["kind"] == "cancelled"
    assert B not in result.labels, "a cancelled probe is no verdict"


def test_force_tests_busy_gpus(host_file: Callable[..., Path], recorder: Callable[[Path], Any]) -> None:
    hw = recorder(host_file("h200x2-host", _busy))
    result = probe(hw, ProbeConfig(force=True), environ={})
    assert hw.workers == ["trtllm"]
    assert result.labels[T] == "pass"
    assert result.exit_code == 0


def test_busy_gpus_keep_the_last_proven_result(host_file: Callable[..., Path]) -> None:
    idle = probe(SimulatedHardware(host_file("h200x2-host")), ProbeConfig(), environ={})
    previous, _ = report.PreviousReport.parse(report.dumps(idle.report))
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
        SimulatedHardware(host_file("h200x2-host", busy_new_driver)),
        ProbeConfig(),
        environ={},
        previous=idle.as_previous(),
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
    assert result.labels == {B: "none", M: "unknown", U: "unknown", MN: "skipped", T: "skipped", G: "1", CC: "9.0"}
    assert result.exit_code == 0, "one GPU is not a degraded node"
    assert any("1 GPU, no allreduce between GPUs" in r for r in result.report["reasons"])


def test_no_gpus_is_a_clean_verdict(host_file: Callable[..., Path]) -> None:
    def none(doc: dict[str, Any]) -> None:
        doc.update(gpus=[], cuda_attributes=[], p2p={}, env={})

    result = probe(SimulatedHardware(host_file("h200x2-host", none)), ProbeConfig(), environ={})
    assert result.labels == {B: "none", M: "unknown", U: "unknown", MN: "skipped", T: "skipped", G: "0"}
    assert result.exit_code == 0


@pytest.mark.parametrize("missing", ["torch", "flashinfer"])
def test_missing_software_skips_the_tests(
    host_file: Callable[..., Path], recorder: Callable[[Path], Any], missing: str
) -> None:
    software = {"torch": "2.11.0", "flashinfer": "0.6.13", missing: None}
    hw = recorder(host_file("h100x8-nvswitch-healthy", _sim(software=software)))
    result = probe(hw, ProbeConfig(), environ={})
    assert hw.workers == []
    installed = {F: "0.6.13"} if missing != "flashinfer" else {}
    assert result.labels == {M: "unknown", U: "unknown", MN: "skipped", T: "skipped", G: "8", CC: "9.0", **installed}
    assert f"{missing} not installed" in result.report["tests"]["trtllm"]["reason"]
    assert result.exit_code == 1


def _no_torch(doc: dict[str, Any]) -> None:
    doc.setdefault("simulate", {})["software"] = {"torch": None, "flashinfer": "0.6.13"}


def test_inconclusive_probe_keeps_the_verdict_of_the_same_hardware(host_file: Callable[..., Path]) -> None:
    hour = iter([1_800_000_000.0, 1_800_003_600.0, 1_800_007_200.0]).__next__  # three probes an hour apart
    idle = probe(SimulatedHardware(host_file("h200x2-host")), ProbeConfig(), environ={}, clock=hour)
    previous, _ = report.PreviousReport.parse(report.dumps(idle.report))
    broken = probe(
        SimulatedHardware(host_file("h200x2-host", _no_torch)), ProbeConfig(), environ={}, previous=previous, clock=hour
    )
    assert broken.labels == idle.labels
    assert broken.report["labels"] == idle.labels
    assert broken.report["tests"]["trtllm"]["kind"] == "unavailable", "the report shows what happened this time"
    assert broken.report["labels_kept_from"] == idle.report["probe_time"]
    assert broken.report["status"] == "degraded" and broken.exit_code == 1
    # kept again by the next inconclusive probe (GPUs busy, nothing reusable in the report before)
    again = probe(
        SimulatedHardware(host_file("h200x2-host", _busy)),
        ProbeConfig(),
        environ={},
        previous=broken.as_previous(),
        clock=hour,
    )
    assert again.labels == idle.labels
    assert again.report["labels_kept_from"] == idle.report["probe_time"]


def _new_driver(doc: dict[str, Any]) -> None:
    _no_torch(doc)
    doc["driver_version"] = "590.1"


def _policy_lifted(doc: dict[str, Any]) -> None:
    _no_torch(doc)
    doc["env"] = {}


@pytest.mark.parametrize("change", [_new_driver, _policy_lifted])
def test_inconclusive_probe_of_changed_hardware_or_policy_writes_no_backend(
    host_file: Callable[..., Path], change: Callable[[dict[str, Any]], None]
) -> None:
    idle = probe(SimulatedHardware(host_file("h200x2-host")), ProbeConfig(), environ={})
    changed = probe(
        SimulatedHardware(host_file("h200x2-host", change)),
        ProbeConfig(),
        environ={},
        previous=idle.as_previous(),
    )
    assert B not in changed.labels
    assert "labels_kept_from" not in changed.report


def test_unreadable_gpus_keep_the_verdict_until_they_read_again(host_file: Callable[..., Path]) -> None:
    """NVML failing for a while (a driver mid-upgrade, a hiccup) must not strip a serving node's
    verdict: nothing says the hardware changed. The next readable probe decides afresh."""
    idle = probe(SimulatedHardware(host_file("h200x2-host")), ProbeConfig(), environ={})
    blind = probe(
        SimulatedHardware(host_file("h200x2-host", _sim(nvml="missing"))),
        ProbeConfig(),
        environ={},
        previous=idle.as_previous(),
    )
    assert blind.labels == idle.labels, "backend, tests and GPU count of the last readable probe"
    assert blind.report["labels_kept_from"] == idle.report["probe_time"] and blind.exit_code == 1

    def blind_and_lifted(doc: dict[str, Any]) -> None:
        _sim(nvml="missing")(doc)
        doc["env"] = {}

    other_policy = probe(
        SimulatedHardware(host_file("h200x2-host", blind_and_lifted)),
        ProbeConfig(),
        environ={},
        previous=idle.as_previous(),
    )
    assert B not in other_policy.labels, "a changed host policy is a different verdict"


def test_conclusive_failure_replaces_a_kept_verdict(host_file: Callable[..., Path]) -> None:
    idle = probe(SimulatedHardware(host_file("h200x2-host")), ProbeConfig(), environ={})

    def failing(doc: dict[str, Any]) -> None:
        doc["simulate"] = {"smoke": {"trtllm": {"outcome": "fail"}}}

    failed = probe(
        SimulatedHardware(host_file("h200x2-host", failing)),
        ProbeConfig(),
        environ={},
        previous=idle.as_previous(),
    )
    assert failed.labels[B] == "none"
    assert failed.labels[T] == "fail"
    assert failed.exit_code == 0


@pytest.mark.parametrize(
    ("arch_list", "tested"),
    [
        ("10.0a", False),  # the image built for Blackwell only; the host is SM 9.0
        ("8.0 12.0f", False),
        ("9.0a 10.0a", True),
        ("9.0", True),
        (None, True),  # no list: FlashInfer targets the visible GPUs
    ],
)
def test_require_prebuilt_skips_gpus_the_arch_list_does_not_cover(
    host_file: Callable[..., Path], recorder: Callable[[Path], Any], arch_list: str | None, tested: bool
) -> None:
    hw = recorder(host_file("h200x2-host"))
    environ = {} if arch_list is None else {"FLASHINFER_CUDA_ARCH_LIST": arch_list}
    result = probe(hw, ProbeConfig(require_prebuilt=True), environ=environ)
    trtllm = result.report["tests"]["trtllm"]
    if tested:
        assert hw.workers == ["trtllm"]
        assert result.labels[T] == "pass"
        return
    assert hw.workers == [], "no rank started for kernels that do not exist"
    assert (trtllm["result"], trtllm["kind"], trtllm["degraded"]) == ("skipped", "not_prebuilt", True)
    assert "GPU 0 is SM 9.0" in trtllm["reason"] and arch_list in trtllm["reason"]
    assert B not in result.labels
    assert result.exit_code == 1


def test_without_require_prebuilt_the_arch_list_is_not_checked(
    host_file: Callable[..., Path], recorder: Callable[[Path], Any]
) -> None:
    hw = recorder(host_file("h200x2-host"))
    probe(hw, ProbeConfig(), environ={"FLASHINFER_CUDA_ARCH_LIST": "10.0a"})
    assert hw.workers == ["trtllm"]


@pytest.mark.parametrize(
    ("cc", "arch_list", "covered"),
    [
        ((9, 0), "9.0a", True),
        ((9, 0), "9.0a 10.0a", True),
        ((10, 3), "10.0a", False),  # architecture-specific code runs on exactly that SM
        ((10, 3), "10.0f", True),  # family code runs on later minors of the family
        ((8, 6), "8.0", True),
        ((8, 0), "8.6", False),
        ((12, 0), "9.0a 10.0a", False),
        ((9, 0), "9.0+PTX sm_90", True),  # unreadable entries: no judgement
        ((9, 0), "", True),
    ],
)
def test_arch_list_coverage(cc: tuple[int, int], arch_list: str, covered: bool) -> None:
    gpu = inventory.Gpu(index=0, name="GPU", uuid="GPU-0", cc=cc)
    assert (arch_mismatch([gpu], arch_list) is None) is covered


def test_three_gpus_test_the_largest_supported_world_size(host_file: Callable[..., Path]) -> None:
    def three(doc: dict[str, Any]) -> None:
        doc["gpus"] = doc["gpus"][:3]
        doc["cuda_attributes"] = doc["cuda_attributes"][:3]
        doc["p2p"] = {k: v for k, v in doc["p2p"].items() if all(int(i) < 3 for i in k.split("->"))}

    result = probe(SimulatedHardware(host_file("h100x8-nvswitch-healthy", three)), ProbeConfig(), environ={})
    assert result.report["tests"]["trtllm"]["devices"] == [0, 1]
    assert result.labels[G] == "3"


def _ampere(doc: dict[str, Any]) -> None:
    for gpu in doc["gpus"]:
        gpu["cc"] = [8, 0]
        gpu["name"] = "NVIDIA A100-SXM4-80GB"


def test_gpus_without_flashinfer_comm_kernels_get_a_conclusive_none_and_no_test_runs(
    host_file: Callable[..., Path],
) -> None:
    result = probe(SimulatedHardware(host_file("h100x8-nvswitch-healthy", _ampere)), ProbeConfig(), environ={})
    assert result.labels[B] == "none" and result.labels[MN] == "skipped" and result.labels[T] == "skipped"
    assert result.exit_code == 0, "a GPU generation FlashInfer does not build for is a finding, not a failure"
    assert any(
        "SM 8.0: FlashInfer builds its allreduce-fusion kernels for SM 9.x and 10.x only" in r
        for r in result.report["reasons"]
    )
