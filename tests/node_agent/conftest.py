"""Helpers for the node agent's tests: changed fixture files, a hardware recorder, the daemon as a process."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.cluster import free_port
from devcluster.waiting import wait_for
from node_agent import hardware, inventory

FIXTURES = hardware.FIXTURES


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.fixture
def host_file(tmp_path: Path) -> Callable[..., Path]:
    """Write a shipped fixture, changed by ``edit(doc)``, to a temporary file."""
    counter = iter(range(1000))

    def make(name: str, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
        doc = copy.deepcopy(load(name))
        if edit is not None:
            edit(doc)
        path = tmp_path / f"{name}-{next(counter)}.json"
        path.write_text(json.dumps(doc, indent=1))
        return path

    return make


class RecordingHardware:
    """A Hardware that delegates to another and records which smoke workers were asked for."""

    def __init__(self, inner: hardware.SimulatedHardware) -> None:
        self.inner = inner
        self.workers: list[str] = []

    @property
    def description(self) -> str:
        return self.inner.description

    @property
    def simulated(self) -> bool:
        return True

    def read_inventory(self, timeout_s: float = 60.0) -> inventory.Inventory:
        return self.inner.read_inventory(timeout_s)

    def driver_version(self) -> str | None:
        return self.inner.driver_version()

    def host_environment(self) -> Mapping[str, str]:
        return self.inner.host_environment()

    def software_versions(self) -> dict[str, str | None]:
        return self.inner.software_versions()

    def smoke_worker(self, backend: contract.Backend) -> list[str]:
        self.workers.append(backend)
        return self.inner.smoke_worker(backend)


@pytest.fixture
def recorder() -> Callable[[str | Path], RecordingHardware]:
    """``recorder(fixture)``: simulated hardware that records the smoke workers it starts."""

    def make(fixture: str | Path) -> RecordingHardware:
        return RecordingHardware(hardware.SimulatedHardware(Path(fixture)))

    return make


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
