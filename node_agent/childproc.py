"""Run a child process in its own process group, with a hard timeout that kills the whole group.

Native code (NVML, the CUDA driver, NCCL, FlashInfer kernels) can crash or hang the process that
calls it, and a hung collective blocks every rank. So each native step runs in a fresh session
(``start_new_session``): its children inherit the process group, and one ``killpg`` ends all of
them: ranks, ninja and nvcc included. A crash becomes a return code and a signal name in the
report; the resident agent never shares an address space with native probes.

Orphans: a process whose parent dies is re-parented to PID 1 (or the nearest subreaper). When the
agent itself is PID 1, ``start_reaper`` collects such exited orphans (``os.waitpid(-1, WNOHANG)``
every half second, and while ``kill_group`` waits), so they do not pile up as zombies or keep a
process group "alive". The reaper may collect a child ``run_child`` is waiting for; it then hands
that child's wait status over, so ``run_child`` still reports the real exit code or signal (a
``subprocess`` wait that finds the child gone, ECHILD, would read it as 0).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import node_agent

PACKAGE_ROOT = Path(node_agent.__file__).resolve().parent.parent
"""The folder holding ``node_agent`` and ``fiar_contract``; children get it on PYTHONPATH."""

_lock = threading.Lock()
_owned: set[int] = set()
"""Children ``run_child`` started and has not collected yet."""
_reaped: dict[int, int] = {}
"""Wait statuses of owned children the reaper collected, for ``run_child`` to pick up."""
_reaping = False


def reap_orphans() -> int:
    """Collect every exited child without blocking; keeps the status of ``run_child``'s own children."""
    collected = 0
    while True:
        with _lock:  # held across waitpid: run_child looks up a status only after the reaper stored it
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return collected
            if pid == 0:
                return collected
            if pid in _owned:
                _reaped[pid] = status
        collected += 1


def start_reaper(stop: threading.Event, interval_s: float = 0.5) -> threading.Thread:
    """Reap exited children every ``interval_s`` until ``stop`` (for an agent running as PID 1)."""
    global _reaping
    _reaping = True

    def loop() -> None:
        while not stop.wait(interval_s):
            reap_orphans()

    thread = threading.Thread(target=loop, name="child-reaper", daemon=True)
    thread.start()
    return thread


def _collect(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc``; its real return code even if the reaper collected it first."""
    proc.wait()
    with _lock:
        _owned.discard(proc.pid)
        status = _reaped.pop(proc.pid, None)
    if status is not None:
        return os.waitstatus_to_exitcode(status)
    assert proc.returncode is not None
    return proc.returncode


@dataclass(frozen=True)
class ChildResult:
    argv: tuple[str, ...]
    returncode: int | None
    timed_out: bool
    cancelled: bool
    stdout: str
    stderr: str
    duration_s: float

    @property
    def signal(self) -> int | None:
        """The signal that ended the child (not one the launcher sent)."""
        if self.timed_out or self.cancelled or self.returncode is None or self.returncode >= 0:
            return None
        return -self.returncode

    @property
    def signal_name(self) -> str | None:
        sig = self.signal
        if sig is None:
            return None
        try:
            return signal.Signals(sig).name
        except ValueError:
            return f"signal {sig}"

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.cancelled

    def stderr_tail(self, lines: int = 8) -> str:
        return "\n".join(self.stderr.strip().splitlines()[-lines:])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The agent's environment plus ``extra``, with this package importable in the child."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    parts = [str(PACKAGE_ROOT), *[p for p in path.split(os.pathsep) if p and p != str(PACKAGE_ROOT)]]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def kill_group(pgid: int, grace_s: float, poll: Callable[[], object] | None = None) -> None:
    """SIGTERM the group, then SIGKILL whatever is left after ``grace_s``.

    A zombie still counts as a member of its group, so while waiting this collects what exited:
    ``poll`` (the group leader's, when it is the caller's child) and, under ``start_reaper``, orphans.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if poll is not None:
            poll()
        if _reaping:
            reap_orphans()
        if not group_alive(pgid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout_s: float,
    cancel: threading.Event | None = None,
    on_tick: Callable[[], None] | None = None,
    tick_s: float = 0.2,
    kill_grace_s: float = 3.0,
    cwd: str | None = None,
) -> ChildResult:
    """Run ``argv`` in a new session; kill its whole process group on timeout or ``cancel``.

    Output goes to temporary files, not pipes, so a chatty child can never block on a full pipe.
    Whatever the outcome, the group is killed before returning: no rank outlives its test.
    """
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        with _lock:  # registered before the reaper can see it exit
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
            _owned.add(proc.pid)
        pgid = proc.pid
        timed_out = cancelled = False
        try:
            while True:
                try:
                    proc.wait(timeout=tick_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if on_tick is not None:
                    on_tick()
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                if time.monotonic() - start > timeout_s:
                    timed_out = True
                    break
        finally:
            if proc.returncode is None or group_alive(pgid):
                kill_group(pgid, kill_grace_s if (timed_out or cancelled) else 0.0, proc.poll)
            returncode = _collect(proc)
        if on_tick is not None:
            on_tick()
        out.seek(0)
        err.seek(0)
        return ChildResult(
            argv=tuple(argv),
            returncode=returncode,
            timed_out=timed_out,
            cancelled=cancelled,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
            duration_s=time.monotonic() - start,
        )
