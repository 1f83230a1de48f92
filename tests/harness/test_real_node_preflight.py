"""Tier D says exactly why it cannot run on a host, and finds the node's address off loopback."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from devcluster import images, realnode


def test_a_host_without_the_packages_is_told_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    reason = realnode.unavailable_reason()
    assert reason is not None
    if "needs root" not in reason:  # as root, the missing programs are named
        for tool in ("containerd", "runc", "ctr", "iptables", "buildah", "mmdebstrap"):
            assert tool in reason
        assert "apt-get install" in reason


def test_the_node_address_is_never_a_loopback_address() -> None:
    addr = realnode.host_ip()
    if addr is None:
        pytest.skip("this host has no global IPv4 address")
    assert not ipaddress.ip_address(addr).is_loopback


def test_image_keys_follow_the_content_they_are_built_from() -> None:
    planned = images.planned()
    assert set(planned) == {"operator", "agent-sim", "vllm-standin", "pause"}
    assert planned["operator"].key == images.dockerfile_key("operator") != images.dockerfile_key("agent-sim")
    assert images.content_key("a") != images.content_key("b")
    for image in planned.values():
        assert not image.archive.resolve().is_relative_to(images.ROOT), "image cache inside the repository"
        assert image.archive.name.endswith(f"-{image.key}.tar")


def test_the_image_cache_keeps_the_newest_archives_of_each_image(tmp_path: Path) -> None:
    for age, key in enumerate(["k1", "k2", "k3", "k4"]):
        archive = tmp_path / f"operator-{key}.tar"
        archive.write_text(key)
        os.utime(archive, (1000 + age, 1000 + age))
    (tmp_path / "agent-sim-k0.tar").write_text("other image")
    images._prune("operator", tmp_path / "operator-k2.tar")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "agent-sim-k0.tar",
        "operator-k2.tar",
        "operator-k3.tar",
        "operator-k4.tar",
    ]
