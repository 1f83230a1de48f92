"""Which architectures run here, and why one cannot (devcluster/binfmt.py, pure reads of the host)."""

from __future__ import annotations

from devcluster import binfmt


def test_this_hosts_own_architecture_always_runs() -> None:
    arch = binfmt.host_arch()
    assert arch in binfmt.QEMU_CPU
    assert binfmt.registered(arch)
    assert binfmt.unavailable_reason(arch) is None


def test_an_architecture_without_a_known_emulator_says_so() -> None:
    assert binfmt.unavailable_reason("vax") == "no qemu emulator known for architecture 'vax'"
