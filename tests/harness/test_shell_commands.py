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
    return subprocess.run(
        [sys.executable, "-m", "devcluster", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _alive(pid: int) -> bool:
    """Running (an exited process waiting to be reaped by its new parent counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


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
    unknown = devcluster(tmp_path, "stop", "fiar-operatr")
    assert unknown.returncode == 1 and "no component 'fiar-operatr'" in unknown.stderr
    assert "kube-apiserver" in unknown.stderr
    down = devcluster(tmp_path, "down")
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not any(_alive(p) for p in pids)
    assert devcluster(tmp_path, "status").returncode == 1


def test_demo_labels_every_fake_gpu_node_and_decides_every_vllm_pod(controlplane_binaries: Any, tmp_path: Path) -> None:
    demo = devcluster(tmp_path, "demo")
    pids: list[int] = []
    try:
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        shown_nodes = {
            "h200x2-host",
            "h100x8-nvswitch-healthy",
            "h100x4-pcie-no-nvlink",
            "h200nvl-bridge-null-multicast",
            "h100x8-nvswitch-fabric-manager-down",
        }
        rows = {
            line.split()[0]: line.split()
            for line in demo.stdout.splitlines()
            if line and line.split()[0] in shown_nodes
        }
        # columns: NODE GPUS MULTICAST MNNVL TRTLLM VERDICT POD POD-BACKEND FUSION GUARD REASON
        assert rows["h200x2-host"][2:6] == ["forbidden", "skipped", "pass", "trtllm"]
        assert rows["h200x2-host"][7:] == ["trtllm", "on", "on", "Verified"]
        assert rows["h100x8-nvswitch-healthy"][2] == "verified" and rows["h100x8-nvswitch-healthy"][5] == "mnnvl"
        assert rows["h100x8-nvswitch-healthy"][7:10] == ["mnnvl", "on", "off"]
        assert rows["h100x4-pcie-no-nvlink"][5] == "none" and rows["h100x4-pcie-no-nvlink"][7:10] == [
            "auto",
            "off",
            "on",
        ]
        # the NVL-bridge board: trtllm passed but is slower than NCCL -> fusion off, trtllm (never auto)
        assert rows["h200nvl-bridge-null-multicast"][5] == "none"
        assert rows["h200nvl-bridge-null-multicast"][7:] == ["trtllm", "off", "on", "NotVerified"]
        # the fabric manager is down: trtllm verified and its fusion on, NCCL's NVLS and the rest guarded off
        assert rows["h100x8-nvswitch-fabric-manager-down"][2] == "broken"
        assert rows["h100x8-nvswitch-fabric-manager-down"][5] == "trtllm"
        assert rows["h100x8-nvswitch-fabric-manager-down"][7:] == ["trtllm", "on", "on", "Verified"]
        # the GB200 tray's node is a Grace (arm64) node, the x86 hosts' amd64
        assert "node gb200-nvl72-clique (arm64): agent started" in demo.stdout
        assert "node h200x2-host (amd64): agent started" in demo.stdout
        # the kubectl fiar command printed next to the table shows the same fleet
        printed = next(line for line in demo.stdout.splitlines() if " fiar status --kubeconfig " in line)
        shown = subprocess.run(printed.strip(), shell=True, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("8 GPU nodes: mnnvl 2, trtllm 3, none 3\n"), shown.stdout[:500]
        pids = _pids(tmp_path)
        assert len(pids) >= 5 + 2 + 1  # plane, at least two agents, the operator
        for name in ("fiar-operator", "agent-h200x2-host"):
            _stop_and_start_again(tmp_path, name)
        pids = _pids(tmp_path)
    finally:
        down = devcluster(tmp_path, "down")
    assert down.returncode == 0
    assert not any(_alive(p) for p in pids)


def _component_pid(workdir: Path, name: str) -> int | None:
    import json

    pid = json.loads((workdir / "state.json").read_text())["components"][name]["pid"]
    return None if pid is None else int(pid)


def _stop_and_start_again(workdir: Path, name: str) -> None:
    """The README's way to stop one demo component (to watch fail-open behaviour) and start it again."""
    before = _component_pid(workdir, name)
    assert before is not None and _alive(before)
    stop = devcluster(workdir, "stop", name)
    assert stop.returncode == 0 and f"{name} stopped" in stop.stdout, stop.stderr
    assert not _alive(before) and _component_pid(workdir, name) is None
    status = devcluster(workdir, "status")
    assert status.returncode == 1 and any(line.split() == [name, "stopped"] for line in status.stdout.splitlines())
    start = devcluster(workdir, "start", name)
    assert start.returncode == 0 and f"{name} started" in start.stdout, start.stderr
    after = _component_pid(workdir, name)
    assert after is not None and after != before and _alive(after)
    assert devcluster(workdir, "status").returncode == 0


def test_up_refuses_to_wipe_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    proc = devcluster(tmp_path, "up", "--tier", "A")
    assert proc.returncode == 1
    assert "not made by devcluster" in proc.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_down_never_kills_a_process_that_reused_a_recorded_pid(tmp_path: Path) -> None:
    import json

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        state = {
            "tier": "A",
            "server": "https://127.0.0.1:1",
            "kubeconfig": str(tmp_path / "kubeconfig"),
            "components": {
                "kube-apiserver": {
                    "pid": bystander.pid,
                    "argv": ["/opt/kube-apiserver"],
                    "log": str(tmp_path / "log"),
                    "health": "https://127.0.0.1:1/",
                }
            },
        }
        (tmp_path / "state.json").write_text(json.dumps(state))
        assert devcluster(tmp_path, "down").returncode == 0
        assert bystander.poll() is None, "down killed a process it had not started"
    finally:
        bystander.kill()
        bystander.wait()
