"""Which architectures run here, which qemu is taken for them, and why one cannot (devcluster/binfmt.py)."""

from __future__ import annotations

from pathlib import Path

from devcluster import binfmt

DEBIAN_AARCH64_LINE = (
    r":qemu-aarch64:M::\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:"
    r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:"
    r"/usr/libexec/qemu-binfmt/aarch64-binfmt-P:OPF"
)
"""Debian's ``qemu-aarch64.conf`` line (bookworm's qemu-user-static 7.2 and bookworm-backports' qemu-user 10.0)."""


def test_this_hosts_own_architecture_always_runs() -> None:
    arch = binfmt.host_arch()
    assert arch in binfmt.QEMU_CPU
    assert binfmt.registered(arch)
    assert binfmt.unavailable_reason(arch) is None


def test_an_architecture_without_a_known_emulator_says_so() -> None:
    assert binfmt.unavailable_reason("vax") == "no qemu emulator known for architecture 'vax'"


def _emulator(tmp_path: Path, name: str, says: str) -> Path:
    program = tmp_path / name
    program.write_text(f"#!/bin/sh\necho '{says}'\n")
    program.chmod(0o755)
    return program


def test_bookworms_qemu_is_older_than_the_one_that_runs_torch_and_backports_is_not(tmp_path: Path) -> None:
    bookworm = _emulator(tmp_path, "bookworm", "qemu-aarch64 version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)")
    backports = _emulator(tmp_path, "backports", "qemu-aarch64 version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)")
    old, new = binfmt.emulator_version(bookworm), binfmt.emulator_version(backports)
    assert old == (7, 2) and new == (10, 0)
    assert old < binfmt.QEMU_MIN <= new


def test_a_program_that_is_not_there_or_names_no_version_is_no_emulator(tmp_path: Path) -> None:
    assert binfmt.emulator_version(tmp_path / "absent") is None
    assert binfmt.emulator_version(_emulator(tmp_path, "other", "usage: something else")) is None


def test_the_registration_keeps_debians_magic_mask_and_flags_and_names_the_kept_emulator() -> None:
    kept = Path("/cache/qemu/qemu-user_10.0.2_amd64/qemu-aarch64")
    line = binfmt.with_interpreter(DEBIAN_AARCH64_LINE, kept)
    assert line.split(":")[6] == str(kept)
    assert line.replace(str(kept), "/usr/libexec/qemu-binfmt/aarch64-binfmt-P") == DEBIAN_AARCH64_LINE


def test_every_host_architecture_has_a_debian_qemu_user_package_of_the_version_that_runs_torch() -> None:
    assert set(binfmt.QEMU_USER) == set(binfmt.QEMU_CPU)
    for arch, package in binfmt.QEMU_USER.items():
        upstream = package.version.split(":", 1)[1]
        assert package.url == f"{binfmt.DEBIAN_MIRROR}pool/main/q/qemu/qemu-user_{upstream}_{arch}.deb"
        assert tuple(int(n) for n in upstream.split(".")[:2]) >= binfmt.QEMU_MIN
        assert len(package.sha256) == 64
