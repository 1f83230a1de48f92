"""Each fiar image is one multi-architecture image: read from the built archives, not from the Dockerfile.

For ``operator`` and ``agent-sim`` the archive's image is an OCI index with one manifest per
architecture of ``fiar_contract.IMAGE_ARCHITECTURES``; each manifest's config names that
architecture, and every ELF file of its layers (the Debian base's Python, the compiled extensions
pip installed into the virtualenv) is built for that CPU: an image that says arm64 but holds x86
wheels would fail on a Grace node with an exec format error.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import fiar_contract as contract
from devcluster import binfmt, images

pytestmark = [pytest.mark.realnode]

ELF_MACHINE = {"amd64": 0x3E, "arm64": 0xB7}
"""e_machine of the ELF header: EM_X86_64, EM_AARCH64."""


@pytest.fixture(scope="module")
def built() -> dict[str, images.Image]:
    missing = images.missing_tools()
    reasons = [f"missing {', '.join(missing)}"] if missing else []
    reasons += [r for r in (binfmt.unavailable_reason(a) for a in images.ARCHITECTURES) if r]
    if reasons and os.environ.get("FIAR_REQUIRE_REALNODE"):
        pytest.fail(f"FIAR_REQUIRE_REALNODE is set but the images cannot be built: {'; '.join(reasons)}")
    if reasons:
        pytest.skip(f"the images cannot be built here: {'; '.join(reasons)}")
    return images.build_images()


def _layer_elves(archive: Path, digest: str) -> Iterator[tuple[str, int]]:
    """(path, e_machine) of every ELF file in one layer of the archive."""
    algo, _, hexdigest = digest.partition(":")
    with tarfile.open(archive) as outer:
        member = outer.extractfile(f"blobs/{algo}/{hexdigest}")
        assert member is not None
        data = member.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as layer:
        for entry in layer:
            if not entry.isfile() or entry.size < 20:
                continue
            f = layer.extractfile(entry)
            assert f is not None
            head = f.read(20)
            if head[:4] == b"\x7fELF":
                yield entry.name, int.from_bytes(head[18:20], "little")


@pytest.mark.parametrize("name", ["operator", "agent-sim"])
def test_the_image_is_one_index_of_every_shipped_architecture(built: dict[str, images.Image], name: str) -> None:
    image = built[name]
    found = images.read_index(image.archive)
    assert tuple(found) == contract.IMAGE_ARCHITECTURES == image.architectures
    for arch, entry in found.items():
        assert entry["descriptor"]["platform"] == {"architecture": arch, "os": "linux"}
        assert entry["config"]["os"] == "linux"
        assert entry["config"]["config"]["Entrypoint"][0] in ("fiar-operator", "tini")


@pytest.mark.parametrize("name", ["operator", "agent-sim"])
def test_every_binary_of_each_architectures_image_is_built_for_that_cpu(
    built: dict[str, images.Image], name: str
) -> None:
    image = built[name]
    for arch, entry in images.read_index(image.archive).items():
        elves = [e for layer in entry["manifest"]["layers"] for e in _layer_elves(image.archive, layer["digest"])]
        python = [path for path, _ in elves if path.endswith("usr/bin/python3.11")]
        extensions = [path for path, _ in elves if "/opt/fiar/lib/" in f"/{path}" and path.endswith(".so")]
        assert python and extensions, (arch, len(elves))
        wrong = [(path, hex(machine)) for path, machine in elves if machine != ELF_MACHINE[arch]]
        assert not wrong, (arch, wrong[:5])


def test_one_architectures_image_is_cut_from_the_index_for_an_emulating_node(
    built: dict[str, images.Image], tmp_path: Path
) -> None:
    image = built["operator"]
    ref = f"{image.ref}-arm64"
    single = images.platform_archive(image.archive, "arm64", ref, tmp_path / "operator-arm64.tar")
    (only,) = images.read_index(single).items()
    assert only[0] == "arm64"
    with tarfile.open(single) as tar:
        index = tar.extractfile("index.json")
        assert index is not None
        assert ref.encode() in index.read()
