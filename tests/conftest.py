"""Shared fixtures: the real local control plane in three tiers.

    plane_a: etcd + kube-apiserver
    plane_b: plane_a + kube-controller-manager
    plane_c: plane_b + kube-scheduler + kwok (fake nodes, pods reach Running)
    plane_d: plane_c + one real kubelet node (containerd, runc, bridge CNI) and the project's images
             (marker ``realnode``; skipped with the reason where the host cannot run it)

Each tier is started once per test session, on first use, and stopped at the end. Tests isolate
themselves with their own namespace (``namespace`` fixture) and unique node names. Tests that stop
or restart components ask for ``private_plane`` instead. When a test fails, the tail of every
component's log is attached to the report.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import build, realnode
from devcluster.cluster import ControlPlane, Tier


@pytest.fixture(scope="session")
def controlplane_binaries() -> dict[str, Path]:
    """Build (or reuse from the cache) every control-plane binary."""
    return build.build_all()


def _plane(tmp_path_factory: pytest.TempPathFactory, tier: Tier) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp(f"plane-{tier.name.lower()}"), tier)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def plane_a(controlplane_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from _plane(tmp_path_factory, Tier.A)


@pytest.fixture(scope="session")
def plane_b(controlplane_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from _plane(tmp_path_factory, Tier.B)


@pytest.fixture(scope="session")
def plane_c(controlplane_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from _plane(tmp_path_factory, Tier.C)


@pytest.fixture(scope="session")
def plane_d(controlplane_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Tier D, once per session: its cost (images from the cache, a containerd, a kubelet) is paid once."""
    reason = realnode.unavailable_reason()
    if reason and os.environ.get("FIAR_REQUIRE_REALNODE"):
        pytest.fail(f"FIAR_REQUIRE_REALNODE is set but {reason}")
    if reason:
        pytest.skip(reason)
    start = time.monotonic()
    build.build_all(realnode=True)  # the kubelet (cached); the images are built on start (cached)
    plane = ControlPlane(tmp_path_factory.mktemp("plane-d"), Tier.D)
    plane.start()
    node = plane.real_node
    assert node is not None
    state = node.state
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in node.timings.items())
    print(f"\ntier D up in {time.monotonic() - start:.1f}s ({steps})")
    try:
        yield plane
    finally:
        stop = time.monotonic()
        plane.stop()
        print(f"\ntier D stopped and cleaned up in {time.monotonic() - stop:.1f}s")
    left = realnode.leftovers(state)
    assert not left, f"tier D left behind: {left}"


@pytest.fixture
def private_plane(
    controlplane_binaries: dict[str, Path], tmp_path: Path
) -> Iterator[Callable[[Tier], ControlPlane]]:
    """A factory for planes owned by one test (for tests that stop or restart components)."""
    planes: list[ControlPlane] = []

    def start(tier: Tier) -> ControlPlane:
        plane = ControlPlane(tmp_path / f"plane-{len(planes)}", tier)
        planes.append(plane)
        plane.start()
        return plane

    yield start
    for plane in planes:
        plane.stop()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for cluster-scoped names."""
    return uuid.uuid4().hex[:6]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        for value in funcargs.values():
            value = getattr(value, "plane", value)  # fixtures that wrap a plane (a release on tier D)
            if isinstance(value, ControlPlane):
                report.sections.append((f"control plane logs ({value.tier.name})", value.logs(40)))
