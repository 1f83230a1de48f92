"""Foreign-architecture binaries through qemu-user and the kernel's binfmt_misc (images and tier D).

Building an arm64 image on an amd64 host runs arm64 programs (dpkg's maintainer scripts under
mmdebstrap, ``pip`` in a Dockerfile ``RUN``), and tier D runs arm64 containers on an amd64 kubelet:
both need the kernel to hand arm64 ELF files to ``qemu-aarch64``. Debian's qemu packages ship the
registration line of each emulator (``qemu-<cpu>.conf``, with the ``F`` flag: the kernel opens the
emulator at registration, so it runs inside a container's root too); ``ensure`` mounts binfmt_misc
where it is not mounted and writes that line, as root.

The emulator must be at least ``QEMU_MIN``: bookworm's qemu-user-static 7.2 ends ``import torch``
(aarch64 wheel) with SIGSEGV, qemu-user 10.0 runs it (BENCHMARKS.md, "The real agent image"). Where
the host's own emulator is older (or absent), ``ensure`` takes Debian bookworm-backports' ``qemu-user``
package (``QEMU_USER``: static emulators, one row per host architecture, checked by its SHA-256),
keeps the one emulator it needs under the cache (``<cache>/qemu``) and registers that file with
Debian's line for it.

A registration is the kernel's (every process on the host sees it) and harmless to keep: it only
lets binaries of that architecture run. It is left in place, as systemd-binfmt leaves it, because a
build or a node of another process may be using it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from devcluster import build

BINFMT_DIR: Final = Path("/proc/sys/fs/binfmt_misc")
CONF_DIR: Final = Path("/usr/lib/binfmt.d")

QEMU_CPU: Final = {"amd64": "x86_64", "arm64": "aarch64"}
"""Kubernetes' (and Debian's, and OCI's) architecture name to qemu's."""

_MACHINE: Final = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}

QEMU_MIN: Final = (10, 0)
"""The oldest qemu-user registered: 7.2 crashes in torch's import for aarch64, 10.0.2 runs it."""

DEBIAN_MIRROR: Final = "https://deb.debian.org/debian/"


@dataclass(frozen=True)
class QemuPackage:
    """One Debian ``qemu-user`` package (static emulators, with their binfmt lines) in the mirror's pool."""

    version: str
    pool_path: str
    sha256: str

    @property
    def url(self) -> str:
        return DEBIAN_MIRROR + self.pool_path


QEMU_USER: Final = {
    "amd64": QemuPackage(
        "1:10.0.2+ds-2+deb13u1~bpo12+1",
        "pool/main/q/qemu/qemu-user_10.0.2+ds-2+deb13u1~bpo12+1_amd64.deb",
        "10a2dec99f2b2d0b1097ff0375aea35b89322d6631fc96700511b02e05bf6fef",
    ),
    "arm64": QemuPackage(
        "1:10.0.2+ds-2+deb13u1~bpo12+1",
        "pool/main/q/qemu/qemu-user_10.0.2+ds-2+deb13u1~bpo12+1_arm64.deb",
        "b98c7b86ae9c69d0a28e834f2d8e1d1edb57e9ed355cfb5eae4e72c7eef73b37",
    ),
}
"""bookworm-backports' qemu-user for each host architecture (``apt-cache show qemu-user/bookworm-backports``).
When the mirror moves on and drops this version from its pool, the row takes the new one."""


class BinfmtError(RuntimeError):
    """A foreign architecture cannot run here; the message says why and what to install."""


def host_arch() -> str:
    """This machine's architecture in Kubernetes' words (``amd64``, ``arm64``)."""
    machine = platform.machine().lower()
    return _MACHINE.get(machine, machine)


def entry(arch: str) -> Path:
    return BINFMT_DIR / f"qemu-{QEMU_CPU.get(arch, arch)}"


def emulator_version(path: str | Path) -> tuple[int, int] | None:
    """``qemu-<cpu> --version``'s major and minor version; None when it does not run or says none."""
    try:
        proc = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"version (\d+)\.(\d+)", proc.stdout)
    return (int(found[1]), int(found[2])) if found else None


def _new_enough(path: str | Path) -> bool:
    version = emulator_version(path)
    return version is not None and version >= QEMU_MIN


def registered(arch: str) -> bool:
    """True when ``arch`` binaries run here: the host's own, or an enabled emulator of at least ``QEMU_MIN``."""
    if arch == host_arch():
        return True
    try:
        text = entry(arch).read_text()
    except OSError:
        return False
    fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    return (
        text.startswith("enabled")
        and "F" in fields.get("flags:", "")
        and _new_enough(fields.get("interpreter", "").strip())
    )


