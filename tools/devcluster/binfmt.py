"""Foreign-architecture binaries through qemu-user and the kernel's binfmt_misc (images and tier D).

Building an arm64 image on an amd64 host runs arm64 programs (dpkg's maintainer scripts under
mmdebstrap, ``pip`` in a Dockerfile ``RUN``), and tier D runs arm64 containers on an amd64 kubelet:
both need the kernel to hand arm64 ELF files to ``qemu-aarch64``. Debian's ``qemu-user-static``
ships the registration line of each emulator (``/usr/lib/binfmt.d/qemu-<cpu>.conf``, with the ``F``
flag: the kernel opens the emulator at registration, so it runs inside a container's root too);
``ensure`` mounts binfmt_misc where it is not mounted and writes that line, as root.

A registration is the kernel's (every process on the host sees it) and harmless to keep: it only
lets binaries of that architecture run. It is left in place, as systemd-binfmt leaves it, because a
build or a node of another process may be using it.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Final

BINFMT_DIR: Final = Path("/proc/sys/fs/binfmt_misc")
CONF_DIR: Final = Path("/usr/lib/binfmt.d")

QEMU_CPU: Final = {"amd64": "x86_64", "arm64": "aarch64"}
"""Kubernetes' (and Debian's, and OCI's) architecture name to qemu's."""

_MACHINE: Final = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class BinfmtError(RuntimeError):
    """A foreign architecture cannot run here; the message says why and what to install."""


def host_arch() -> str:
    """This machine's architecture in Kubernetes' words (``amd64``, ``arm64``)."""
    machine = platform.machine().lower()
    return _MACHINE.get(machine, machine)


def entry(arch: str) -> Path:
    return BINFMT_DIR / f"qemu-{QEMU_CPU.get(arch, arch)}"


def registered(arch: str) -> bool:
    """True when ``arch`` binaries run here: the host's own, or a registered and enabled emulator."""
    if arch == host_arch():
        return True
    try:
        text = entry(arch).read_text()
    except OSError:
        return False
    return text.startswith("enabled") and any(
        line.startswith("flags:") and "F" in line.split(":", 1)[1] for line in text.splitlines()
    )


def unavailable_reason(arch: str) -> str | None:
    """Why ``arch`` binaries cannot be made to run here (None when they run or ``ensure`` can register them)."""
    if registered(arch):
        return None
    cpu = QEMU_CPU.get(arch)
    if cpu is None:
        return f"no qemu emulator known for architecture {arch!r}"
    if not (CONF_DIR / f"qemu-{cpu}.conf").is_file():
        return f"running {arch} binaries needs qemu-user-static (apt-get install qemu-user-static)"
    if os.geteuid() != 0:
        return f"registering qemu-{cpu} with binfmt_misc needs root"
    return None


def ensure(arch: str) -> None:
    """Make ``arch`` binaries run here (mount binfmt_misc, register Debian's qemu line); raise why not."""
    reason = unavailable_reason(arch)
    if reason:
        raise BinfmtError(reason)
    if registered(arch):
        return
    if not (BINFMT_DIR / "register").exists():
        mount = shutil.which("mount") or "mount"
        proc = subprocess.run([mount, "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)], capture_output=True)
        if proc.returncode != 0:
            raise BinfmtError(f"mount binfmt_misc on {BINFMT_DIR}: {proc.stderr.decode(errors='replace').strip()}")
    cpu = QEMU_CPU[arch]
    line = next(
        ln
        for ln in (CONF_DIR / f"qemu-{cpu}.conf").read_text().splitlines()
        if ln.startswith(":") and not ln.startswith("#")
    )
    if entry(arch).exists():  # registered without the F flag (binfmt-support's default): replace it
        entry(arch).write_text("-1")
    try:
        (BINFMT_DIR / "register").write_text(line)
    except OSError as exc:
        if not registered(arch):  # another process may have registered it at the same moment
            raise BinfmtError(f"registering qemu-{cpu} with binfmt_misc: {exc}") from exc
    if not registered(arch):
        raise BinfmtError(f"qemu-{cpu} registered but {entry(arch)} does not read enabled with flag F")
