"""Helpers for the node agent's tests without a control plane: a hardware recorder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

import fiar_contract as contract
from node_agent import hardware, inventory


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
