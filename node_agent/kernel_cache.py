"""The agent's FlashInfer kernel cache: seeded from the image, keyed by what the image holds.

The agent image ships FlashInfer's comm kernels prebuilt in ``/opt/fiar-kernels``, inside its
read-only root filesystem. FlashInfer needs a writable workspace all the same (ninja writes its log
and lock files even when nothing is rebuilt), so at start ``prepare`` copies the image's kernels into
``<cache>/kernels-<key>`` and the agent points its smoke tests' ``FLASHINFER_WORKSPACE_BASE`` there.
``<key>`` is a digest of the seed's listing (every path, size and modification time): an image with
other kernels or another FlashInfer gets a fresh directory, so a cache kept on the host across
upgrades never serves an older image's kernels. Directories of other keys are removed; nothing else
in ``<cache>`` is touched. The copy is made under a temporary name and renamed into place, so a
crash leaves no half-seeded cache, and a directory that no longer holds every file of the seed as
it was (one removed, replaced or rewritten since) is seeded again; files FlashInfer adds are kept.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

PREFIX = "kernels-"
"""Names of the directories ``prepare`` creates (and the only ones it removes)."""
DEFAULT_SEED = Path("/opt/fiar-kernels")


Entry = tuple[str, int, int, str]


def listing(root: Path) -> list[Entry]:
    """(relative path, size, mtime in whole seconds, link target) of every file, link and folder
    under ``root``; folders count with size and time 0 (adding a file changes a folder's time)."""
    entries: list[Entry] = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                entries.append((rel, 0, 0, os.readlink(path)))
            elif path.is_dir():
                entries.append((rel, 0, 0, ""))
            else:
                st = path.lstat()
                entries.append((rel, st.st_size, int(st.st_mtime), ""))
    return sorted(entries)


def key(seed: Path) -> str:
    """The cache key of a seed folder: a digest of its listing."""
    digest = hashlib.sha256()
    for entry in listing(seed):
        digest.update(repr(entry).encode())
    return digest.hexdigest()[:16]


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def prepare(seed: Path, cache: Path) -> Path:
    """The cache directory for ``seed`` under ``cache``, seeded if needed; other keys removed.

    Raises ``OSError`` when the cache cannot be written (the caller decides what to do)."""
    wanted = key(seed)
    target = cache / f"{PREFIX}{wanted}"
    cache.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or (target.exists() and not set(listing(seed)) <= set(listing(target))):
        _remove(target)
    if not target.exists():
        staging = cache / f".{PREFIX}{wanted}.{os.getpid()}"
        _remove(staging)
        shutil.copytree(seed, staging, symlinks=True)
        try:
            staging.rename(target)
        except OSError:  # another agent on this host seeded it meanwhile
            _remove(staging)
    for entry in cache.iterdir():
        name = entry.name.lstrip(".")
        if name.startswith(PREFIX) and entry != target:
            _remove(entry)
    return target
