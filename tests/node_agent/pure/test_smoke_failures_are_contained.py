"""A hung, crashed or failing smoke test becomes a result with a reason; its whole process group dies."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from node_agent import childproc
from node_agent.hardware import SimulatedHardware
from node_agent.probe import ProbeConfig, probe
from node_agent.smoke import launcher
from node_agent.smoke.events import read_events
from node_agent.smoke.outcome import SmokeRequest
from node_agent.smoke.rules import classify, failure_kind


def _with_trtllm(outcome: str, **extra: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc.setdefault("simulate", {}).setdefault("smoke", {})["trtllm"] = {"outcome": outcome, **extra}

    return edit


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _run_trtllm(fixture: Path, timeout_s: float, tmp_path: Path, cancel: threading.Event | None = None) -> Any:
    hw = SimulatedHardware(fixture)
    request = SmokeRequest("trtllm", (0, 1), timeout_s)
    lines: list[str] = []
    outcome = launcher.run_smoke(
        request, hw.smoke_worker("trtllm"), {}, cancel=cancel, progress=lines.append, peer_grace_s=1.0
    )
    return outcome, lines


def test_a_hung_rank_times_out_and_the_whole_group_is_killed(
    host_file: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixture = host_file("h200x2-host", _with_trtllm("timeout", step="graph"))
    pids: list[int] = []
    real_read = launcher.ev.read_events

    def spy(path: Path) -> list[dict[str, Any]]:  # collect the ranks' pids from their own events
        events = real_read(path)
        pids.extend(e["pid"] for e in events if "pid" in e)
        return events

    monkeypatch.setattr(launcher.ev, "read_events", spy)
    start = time.monotonic()
    outcome, _ = _run_trtllm(fixture, 3.0, tmp_path)
    assert time.monotonic() - start < 15
    assert outcome.result == "timeout"
    assert outcome.degraded
    assert "rank 0 in graph" in outcome.reason and "rank 1 in graph" in outcome.reason
    assert "process group was killed" in outcome.reason
    assert set(pids) and len(set(pids)) == 2
    for pid in set(pids):
        assert not _alive(pid), f"rank pid {pid} survived the timeout"


def test_a_crashed_rank_is_a_failure_with_its_signal(host_file: Callable[..., Path], tmp_path: Path) -> None:
    outcome, _ = _run_trtllm(host_file("h200x2-host", _with_trtllm("crash", step="workspace")), 30.0, tmp_path)
    assert outcome.result == "fail"
    assert outcome.kind == "crash"
    assert "rank 1 died with SIGSEGV during workspace" in outcome.reason
    assert not outcome.degraded


def test_cancel_ends_a_running_test_quickly(host_file: Callable[..., Path], tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    start = time.monotonic()
    outcome, _ = _run_trtllm(host_file("h200x2-host", _with_trtllm("timeout")), 60.0, tmp_path, cancel)
    assert time.monotonic() - start < 10
    assert outcome.result == "skipped"
    assert outcome.kind == "cancelled"


@pytest.mark.parametrize(
    ("outcome", "result", "kind", "degraded", "backend", "exit_code"),
    [
        ("missing", "skipped", "unavailable", True, None, 1),
        ("not_prebuilt", "skipped", "not_prebuilt", True, None, 1),
        ("jit_error", "skipped", "jit", True, None, 1),
        ("no_kernel_image", "skipped", "no_kernel_image", True, None, 1),
        ("numerics", "fail", "numerics", False, "none", 0),
        ("fail", "fail", "error", False, "none", 0),
        ("timeout", "timeout", "hang", True, "none", 1),
    ],
)
def test_outcomes_become_labels_and_exit_codes(
    host_file: Callable[..., Path],
    outcome: str,
    result: str,
    kind: str,
    degraded: bool,
    backend: str | None,
    exit_code: int,
) -> None:
    fixture = host_file("h200x2-host", _with_trtllm(outcome))
    probed = probe(SimulatedHardware(fixture), ProbeConfig(timeout_s=3.0, peer_grace_s=1.0), environ={})
    test = probed.report["tests"]["trtllm"]
    assert (test["result"], test["kind"], test.get("degraded", False)) == (result, kind, degraded)
    assert probed.labels[contract.LABEL_TRTLLM] == result
    assert probed.labels.get(contract.LABEL_BACKEND) == backend, "only a conclusive test writes a backend"
    assert probed.exit_code == exit_code
    assert test["reason"]


def _child(returncode: int = 1) -> childproc.ChildResult:
    return childproc.ChildResult(("sup",), returncode, False, False, "", "", 1.0)


def _events(*per_rank: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [list(events) for events in per_rank]


OK_TO_JIT = [{"step": s, "status": "ok"} for s in ("import", "init")] + [{"step": "jit", "status": "start"}]


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        ({"step": "jit", "status": "fail", "kind": "error", "error": "RuntimeError: Ninja build failed"}, "jit"),
        ({"step": "jit", "status": "fail", "kind": "error", "error": "No module named trtllm_comm.so"}, "jit"),
        (
            {"step": "eager", "status": "fail", "kind": "error",
             "error": "AcceleratorError: CUDA error: no kernel image is available for execution on the device"},
            "no_kernel_image",
        ),
        (
            {"step": "workspace", "status": "fail", "kind": "null_mc_ptr",
             "error": "workspace creation failed: cudaErrorNoKernelImageForDevice while mapping multicast"},
            "no_kernel_image",
        ),
    ],
)  # fmt: skip
def test_kernel_build_and_kernel_image_failures_are_skipped_not_failed(failure: dict[str, Any], kind: str) -> None:
    request = SmokeRequest("trtllm", (0, 1), 30.0)
    ranks = _events([*OK_TO_JIT, failure], OK_TO_JIT)  # rank 1 waits at the barrier and is killed
    supervisor = {"returncodes": [1, -9], "first_failure": 0, "killed": [1]}
    outcome = classify(request, ranks, supervisor, _child(), {})
    assert (outcome.result, outcome.kind, outcome.degraded) == ("skipped", kind, True)
    assert "not tested" in outcome.reason


def test_a_backend_failure_outside_jit_is_still_a_failure() -> None:
    request = SmokeRequest("trtllm", (0, 1), 30.0)
    failure = {"step": "workspace", "status": "fail", "kind": "error", "error": "RuntimeError: peer access denied"}
    outcome = classify(request, _events([*OK_TO_JIT, failure], [*OK_TO_JIT, failure]), None, _child(), {})
    assert (outcome.result, outcome.kind, outcome.degraded) == ("fail", "error", False)


@pytest.mark.parametrize(
    ("step", "message", "kind"),
    [
        ("jit", "RuntimeError: No supported CUDA architectures found for major versions [9, 10].", "jit"),
        ("graph", "CUDA error: no kernel image is available for execution on the device", "no_kernel_image"),
        ("eager", "CUDA error: an illegal memory access was encountered", "error"),
    ],
)  # fmt: skip
def test_the_worker_names_the_kind_of_a_failed_step(step: str, message: str, kind: str) -> None:
    assert failure_kind(step, message) == kind


def test_the_group_of_a_finished_test_leaves_no_process_behind(tmp_path: Path) -> None:
    marker = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        f"open({str(marker)!r}, 'w').write(str(p.pid))"
    )
    result = childproc.run_child([sys.executable, "-c", script], env=childproc.child_env(), timeout_s=30)
    assert result.ok
    pid = int(marker.read_text())
    time.sleep(0.2)
    assert not _alive(pid), "a straggler of the child's process group survived"


def test_rank_events_survive_a_kill(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    path.write_text(json.dumps({"step": "jit", "status": "start"}) + "\n" + '{"step": "jit", "sta')
    assert read_events(path) == [{"step": "jit", "status": "start"}]


INIT_FAILS = [{"step": "import", "status": "ok"}, {"step": "init", "status": "start"}]
IN_WORKSPACE = [*OK_TO_JIT[:2], {"step": "jit", "status": "ok"}, {"step": "workspace", "status": "start"}]


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        ({"step": "init", "status": "fail", "kind": "error",
          "error": "DistNetworkError: The server socket has failed to listen on any local network address. "
                   "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"},
         "infrastructure"),
        ({"step": "init", "status": "fail", "kind": "error",
          "error": "DistBackendError: NCCL error: unhandled system error, NCCL version 2.27.3"}, "startup"),
        ({"step": "workspace", "status": "fail", "kind": "error",
          "error": "OSError: [Errno 28] No space left on device: '/dev/shm/fiar-ipc'"}, "infrastructure"),
        ({"step": "workspace", "status": "fail", "kind": "error",
          "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}, "infrastructure"),
        ({"step": "eager", "status": "fail", "kind": "error",
          "error": "BlockingIOError: [Errno 11] Resource temporarily unavailable"}, "infrastructure"),
    ],
)  # fmt: skip
def test_infrastructure_errors_and_start_up_failures_are_inconclusive(failure: dict[str, Any], kind: str) -> None:
    request = SmokeRequest("trtllm", (0, 1), 30.0)
    ranks = _events([*INIT_FAILS, failure], INIT_FAILS)
    outcome = classify(request, ranks, {"returncodes": [1, -9], "first_failure": 0, "killed": [1]}, _child(), {})
    assert (outcome.result, outcome.kind, outcome.degraded) == ("skipped", kind, True)
    assert "not tested" in outcome.reason


@pytest.mark.parametrize(
    ("codes", "ranks", "kind"),
    [
        ([1, 1], _events([], []), "startup"),  # both ranks exited before their first event
        ([1, -9], _events(INIT_FAILS, INIT_FAILS), "startup"),  # rank 0 left in init; its peer was killed
        ([-11, -9], _events(INIT_FAILS, INIT_FAILS), "startup"),  # a segfault while NCCL starts
        ([-9, 0], _events(IN_WORKSPACE, [*IN_WORKSPACE, {"step": "done", "status": "done"}]), "infrastructure"),
    ],
)
def test_a_rank_that_ends_before_the_backend_ran_is_inconclusive(
    codes: list[int], ranks: list[list[dict[str, Any]]], kind: str
) -> None:
    supervisor = {"returncodes": codes, "first_failure": 0, "killed": [1] if codes[1] == -9 else []}
    outcome = classify(SmokeRequest("trtllm", (0, 1), 30.0), ranks, supervisor, _child(), {})
    assert (outcome.result, outcome.kind, outcome.degraded) == ("skipped", kind, True), outcome.reason


def test_a_rank_that_exits_in_the_backends_steps_is_still_a_failure() -> None:
    ranks = _events(IN_WORKSPACE, IN_WORKSPACE)
    supervisor = {"returncodes": [1, -9], "first_failure": 0, "killed": [1]}
    outcome = classify(SmokeRequest("trtllm", (0, 1), 30.0), ranks, supervisor, _child(), {})
    assert (outcome.result, outcome.kind, outcome.degraded) == ("fail", "error", False)


class _DyingRanks(SimulatedHardware):
    """The simulated host, but every smoke-test rank dies at start-up with a traceback."""

    def smoke_worker(self, backend: contract.Backend) -> list[str]:
        return [sys.executable, "-c", "raise AttributeError(\"'str' object has no attribute 'get'\")"]


def test_ranks_dying_at_start_up_never_give_a_verdict_of_none(host_file: Callable[..., Path]) -> None:
    hw = _DyingRanks(host_file("h200x2-host"))
    probed = probe(hw, ProbeConfig(timeout_s=30.0, peer_grace_s=1.0, benchmark=False), environ={})
    test = probed.report["tests"]["trtllm"]
    assert (test["result"], test["kind"], test.get("degraded")) == ("skipped", "startup", True), test["reason"]
    assert "AttributeError" in test["reason"]
    assert contract.LABEL_BACKEND not in probed.labels, "an inconclusive probe never writes none"
    assert probed.exit_code == 1
