"""The shared-GPU smoke test (test hosts only): two trtllm ranks on one GPU prove the kernels right and
can never label a node.

The probe plans duplicate devices, the launcher makes each GPU visible once, the ranks run the real
supervisor and launcher (simulated ranks), and the verdict carries no label and says why first. The
daemon refuses the mode at start, and ``fiar-agent run`` has no such option."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node_agent import cli, report
from node_agent.daemon import DaemonConfig
from node_agent.errors import ConfigError
from node_agent.hardware import SimulatedHardware
from node_agent.probe import ProbeConfig, probe
from node_agent.smoke.outcome import SHARED_GPU_MARK, SmokeRequest
from node_agent.verdict import correctness_only, decide

FORBIDDING = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _single(doc: dict[str, Any]) -> None:
    doc["gpus"] = doc["gpus"][:1]
    doc["cuda_attributes"] = doc["cuda_attributes"][:1]
    doc["p2p"] = {}


def test_a_shared_gpu_probe_runs_two_trtllm_ranks_on_one_gpu_and_writes_no_label(
    host_file: Callable[..., Path], recorder: Callable[[Path], Any]
) -> None:
    hw = recorder(host_file("h200x2-host", _single))
    result = probe(hw, ProbeConfig(shared_gpu=True), environ=FORBIDDING)
    trtllm = result.tests["trtllm"]
    assert hw.workers == ["trtllm"], "mnnvl needs multicast: never on a shared GPU"
    assert trtllm.result == "pass" and trtllm.devices == (0, 0)
    assert not trtllm.measured.latency_us and not trtllm.measured.bench, "ranks sharing a GPU time nothing"
    assert result.labels == {}, "a shared-GPU verdict labels no node"
    assert result.verdict.shared_gpu and result.verdict.backend is None
    assert result.verdict.reasons[0].startswith(SHARED_GPU_MARK)
    assert result.report["shared_gpu"] == SHARED_GPU_MARK and result.report["labels"] == {}
    assert result.report["tests"]["trtllm"]["ranks"] == 2


def test_shared_gpu_mnnvl_is_not_tested_even_where_multicast_is_allowed(
    host_file: Callable[..., Path], recorder: Callable[[Path], Any]
) -> None:
    hw = recorder(host_file("h100x8-nvswitch-healthy"))
    result = probe(hw, ProbeConfig(shared_gpu=True), environ={})
    assert hw.workers == ["trtllm"]
    assert result.tests["mnnvl"].result == "skipped" and SHARED_GPU_MARK in result.tests["mnnvl"].reason
    assert result.tests["trtllm"].devices == (0, 0)
    assert result.labels == {}


def test_a_shared_request_keeps_its_ranks_and_shows_each_gpu_once() -> None:
    request = SmokeRequest(backend="trtllm", devices=(0, 0), timeout_s=60, benchmark=False, shared_gpu=True)
    assert request.ranks == 2
    assert request.visible_devices == (0,)
    assert "--shared-gpu" in request.worker_args() and "--benchmark" not in request.worker_args()
    plain = SmokeRequest(backend="trtllm", devices=(0, 1), timeout_s=60)
    assert plain.visible_devices == (0, 1) and "--shared-gpu" not in plain.worker_args()


def test_every_verdict_made_correctness_only_loses_all_its_labels(host_file: Callable[..., Path]) -> None:
    for name in ("h200x2-host", "h100x8-nvswitch-healthy", "h200nvl-bridge-null-multicast"):
        real = probe(SimulatedHardware(host_file(name)), ProbeConfig(), environ={})
        assert real.labels, name
        shared = correctness_only(decide(real.inventory, real.policy, real.tests))
        assert shared.labels == {} and shared.backend is None and not shared.bench, name
        assert shared.reasons[0].startswith(SHARED_GPU_MARK)
        doc = report.build(
            hardware="h", started_at=0.0, duration_s=0.0, inv=real.inventory, inventory_error=None,
            policy=real.policy, tests=real.tests, verdict=shared, software={}, config={},
        )  # fmt: skip
        assert doc["labels"] == {} and doc["shared_gpu"] == SHARED_GPU_MARK


def test_the_daemon_refuses_a_shared_gpu_probe() -> None:
    with pytest.raises(ConfigError, match="labels no node"):
        DaemonConfig(node_name="gpu-0", kubeconfig=None, probe=ProbeConfig(shared_gpu=True)).validate()


def test_fiar_agent_run_has_no_shared_gpu_option() -> None:
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--node-name", "n", "--shared-gpu"])
    args = parser.parse_args(["probe", "--shared-gpu"])
    assert cli.probe_config(args).shared_gpu
    run_args = parser.parse_args(["run", "--node-name", "n"])
    assert not cli.probe_config(run_args).shared_gpu


def test_shared_gpu_runs_two_ranks_only() -> None:
    with pytest.raises(ConfigError, match="--shared-gpu"):
        ProbeConfig(shared_gpu=True, gpus=4).validate()
    ProbeConfig(shared_gpu=True, gpus=2).validate()


def test_the_real_worker_refuses_shared_gpu_for_a_multicast_backend(capsys: pytest.CaptureFixture[str]) -> None:
    from node_agent.smoke import worker

    with pytest.raises(SystemExit):
        worker.parse_args(["--backend", "mnnvl", "--shared-gpu"])
    assert "needs multicast" in capsys.readouterr().err
    assert worker.parse_args(["--backend", "trtllm", "--shared-gpu"]).shared_gpu
    assert not worker.parse_args(["--backend", "trtllm"]).shared_gpu
