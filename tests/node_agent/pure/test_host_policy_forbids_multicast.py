"""A host that forbids multicast gets no multicast object: no mnnvl worker ever starts, trtllm runs with
multicast off, and the labels say ``multicast=disabled``, ``mnnvl=skipped``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from node_agent import policy
from node_agent.probe import ProbeConfig, probe


@pytest.mark.parametrize(
    ("env", "forbidden"),
    [
        ({}, False),
        ({"NCCL_NVLS_ENABLE": "0"}, True),
        ({"NCCL_NVLS_ENABLE": "false"}, True),
        ({"NCCL_NVLS_ENABLE": "1"}, False),
        ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}, True),
        ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "true"}, True),
        ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}, False),
        ({"NVSHMEM_DISABLE_NVLS": "1"}, True),
        ({"NVSHMEM_DISABLE_NVLS": "0"}, False),
        ({"UNRELATED": "1"}, False),
    ],
)
def test_policy_variables(env: dict[str, str], forbidden: bool) -> None:
    resolved = policy.resolve([("env", env)])
    assert resolved.multicast_forbidden is forbidden
    if forbidden:
        assert resolved.sources == tuple(f"env {k}={v}" for k, v in env.items())


def test_flag_forbids_and_children_get_all_three_variables() -> None:
    resolved = policy.resolve([("env", {})], forbid_flag=True)
    assert resolved.sources == ("--forbid-multicast",)
    assert resolved.child_env("trtllm") == dict(contract.HOST_POLICY_ENV)
    assert resolved.child_env("mnnvl") == dict(contract.HOST_POLICY_ENV)


def test_trtllm_always_runs_with_symmetric_memory_multicast_off() -> None:
    assert policy.HostPolicy(False).child_env("trtllm") == {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    assert policy.HostPolicy(False).child_env("mnnvl") == {}


@pytest.mark.parametrize(
    ("environ", "forbid_flag"),
    [
        ({"NCCL_NVLS_ENABLE": "0"}, False),
        ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}, False),
        ({"NVSHMEM_DISABLE_NVLS": "1"}, False),
        ({}, True),
    ],
)
def test_no_mnnvl_worker_starts_under_the_policy(
    recorder: Callable[[str], Any], environ: dict[str, str], forbid_flag: bool
) -> None:
    hw = recorder("h100x8-nvswitch-healthy")  # healthy hardware: mnnvl would pass if it ran
    result = probe(hw, ProbeConfig(forbid_multicast=forbid_flag), environ=environ)
    assert hw.workers == ["trtllm"], "only the trtllm smoke test was launched"
    assert result.labels[contract.LABEL_MULTICAST] == "disabled"
    assert result.labels[contract.LABEL_MNNVL] == "skipped"
    assert result.labels[contract.LABEL_TRTLLM] == "pass"
    assert result.labels[contract.LABEL_BACKEND] == "trtllm"
    assert result.report["tests"]["mnnvl"]["kind"] == "policy"
    assert "devices" not in result.report["tests"]["mnnvl"], "no rank ran for mnnvl"
    assert result.report["tests"]["trtllm"]["child_env"] == dict(contract.HOST_POLICY_ENV)
    assert result.exit_code == 0


def test_without_the_policy_mnnvl_runs_first(recorder: Callable[[str], Any]) -> None:
    hw = recorder("h100x8-nvswitch-healthy")
    result = probe(hw, ProbeConfig(), environ={})
    assert hw.workers == ["mnnvl", "trtllm"]
    assert result.report["tests"]["trtllm"]["child_env"] == {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@pytest.mark.parametrize("module", ["node_agent.smoke.worker", "node_agent.smoke.simworker"])
def test_a_rank_refuses_mnnvl_under_the_policy_before_importing_anything(module: str, tmp_path: Path) -> None:
    events = tmp_path / "rank-0.jsonl"
    env = {
        **os.environ,
        "NVSHMEM_DISABLE_NVLS": "1",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "FIAR_EVENTS_FILE": str(events),
    }
    fixture = str(Path(__file__).parents[3] / "node_agent" / "fixtures" / "h100x8-nvswitch-healthy.json")
    argv = [sys.executable, "-m", module, "--backend", "mnnvl", "--fixture", fixture]
    if module.endswith(".worker"):
        argv = argv[:-2]
    code = (
        f"import runpy, sys; sys.argv = {argv[2:]!r}; "
        "rc = 0\n"
        f"try:\n    runpy.run_module({module!r}, run_name='__main__')\n"
        "except SystemExit as e:\n    rc = e.code\n"
        "assert 'torch' not in sys.modules and 'flashinfer' not in sys.modules\n"
        "sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, proc.stderr
    [event] = [json.loads(line) for line in events.read_text().splitlines()]
    assert event["status"] == "refused"
    assert "NVSHMEM_DISABLE_NVLS=1" in event["error"]
