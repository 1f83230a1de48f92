"""Reading a multi-architecture OCI archive, and cutting one architecture's image out of it (pure).

The archive here is made by hand in the OCI image layout ``buildah manifest push --all`` writes; the
same functions read the real images in ``tests/realnode/test_images_hold_every_architecture.py``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from devcluster import images

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def oci_archive(path: Path, arches: tuple[str, ...], ref: str) -> Path:
    blobs: dict[str, bytes] = {}
    manifests = []
    for arch in arches:
        layer = _blob(blobs, f"layer of {arch}".encode())
        config = _blob(blobs, json.dumps({"architecture": arch, "os": "linux", "config": {}}).encode())
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": config, "layers": [layer]}
        desc = _blob(blobs, json.dumps(manifest).encode())
        manifests.append({"mediaType": MANIFEST, **desc, "platform": {"architecture": arch, "os": "linux"}})
    index = _blob(blobs, json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}).encode())
    top = {"schemaVersion": 2, "manifests": [{"mediaType": INDEX, **index, "annotations": {"ref": ref}}]}
    with tarfile.open(path, "w") as tar:
        files = {"oci-layout": b"{}", "index.json": json.dumps(top).encode()}
        files.update({f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()})
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_an_index_reads_as_one_image_per_architecture(tmp_path: Path) -> None:
    archive = oci_archive(tmp_path / "op.tar", ("amd64", "arm64"), "localhost/op:k")
    found = images.read_index(archive)
    assert list(found) == ["amd64", "arm64"]
    assert found["arm64"]["descriptor"]["platform"] == {"architecture": "arm64", "os": "linux"}


def test_one_architecture_is_cut_out_as_a_single_manifest_with_only_its_blobs(tmp_path: Path) -> None:
    archive = oci_archive(tmp_path / "op.tar", ("amd64", "arm64"), "localhost/op:k")
    single = images.platform_archive(archive, "arm64", "localhost/op:k-arm64", tmp_path / "op-arm64.tar")
    assert list(images.read_index(single)) == ["arm64"]
    with tarfile.open(single) as tar:
        names = tar.getnames()
        index_file = tar.extractfile("index.json")
        assert index_file is not None
        (top,) = json.loads(index_file.read())["manifests"]
    assert top["mediaType"] == MANIFEST
    assert top["annotations"] == {"org.opencontainers.image.ref.name": "localhost/op:k-arm64"}
    assert len([n for n in names if n.startswith("blobs/")]) == 3  # manifest, config, layer
    assert not (tmp_path / "op-arm64.tar.partial").exists()


def test_an_architecture_the_index_lacks_is_a_clear_error(tmp_path: Path) -> None:
    archive = oci_archive(tmp_path / "op.tar", ("amd64",), "localhost/op:k")
    with pytest.raises(images.ImageBuildError, match="has no arm64 image"):
        images.platform_archive(archive, "arm64", "localhost/op:k-arm64", tmp_path / "op-arm64.tar")