def unavailable_reason(arch: str) -> str | None:
    """Why ``arch`` binaries cannot be made to run here (None when they run or ``ensure`` can register them)."""
    if registered(arch):
        return None
    cpu = QEMU_CPU.get(arch)
    if cpu is None:
        return f"no qemu emulator known for architecture {arch!r}"
    if os.geteuid() != 0:
        return f"registering qemu-{cpu} with binfmt_misc needs root"
    if _installed_line(cpu) is None and host_arch() not in QEMU_USER:
        wanted = ".".join(map(str, QEMU_MIN))
        return f"running {arch} binaries needs qemu-user {wanted} or later (Debian: bookworm-backports' qemu-user)"
    return None


def ensure(arch: str) -> None:
    """Make ``arch`` binaries run here (mount binfmt_misc, register a qemu of ``QEMU_MIN``); raise why not."""
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
    line = _installed_line(cpu) or _fetched_line(cpu)
    if entry(arch).exists():  # an older emulator, or one without the F flag (binfmt-support's default): replace it
        with contextlib.suppress(OSError):  # another process may have removed it at the same moment
            entry(arch).write_text("-1")
    try:
        (BINFMT_DIR / "register").write_text(line)
    except OSError as exc:
        if not registered(arch):  # another process may have registered it at the same moment
            raise BinfmtError(f"registering qemu-{cpu} with binfmt_misc: {exc}") from exc
    if not registered(arch):
        raise BinfmtError(f"qemu-{cpu} registered but {entry(arch)} does not read enabled, flag F, qemu {QEMU_MIN}+")


def _conf_line(text: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith(":"))


def with_interpreter(line: str, interpreter: Path) -> str:
    """A binfmt_misc line (``:name:type:offset:magic:mask:interpreter:flags``) naming another interpreter."""
    fields = line.split(":")
    fields[6] = str(interpreter)
    return ":".join(fields)


def _installed_line(cpu: str) -> str | None:
    """The host's own registration line for ``qemu-<cpu>`` when its emulator is at least ``QEMU_MIN``."""
    conf = CONF_DIR / f"qemu-{cpu}.conf"
    try:
        line = _conf_line(conf.read_text())
    except (OSError, StopIteration):
        return None
    return line if _new_enough(line.split(":")[6]) else None


def qemu_dir() -> Path:
    package = QEMU_USER[host_arch()]
    upstream = package.version.split(":", 1)[-1]
    return build.cache_root().parent / "qemu" / f"qemu-user_{upstream}_{host_arch()}"


def _fetched_line(cpu: str) -> str:
    """Debian's line for ``qemu-<cpu>`` naming the emulator kept from ``QEMU_USER``'s package (fetched once)."""
    directory = qemu_dir()
    binary, conf = directory / f"qemu-{cpu}", directory / f"qemu-{cpu}.conf"
    if not (binary.is_file() and conf.is_file()):
        _fetch(QEMU_USER[host_arch()], cpu, directory)
    return with_interpreter(_conf_line(conf.read_text()), binary)


def _fetch(package: QemuPackage, cpu: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fiar-qemu-", dir=directory) as tmp:
        deb = Path(tmp) / "qemu-user.deb"
        try:
            with urllib.request.urlopen(package.url, timeout=120) as response, deb.open("wb") as out:
                shutil.copyfileobj(response, out)
        except OSError as exc:
            raise BinfmtError(f"fetching qemu-user {package.version} ({package.url}): {exc}") from exc
        digest = hashlib.sha256(deb.read_bytes()).hexdigest()
        if digest != package.sha256:
            raise BinfmtError(f"{package.url}: SHA-256 {digest}, expected {package.sha256}")
        tree = Path(tmp) / "tree"
        proc = subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BinfmtError(f"dpkg-deb -x {package.url}: {proc.stderr.strip()}")
        for source, target in (
            (tree / "usr/share/qemu/binfmt.d" / f"qemu-{cpu}.conf", directory / f"qemu-{cpu}.conf"),
            (tree / "usr/bin" / f"qemu-{cpu}", directory / f"qemu-{cpu}"),
        ):
            if not source.is_file():
                raise BinfmtError(f"{package.url} holds no {source.relative_to(tree)}")
            shutil.copy2(source, target.with_name(target.name + ".partial"))
            target.with_name(target.name + ".partial").replace(target)
