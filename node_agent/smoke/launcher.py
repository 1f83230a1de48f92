"""Launch one smoke test: a supervisor and its ranks in a fresh process group with a hard timeout.

This is the only part of the smoke tests the resident agent runs in-process; it imports neither
torch nor FlashInfer. The group gets the host policy's variables, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
(so CUDA numbers GPUs as NVML does) and ``CUDA_VISIBLE_DEVICES`` set to the GPUs under test, each
once: a shared-GPU request (test hosts only) keeps its duplicate devices as ranks, and each rank
uses ``LOCAL_RANK % device_count``.
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from node_agent import childproc
from node_agent.smoke import events as ev
from node_agent.smoke.outcome import SmokeOutcome, SmokeRequest
from node_agent.smoke.rules import classify

Progress = Callable[[str], None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Follower:
    """Turns new rank-0 events into progress lines while the test runs."""

    def __init__(self, path: Path, backend: str, progress: Progress | None, heartbeat: Callable[[], None] | None):
        self.path = path
        self.backend = backend
        self.progress = progress
        self.heartbeat = heartbeat
        self.seen = 0

    def __call__(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat()
        if self.progress is None:
            return
        events = ev.read_events(self.path)
        for event in events[self.seen :]:
            step, status = event.get("step"), event.get("status")
            if status == "start":
                hint = " (builds kernels on a cold cache; may take minutes)" if step == "jit" else ""
                self.progress(f"{self.backend}: {step}...{hint}")
            elif status == "ok":
                self.progress(f"{self.backend}: {step} ok ({float(event.get('dt', 0.0)):.2f}s)")
            elif status in ev.TERMINAL and status != "done":
                self.progress(f"{self.backend}: {step} {status}: {event.get('error', '')}")
        self.seen = len(events)


def run_smoke(
    request: SmokeRequest,
    worker_argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cancel: threading.Event | None = None,
    progress: Progress | None = None,
    heartbeat: Callable[[], None] | None = None,
    peer_grace_s: float = 10.0,
) -> SmokeOutcome:
    """Run ``worker_argv`` as ``request.ranks`` ranks and classify what they reported."""
    group_env = {
        **env,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in request.visible_devices),
    }
    with tempfile.TemporaryDirectory(prefix=f"fiar-smoke-{request.backend}-") as tmp:
        events_dir = Path(tmp)
        argv = [
            sys.executable, "-m", "node_agent.smoke.supervisor",
            "--ranks", str(request.ranks),
            "--events-dir", str(events_dir),
            "--port", str(free_port()),
            "--peer-grace", str(peer_grace_s),
            "--", *worker_argv, *request.worker_args(),
        ]  # fmt: skip
        follower = _Follower(events_dir / "rank-0.jsonl", request.backend, progress, heartbeat)
        child = childproc.run_child(
            argv,
            env=childproc.child_env(group_env),
            timeout_s=request.timeout_s,
            cancel=cancel,
            on_tick=follower,
        )
        ranks = [ev.read_events(events_dir / f"rank-{r}.jsonl") for r in range(request.ranks)]
        supervisor: dict[str, Any] | None = None
        try:
            supervisor = json.loads((events_dir / "supervisor.json").read_text())
        except (FileNotFoundError, ValueError):
            supervisor = None
    outcome = classify(request, ranks, supervisor, child, env)
    if progress is not None and outcome.result != "pass":
        tail = child.stderr_tail(12)
        if tail:
            progress(f"{request.backend}: last lines of the ranks' stderr:\n{tail}")
    return outcome
