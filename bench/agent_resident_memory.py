"""Resident memory of ``fiar-agent run`` after its first probe, without GPUs, side by side.

The resident-daemon figure of BENCHMARKS.md, measured on any machine: the daemon probes a simulated
host (``--simulate``) and publishes to a real local kube-apiserver (tier A). Its VmRSS and VmHWM are
read from /proc 3 s after its Node carries the verdict label (the first probe and publish are done,
the Node watch and the metrics port are open), as bench/agent_gpu_verify.sh reads it on GPU hosts.
Each source tree given (a checkout of another commit, say) runs against the same control plane,
alternating, so the numbers of one run compare side by side:

    PYTHONPATH=tools .venv/bin/python bench/agent_resident_memory.py [--source DIR ...] [--rounds N]

``--source`` defaults to this checkout; ``git archive COMMIT | tar -x -C DIR`` makes another. Raw
output of the last run: ``bench/results/agent/resident_memory.txt``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fiar_contract as contract

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = "h100x8-nvswitch-healthy"


def _status(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def measure(source: Path, plane: Any, node: str, workdir: Path) -> dict[str, float]:
    from kubernetes import client

    from devcluster.cluster import free_port

    env = {**os.environ, "PYTHONPATH": f"{source}{os.pathsep}{source / 'operator'}", "NODE_NAME": node}
    log = workdir / f"{node}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "node_agent",
                "run",
                "--simulate",
                FIXTURE,
                "--kubeconfig",
                str(plane.kubeconfig),
                "--metrics-addr",
                f"127.0.0.1:{free_port()}",
                "--api-backoff-max",
                "5",
            ],
            cwd=source,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        with plane.api_client() as api:
            core = client.CoreV1Api(api)
            while time.monotonic() < deadline:
                labels = core.read_node(node).metadata.labels or {}
                if contract.LABEL_BACKEND in labels:
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"agent from {source} exited {proc.returncode}: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            else:
                raise RuntimeError(f"agent from {source} published nothing in 120 s: {log.read_text()[-2000:]}")
        time.sleep(3)
        return _status(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, action="append", help="source tree to run the agent from")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sources = [s.resolve() for s in (args.source or [ROOT])]

    from devcluster.cluster import ControlPlane, Tier

    results: dict[Path, list[dict[str, float]]] = {s: [] for s in sources}
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(Path(tmp) / "plane", Tier.A)
        plane.start()
        try:
            for round_ in range(args.rounds):
                for i, source in enumerate(sources):
                    node = f"gpu-{round_}-{i}"
                    plane.add_node(node)
                    results[source].append(measure(source, plane, node, Path(tmp)))
        finally:
            plane.stop()
    print(f"fiar-agent run --simulate {FIXTURE}, tier-A kube-apiserver, {args.rounds} rounds, after the first publish")
    print("| source | VmRSS median (MiB) | VmHWM median (MiB) | VmRSS each |")
    print("|---|---|---|---|")
    base = None
    for source, runs in results.items():
        rss = statistics.median(r["VmRSS"] for r in runs)
        hwm = statistics.median(r["VmHWM"] for r in runs)
        ratio = "" if base is None else f" ({rss / base:.3f}x the first)"
        base = base or rss
        each = ", ".join(f"{r['VmRSS']:.1f}" for r in runs)
        print(f"| {source} | {rss:.1f}{ratio} | {hwm:.1f} | {each} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
