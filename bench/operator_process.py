"""An operator process for the benchmarks: the one argv, environment, readiness wait and stop.

``operator_fleet.py`` and ``operator_create_latency.py`` start the operator of this tree, or of an
older tree (``source``, put first on PYTHONPATH), as a standalone replica on loopback ports.

With ``FIAR_BENCH_PY_SPY`` set to a py-spy executable (not a dependency of fiar: ``pip install py-spy``
into any environment), each operator is sampled from ready until it stops (``py-spy record --gil
--nonblocking --format raw``: the samples that hold the GIL, one folded-stack file beside its log).
``FIAR_BENCH_PY_SPY_ARGS`` replaces ``--gil --nonblocking`` (``--threads --nonblocking``: the samples
of every thread that runs, each stack under its thread).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from devcluster.cluster import free_port
from devcluster.waiting import wait_for


class OperatorProcess:
    """``fiar-operator run --standalone`` against ``kubeconfig``, its output in a log under ``workdir``."""

    spy: subprocess.Popen[bytes] | None = None
    """py-spy sampling this operator (``FIAR_BENCH_PY_SPY``)."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        *,
        source: Path | None = None,
        tls: tuple[Path, Path] | None = None,
        webhook_config: str | None = None,
        pin_core: int | None = None,
        extra: Sequence[str] = (),
        name: str = "operator",
    ) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if source is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(source / "operator"), str(source)])
        argv = [
            *(["taskset", "-c", str(pin_core)] if pin_core is not None else []),
            sys.executable,
            "-c",
            "from fiar_operator.cli import main; raise SystemExit(main())",
            "run",
            f"--kubeconfig={kubeconfig}",
            "--standalone",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={self.port}",
            *([f"--tls-cert={tls[0]}", f"--tls-key={tls[1]}"] if tls is not None else []),
            "--metrics-host=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            *([f"--webhook-config={webhook_config}"] if webhook_config else []),
            *extra,
        ]
        self.log = workdir / f"{name}-{time.monotonic_ns()}.log"
        with self.log.open("wb") as out:
            self.started = time.monotonic()
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def ready(self) -> bool:
        """Whether /readyz answers 200 now."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=1) as resp:
                return int(resp.status) == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Seconds from the start until /readyz answered 200; the process is stopped if it never does."""
        try:
            wait_for(self.ready, timeout, "operator ready", interval=0.1)
        except BaseException:
            self.stop()
            raise
        ready = time.monotonic() - self.started
        spy = os.environ.get("FIAR_BENCH_PY_SPY")
        if spy and type(self) is OperatorProcess:
            folded = self.log.with_suffix(".folded")
            flags = os.environ.get("FIAR_BENCH_PY_SPY_ARGS", "--gil --nonblocking").split()
            argv = [spy, "record", *flags, "--format", "raw", "--rate", "200"]
            self.spy = subprocess.Popen(
                [*argv, "--pid", str(self.pid), "-o", str(folded)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        return ready

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return bytes(resp.read()).decode()

    def freeze(self) -> None:
        os.killpg(self.pid, signal.SIGSTOP)

    def stop(self) -> None:
        if self.spy is not None:  # py-spy writes its samples on SIGINT
            self.spy.send_signal(signal.SIGINT)
            try:
                self.spy.wait(30)
            except subprocess.TimeoutExpired:
                self.spy.kill()
        os.killpg(self.pid, signal.SIGCONT)
        os.killpg(self.pid, signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(5)


class NoopWebhookProcess(OperatorProcess):
    """``bench/noop_webhook.py`` on a loopback port: a webhook that allows everything, for comparison."""

    def __init__(
        self, workdir: Path, tls: tuple[Path, Path], *, pin_core: int | None = None, patch: str | None = None
    ) -> None:
        self.port, self.metrics_port = free_port(), 0
        script = Path(__file__).with_name("noop_webhook.py")
        argv = [
            *(["taskset", "-c", str(pin_core)] if pin_core is not None else []),
            sys.executable,
            str(script),
            f"--port={self.port}",
            f"--cert={tls[0]}",
            f"--key={tls[1]}",
            *([f"--patch={patch}"] if patch is not None else []),
        ]
        self.log = workdir / f"noop-{time.monotonic_ns()}.log"
        with self.log.open("wb") as out:
            self.started = time.monotonic()
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def ready(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False


def buckets(text: str, metric: str, **labels: str) -> dict[float, float]:
    """The cumulative bucket counts (upper bound -> count) of one histogram series, summed over the
    series that carry ``labels``, from Prometheus text exposition."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    counts: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(metric + "_bucket{") or not all(w in line for w in want):
            continue
        inner, value = line[len(metric) + 8 :].rsplit("}", 1)
        le = next(part.split("=", 1)[1].strip('"') for part in inner.split(",") if part.startswith("le="))
        bound = float("inf") if le == "+Inf" else float(le)
        counts[bound] = counts.get(bound, 0.0) + float(value.split()[0])
    return counts


def quantile_bound(after: dict[float, float], before: dict[float, float] | None, q: float) -> tuple[float, float]:
    """(the upper bound of the bucket that holds quantile ``q``, the observations) of the histogram's
    growth from ``before`` to ``after``."""
    grown = {b: c - (before or {}).get(b, 0.0) for b, c in after.items()}
    total = grown.get(float("inf"), 0.0)
    for bound in sorted(grown):
        if total and grown[bound] >= q * total:
            return bound, total
    return float("nan"), total


def total(text: str, metric: str, **labels: str) -> tuple[float, float]:
    """(sum, count) of one histogram, summed over the series that carry ``labels``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    found = {"_sum": 0.0, "_count": 0.0}
    for line in text.splitlines():
        for suffix in found:
            if line.startswith(metric + suffix) and all(w in line for w in want):
                found[suffix] += float(line.rsplit(" ", 1)[1])
    return found["_sum"], found["_count"]
