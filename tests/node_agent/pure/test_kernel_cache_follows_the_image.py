"""The agent's kernel cache is seeded from the image into a folder keyed by the image's kernels: an
upgraded image never runs an older image's kernels, a tampered copy is seeded again, and files
FlashInfer adds survive a restart of the same image."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node_agent import kernel_cache
from node_agent.daemon import DaemonConfig, seed_kernel_cache
from node_agent.errors import ConfigError
from node_agent.probe import ProbeConfig

MODULE = Path("0.6.13/90a_100a/cached_ops/trtllm_comm/trtllm_comm.so")


def image(root: Path, kernel: bytes, mtime: int = 1_700_000_000) -> Path:
    """A seed folder as the image ships it: one prebuilt module."""
    so = root / MODULE
    so.parent.mkdir(parents=True, exist_ok=True)
    so.write_bytes(kernel)
    os.utime(so, (mtime, mtime))
    return root


def test_the_cache_is_seeded_from_the_image_into_a_keyed_folder(tmp_path: Path) -> None:
    seed = image(tmp_path / "image", b"kernels of image 1")
    folder = kernel_cache.prepare(seed, tmp_path / "cache")
    assert folder.parent == tmp_path / "cache" and folder.name.startswith("kernels-")
    assert (folder / MODULE).read_bytes() == b"kernels of image 1"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name], "no staging folder is left"


def test_an_upgraded_image_replaces_the_kernels_of_the_old_one(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old = kernel_cache.prepare(image(tmp_path / "v1", b"old kernel"), cache)
    # the same FlashInfer version, so the same path inside the cache: `cp -Rn` kept the old file
    new = kernel_cache.prepare(image(tmp_path / "v2", b"new kernel!", mtime=1_800_000_000), cache)
    assert new != old
    assert (new / MODULE).read_bytes() == b"new kernel!"
    assert not old.exists(), "the old image's kernels are removed"


def test_a_restart_of_the_same_image_keeps_what_flashinfer_added(tmp_path: Path) -> None:
    seed, cache = image(tmp_path / "image", b"k"), tmp_path / "cache"
    folder = kernel_cache.prepare(seed, cache)
    (folder / "0.6.13" / ".ninja_log").write_text("built\n")
    assert kernel_cache.prepare(seed, cache) == folder
    assert (folder / "0.6.13" / ".ninja_log").read_text() == "built\n"


@pytest.mark.parametrize("tamper", ["rewrite", "remove", "symlink"])
def test_a_changed_copy_is_seeded_again(tmp_path: Path, tamper: str) -> None:
    seed, cache = image(tmp_path / "image", b"genuine kernel"), tmp_path / "cache"
    folder = kernel_cache.prepare(seed, cache)
    if tamper == "rewrite":
        (folder / MODULE).write_bytes(b"planted by another pod")
    elif tamper == "remove":
        (folder / MODULE).unlink()
    else:
        elsewhere = image(tmp_path / "elsewhere", b"planted")
        kernel_cache._remove(folder)
        folder.symlink_to(elsewhere, target_is_directory=True)
    again = kernel_cache.prepare(seed, cache)
    assert not again.is_symlink()
    assert (again / MODULE).read_bytes() == b"genuine kernel"


def test_nothing_but_its_own_folders_is_removed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "someone-elses").mkdir(parents=True)
    (cache / "kernels-0123456789abcdef").mkdir()
    (cache / ".kernels-0123456789abcdef.42").mkdir()
    folder = kernel_cache.prepare(image(tmp_path / "image", b"k"), cache)
    assert sorted(p.name for p in cache.iterdir()) == sorted([folder.name, "someone-elses"])


def test_the_daemon_points_flashinfer_at_the_keyed_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", "/opt/fiar-kernels")
    seed = image(tmp_path / "image", b"k")
    config = DaemonConfig("gpu-0", None, ProbeConfig(), kernel_cache=str(tmp_path / "cache"), kernel_seed=str(seed))
    config.validate()
    seed_kernel_cache(config)
    assert os.environ["FLASHINFER_WORKSPACE_BASE"] == str(kernel_cache.prepare(seed, tmp_path / "cache"))


def test_a_missing_seed_is_a_configuration_error(tmp_path: Path) -> None:
    config = DaemonConfig("gpu-0", None, ProbeConfig(), kernel_cache=str(tmp_path), kernel_seed="/nonexistent")
    with pytest.raises(ConfigError, match="--kernel-seed /nonexistent: no such folder"):
        config.validate()
