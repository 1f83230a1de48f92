"""Start one process per rank, in the caller's process group, and end peers of a failed rank.

Run as ``python -m node_agent.smoke.supervisor --ranks N --events-dir D --port P -- <worker argv>``
by ``launcher``, which started this process in a new session: every rank inherits that process
group, so the launcher's hard timeout kills ranks and their compilers with one ``killpg``.

A rank that fails leaves its peers blocked in a collective; after ``--peer-grace`` seconds the
supervisor kills them (and records which ones it killed, so their signal is not read as a crash).
``<events-dir>/supervisor.json`` holds every rank's return code. On SIGTERM (the launcher's
timeout or cancel) it kills its ranks and waits for them before exiting, so none is left a zombie.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from node_agent.smoke.events import ENV_EVENTS_FILE


def _rank_env(rank: int, ranks: int, port: int, events: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(ranks),
            "LOCAL_WORLD_SIZE": str(ranks),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            ENV_EVENTS_FILE: str(events / f"rank-{rank}.jsonl"),
        }
    )
    return env


def supervise(ranks: int, events: Path, port: int, argv: list[str], peer_grace_s: float) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    killed: list[int] = []
    first_failure: int | None = None
    failed_at: float | None = None

    def stop(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.kill()
        # Reap them: an unwaited rank outlives this process as a zombie. os.waitpid, not Popen.wait,
        # whose lock the interrupted poll() in the loop below may hold.
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p.pid, 0)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    for r in range(ranks):
        procs.append(subprocess.Popen(argv, env=_rank_env(r, ranks, port, events)))
    while True:
        codes = [p.poll() for p in procs]  # poll every rank: any() would stop at the first running one
        if all(code is not None for code in codes):
            break
        for r, code in enumerate(codes):
            if code not in (None, 0) and first_failure is None:
                first_failure, failed_at = r, time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > peer_grace_s:
            for r, p in enumerate(procs):
                if p.poll() is None:
                    p.kill()
                    killed.append(r)
        time.sleep(0.05)
    codes = [p.wait() for p in procs]
    return {"returncodes": codes, "first_failure": first_failure, "killed": killed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node_agent.smoke.supervisor")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--events-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--peer-grace", type=float, default=10.0)
    parser.add_argument("worker", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    worker = args.worker[1:] if args.worker[:1] == ["--"] else args.worker
    if not worker:
        parser.error("no worker command after --")
    summary = supervise(args.ranks, args.events_dir, args.port, worker, args.peer_grace)
    (args.events_dir / "supervisor.json").write_text(json.dumps(summary))
    return 0 if all(code == 0 for code in summary["returncodes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
