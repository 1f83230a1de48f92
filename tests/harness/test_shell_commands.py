"""The shell entry points the README promises: ``up``/``status``/``down`` and the demo, end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]


def devcluster(workdir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools"), "FIAR_DEVCLUSTER_DIR": str(workdir)}
    return subprocess.run([sys.executable, "-m", "devcluster", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(workdir: Path) -> list[int]:
    import json

    state = json.loads((workdir / "state.json").read_text())
    return [int(c["pid"]) for c in state["components"].values()]


def test_up_status_and_down_from_the_shell(controlplane_binaries: Any, tmp_path: Path) -> None:
    up = devcluster(tmp_path, "up", "--tier", "A")
    assert up.returncode == 0, up.stderr
    assert f"export KUBECONFIG={tmp_path / 'kubeconfig'}" in up.stdout
    pids = _pids(tmp_path)
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    status = devcluster(tmp_path, "status")
    assert status.returncode == 0 and "kube-apiserver             ready" in status.stdout
    down = devcluster(tmp_path, "down")
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not any(_alive(p) for p in pids)
    assert devcluster(tmp_path, "status").returncode == 1


def test_demo_labels_every_fake_gpu_node_and_decides_every_vllm_pod(controlplane_binaries: Any, tmp_path: Path) -> None:
    demo = devcluster(tmp_path, "demo")
    pids: list[int] = []
    try:
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        rows = {line.split()[0]: line.split() for line in demo.stdout.splitlines()
                if line and line.split()[0] in {"h200x2-host", "h100x8-nvswitch-healthy", "h100x4-pcie-no-nvlink"}}
        # columns: NODE GPUS MULTICAST MNNVL TRTLLM VERDICT POD POD-BACKEND REASON
        assert rows["h200x2-host"][2:6] == ["disabled", "skipped", "pass", "trtllm"]
        assert rows["h200x2-host"][7:] == ["trtllm", "Verified"]
        assert rows["h100x8-nvswitch-healthy"][5] == "mnnvl" and rows["h100x8-nvswitch-healthy"][7] == "mnnvl"
        assert rows["h100x4-pcie-no-nvlink"][5] == "none" and rows["h100x4-pcie-no-nvlink"][7] == "auto"
        pids = _pids(tmp_path)
        assert len(pids) >= 5 + 2 + 1  # plane, at least two agents, the operator
    finally:
        down = devcluster(tmp_path, "down")
    assert down.returncode == 0
    assert not any(_alive(p) for p in pids)
