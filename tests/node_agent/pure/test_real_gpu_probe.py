"""The probe on the real GPUs of this host (skipped where NVML finds none).

On a host whose policy forbids multicast (the device hosts of this project export
``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1``) it also checks that
mnnvl never ran. With two or more GPUs, torch and FlashInfer, trtllm must pass eagerly and under
CUDA-graph replay with every numerics check done.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

import fiar_contract as contract
from node_agent import inventory, policy
from node_agent.errors import HardwareError
from node_agent.hardware import NvmlHardware
from node_agent.probe import ProbeConfig, probe

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def real_inventory() -> inventory.Inventory:
    try:
        return NvmlHardware().read_inventory(60.0)
    except HardwareError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")


def test_real_host_probe(real_inventory: inventory.Inventory) -> None:
    result = probe(NvmlHardware(), ProbeConfig(timeout_s=550.0, benchmark=False))
    labels, tests = result.labels, result.report["tests"]
    n = len(real_inventory.gpus)
    assert labels[contract.LABEL_GPUS] == str(n)
    assert result.report["inventory"]["errors"] == []

    if policy.forbidding_variables(os.environ):
        assert labels[contract.LABEL_MULTICAST] == "disabled"
        assert labels[contract.LABEL_MNNVL] == "skipped"
        assert tests["mnnvl"]["kind"] == "policy"
        assert "devices" not in tests["mnnvl"], "no mnnvl rank ran"

    if n == 1:
        assert labels[contract.LABEL_BACKEND] == "none"
        assert labels[contract.LABEL_TRTLLM] == "skipped"
        assert result.exit_code == 0
    elif importlib.util.find_spec("torch") and importlib.util.find_spec("flashinfer"):
        trtllm = tests["trtllm"]
        assert trtllm["result"] == "pass", trtllm
        assert trtllm["numerics"]["eager_checks"] == 3
        assert trtllm["numerics"]["graph_checks"] == 3
        assert trtllm["numerics"]["max_abs_err"] == 0.0
        assert "jit" in trtllm["steps"], "kernel build/load is timed apart from the test"
        assert trtllm["child_env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert labels[contract.LABEL_BACKEND] in ("trtllm", "mnnvl")
        assert result.exit_code == 0
