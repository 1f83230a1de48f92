"""Every shipped host fixture, probed end to end through the simulated hardware, gets exactly its labels.

The probe runs the real code path: the inventory comes from a child process (``native_probe
--replay``), each smoke test is a supervisor with one simworker process per rank, and the verdict
and report are the ones the daemon publishes. The environment is empty, so only the recorded
host's own policy variables count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fiar_contract as contract
from node_agent import hardware, report
from node_agent.probe import ProbeConfig, probe

B, M, U, W, MN, T, G, C, CC, F = (
    contract.LABEL_BACKEND,
    contract.LABEL_MULTICAST,
    contract.LABEL_MULTICAST_USABLE,
    contract.LABEL_MNNVL_WORKSPACE,
    contract.LABEL_MNNVL,
    contract.LABEL_TRTLLM,
    contract.LABEL_GPUS,
    contract.LABEL_CLIQUE,
    contract.LABEL_COMPUTE_CAPABILITY,
    contract.LABEL_FLASHINFER,
)
FI = "0.6.13"  # the FlashInfer the modelled and device fixtures record

EXPECTED = {
    # recorded: 2x H200 SXM, NVSwitch, multicast forbidden by the host's environment
    "h200x2-host": {B: "trtllm", M: "disabled", U: "forbidden", MN: "skipped", T: "pass", G: "2", CC: "9.0"},
    # modelled: healthy HGX H100, mnnvl works
    "h100x8-nvswitch-healthy": {
        B: "mnnvl",
        M: "supported",
        U: "verified",
        W: "created",
        MN: "pass",
        T: "pass",
        G: "8",
        CC: "9.0",
        F: FI,
    },
    # modelled after vllm#48071: workspace with a null multicast pointer; trtllm works but is ~10x NCCL
    "h200nvl-bridge-null-multicast": {
        B: "none",
        M: "unsupported",
        U: "broken",
        W: "failed-on-every-rank",
        MN: "fail",
        T: "pass",
        G: "8",
        CC: "9.0",
        F: FI,
    },
    # modelled: PCIe only, attribute 0, no peer access
    "h100x4-pcie-no-nvlink": {
        B: "none",
        M: "unsupported",
        U: "absent",
        W: "no-multicast",
        MN: "fail",
        T: "fail",
        G: "4",
        CC: "9.0",
        F: FI,
    },
    # modelled after NVIDIA/nccl#1788: NVSwitch host whose fabric manager is down; attribute 1, bind fails
    "h100x8-nvswitch-fabric-manager-down": {
        B: "trtllm",
        M: "unknown",
        U: "broken",
        W: "failed-on-every-rank",
        MN: "fail",
        T: "pass",
        G: "8",
        CC: "9.0",
        F: FI,
    },
    # modelled: GB200 NVL72 tray in a fabric clique
    "gb200-nvl72-clique": {
        B: "mnnvl",
        M: "supported",
        U: "verified",
        W: "created",
        MN: "pass",
        T: "pass",
        G: "4",
        C: "6f1c2b8e-4d3a-4f0e-9b7c-5a1d2e3f4a5b.32766",
        CC: "10.0",
        F: FI,
    },
}

RECORDED_DEVICE_HOSTS = {
    # recorded by bench/agent_gpu_verify.sh on the device hosts (see BENCHMARKS.md)
    "h200x2-device": {B: "trtllm", M: "disabled", U: "forbidden", MN: "skipped", T: "pass", G: "2", CC: "9.0", F: FI},
    "h200x1-device": {
        B: "none",
        M: "disabled",
        U: "forbidden",
        W: "no-multicast",
        MN: "skipped",
        T: "skipped",
        G: "1",
        CC: "9.0",
        F: FI,
    },
}


def _all_expected() -> dict[str, dict[str, str]]:
    found = {
        name: labels for name, labels in RECORDED_DEVICE_HOSTS.items() if (hardware.FIXTURES / f"{name}.json").exists()
    }
    return {**EXPECTED, **found}


def test_every_shipped_fixture_has_expected_labels() -> None:
    shipped = {p.stem for p in hardware.FIXTURES.glob("*.json")}
    assert shipped == set(_all_expected())


@pytest.mark.parametrize(("name", "labels"), sorted(_all_expected().items()))
def test_fixture_gets_exactly_its_labels(name: str, labels: dict[str, str]) -> None:
    result = probe(hardware.SimulatedHardware(Path(name)), ProbeConfig(timeout_s=60), environ={})
    assert result.labels == labels
    assert result.report["labels"] == labels
    assert result.exit_code == 0, result.report["reasons"]
    assert set(result.labels) <= set(contract.AGENT_LABELS)
    assert result.labels[B] in contract.BACKEND_VERDICTS
    assert result.labels[M] in contract.MULTICAST_STATES
    assert result.labels[U] in contract.MULTICAST_USABLE_STATES
    assert result.labels.get(W, "created") in contract.MNNVL_WORKSPACE_STATES
    assert {result.labels[MN], result.labels[T]} <= set(contract.TEST_RESULTS)
    # the annotation round-trips and carries the same labels
    parsed = report.loads(report.dumps(result.report))
    assert parsed is not None and parsed["labels"] == labels


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_modelled_fixtures_cite_their_source(name: str) -> None:
    doc = json.loads((hardware.FIXTURES / f"{name}.json").read_text())
    if name == "h200x2-host":
        assert not doc.get("modelled")
        return
    assert doc["modelled"] is True
    assert "#" in doc["models"] or "github" in doc["models"], "a modelled host cites the report it models"


def test_null_multicast_pointer_fails_mnnvl_before_any_kernel() -> None:
    result = probe(hardware.SimulatedHardware(Path("h200nvl-bridge-null-multicast")), ProbeConfig(), environ={})
    mnnvl = result.report["tests"]["mnnvl"]
    assert mnnvl["kind"] == "null_mc_ptr"
    assert "eager" not in mnnvl.get("steps", {}), "no allreduce kernel ran after the null pointer"
    assert any("not recommended" in r for r in result.report["reasons"]), "trtllm ~10x slower than NCCL is passed over"
    assert result.report["benchmark"]["trtllm"]["recommended"] is False


def test_recorded_h200_host_reports_hardware_multicast_but_policy_disables_it() -> None:
    result = probe(hardware.SimulatedHardware(Path("h200x2-host")), ProbeConfig(), environ={})
    inv = result.report["inventory"]
    assert inv["multicast_attribute"] == [1, 1]
    assert inv["nvswitch"] is True
    assert inv["fabric"]["cluster_uuid_zero"] is True
    assert result.report["policy"]["multicast_forbidden"] is True
    assert result.report["tests"]["mnnvl"]["kind"] == "policy"


def test_a_fabric_manager_fault_reads_broken_although_the_device_attribute_says_supported() -> None:
    result = probe(hardware.SimulatedHardware(Path("h100x8-nvswitch-fabric-manager-down")), ProbeConfig(), environ={})
    assert result.labels[U] == "broken"
    assert result.labels[B] == "trtllm", "trtllm never needs multicast and still passes"
    doc = json.loads((hardware.FIXTURES / "h100x8-nvswitch-fabric-manager-down.json").read_text())
    assert all(a["MULTICAST_SUPPORTED"] == 1 for a in doc["cuda_attributes"])
    assert any("fabric" in r and "not complete" in r for r in result.report["reasons"])
    mnnvl = result.report["tests"]["mnnvl"]
    assert (mnnvl["failed_step"], mnnvl["failed_on_every_rank"]) == ("workspace", True)
