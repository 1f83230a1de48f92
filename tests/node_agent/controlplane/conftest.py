"""Helpers for the node agent's control-plane tests: the daemon as a process, and a poller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.cluster import free_port
from devcluster.waiting import wait_for


def eventually(check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2, what: str = "") -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    return wait_for(check, timeout, what or repr(check), interval)


class Daemon:
    """``fiar-agent run`` as a subprocess against a control plane, with its metrics endpoint."""

    def __init__(self, kubeconfig: Path, node: str, fixture: Path, log: Path, *extra: str, via_env: bool = False):
        self.port = free_port()
        self.log = log
        env = {k: v for k, v in os.environ.items() if k not in contract.HOST_POLICY_ENV and k != "NODE_NAME"}
        argv = [
            sys.executable, "-m", "node_agent", "run",
            "--simulate", str(fixture),
            "--kubeconfig", str(kubeconfig),
            "--metrics-addr", f"127.0.0.1:{self.port}",
            "--api-backoff-max", "1",
            "--driver-check", "0.5",
            "--timeout", "30",
            *extra,
        ]  # fmt: skip
        if via_env:
            env["NODE_NAME"] = node
        else:
            argv += ["--node-name", node]
        self._out = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, env=env)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def metric(self, name: str) -> float:
        """Sum of every sample of ``name`` (any labels) on /metrics; 0 if absent."""
        _status, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and (line[len(name)] in " {"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._out.close()
        return code


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """``daemon(kubeconfig, node, fixture, *args)`` starts ``fiar-agent run``; stopped at teardown."""
    started: list[Daemon] = []

    def start(kubeconfig: Path, node: str, fixture: Path, *extra: str, via_env: bool = False) -> Daemon:
        d = Daemon(kubeconfig, node, fixture, tmp_path / f"daemon-{len(started)}.log", *extra, via_env=via_env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def eventually_fn() -> Callable[..., Any]:
    """The ``eventually`` poller, for tests (conftest modules are not importable by name)."""
    return eventually
