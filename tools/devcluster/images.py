"""Container images for the real node of tier D, built without Docker and without a registry.

    base          Debian bookworm with python3 and venv (mmdebstrap), imported into buildah
    operator      the Dockerfile's ``operator`` target, FROM that base (build arg PYTHON_BASE)
    agent-sim     the Dockerfile's ``agent-sim`` target (the agent on simulated hosts, no CUDA)
    vllm-standin  the base plus ``standin/vllm`` and ``standin/sglang``: each prints its argv and env, then waits
    pause         ``pause/main.go`` built static: the sandbox image of every pod

Each image is an uncompressed OCI archive in ``<cache>/images``, named after a hash of everything it
is built from, so a warm run builds nothing; containerd imports the archives (``ctr images
import``). buildah runs with chroot isolation and the vfs driver (no daemon, no overlay inside
overlay), its storage under the cache. pip inside the build trusts the host's CA bundle, handed in
as a build secret (never stored in a layer). The CUDA ``agent`` target cannot be built here.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from devcluster import build

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

DEBIAN_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
BASE_NAME = "localhost/fiar-debian-python"

DOCKERFILE_CONTEXT = (
    "pyproject.toml",
    "README.md",
    "fiar_contract.py",
    "fiar_kube",
    "operator",
    "node_agent",
    "kubectl_fiar",
)
"""What the Dockerfile copies into its images (besides the Dockerfile itself)."""

DOCKERFILE_IMAGES = {"operator": "localhost/fiar-operator", "agent-sim": "localhost/fiar-agent-sim"}
STANDIN_NAME = "localhost/fiar-vllm-standin"
PAUSE_NAME = "localhost/fiar-pause"

REQUIRED_TOOLS = ("mmdebstrap", "buildah", "go")


class ImageBuildError(RuntimeError):
    """An image could not be built; the message names the step and carries its output."""


@dataclass(frozen=True)
class Image:
    name: str
    key: str
    archive: Path
    build_seconds: float | None = None  # None: taken from the cache

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.key}"

    @property
    def size_bytes(self) -> int:
        return self.archive.stat().st_size


Log = Callable[[str], None]


def cache_dir() -> Path:
    return build.cache_root().parent / "images"


def missing_tools() -> list[str]:
    return [t for t in REQUIRED_TOOLS if shutil.which(t) is None]


def host_ca_bundle() -> Path | None:
    """The CA bundle this host trusts (pip's, then OpenSSL's): a TLS-intercepting proxy's CA is in it."""
    paths = ssl.get_default_verify_paths()
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        os.environ.get("REQUESTS_CA_BUNDLE"),
        paths.cafile,
        paths.openssl_cafile,
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


# -- content keys ---------------------------------------------------------------------------------
def _files(paths: tuple[Path, ...]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            for sub in sorted(path.rglob("*")):
                if sub.is_file() and not any(p in ("__pycache__",) or p.endswith(".egg-info") for p in sub.parts):
                    yield sub
        else:
            yield path


def content_key(*parts: str, paths: tuple[Path, ...] = ()) -> str:
    """A short hash of ``parts`` and of the names and bytes of every file under ``paths``."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    for path in _files(paths):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def base_key() -> str:
    return content_key("mmdebstrap", "minbase", DEBIAN_SUITE, *BASE_PACKAGES)


def dockerfile_key(target: str) -> str:
    return content_key(base_key(), target, paths=(ROOT / "Dockerfile", *(ROOT / p for p in DOCKERFILE_CONTEXT)))


def standin_key() -> str:
    return content_key(base_key(), paths=(HERE / "standin",))


def pause_key() -> str:
    go = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    return content_key(go, paths=(HERE / "pause",))


def planned() -> dict[str, Image]:
    """Every image with its key and archive path; nothing is built."""
    out = cache_dir()
    images = {
        t: Image(n, dockerfile_key(t), out / f"{t}-{dockerfile_key(t)}.tar") for t, n in DOCKERFILE_IMAGES.items()
    }
    images["vllm-standin"] = Image(STANDIN_NAME, standin_key(), out / f"vllm-standin-{standin_key()}.tar")
    images["pause"] = Image(PAUSE_NAME, pause_key(), out / f"pause-{pause_key()}.tar")
    return images


def all_cached() -> bool:
    return all(image.archive.is_file() for image in planned().values())


# -- building -------------------------------------------------------------------------------------
class Builder:
    """buildah with its own storage under the cache; one build at a time (a file lock)."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.dir = cache_dir()
        self.storage = self.dir / "buildah"

    def buildah(self, *args: str, timeout: float = 1800) -> str:
        argv = [
            "buildah",
            "--root",
            str(self.storage / "root"),
            "--runroot",
            str(self.storage / "runroot"),
            "--storage-driver",
            "vfs",
            *args,
        ]
        return _run(argv, timeout=timeout)

    def has_image(self, ref: str) -> bool:
        try:
            self.buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref)
        except ImageBuildError:
            return False
        return True

    def export(self, ref: str, archive: Path) -> None:
        partial = archive.with_name(archive.name + ".partial")
        partial.unlink(missing_ok=True)
        self.buildah("push", "--quiet", "--disable-compression", ref, f"oci-archive:{partial}:{ref}")
        partial.replace(archive)
        # The archive is the cache; a vfs copy of each image would only double the disk it takes.
        self.buildah("rmi", ref)

    def base(self) -> str:
        key = base_key()
        ref = f"{BASE_NAME}:{key}"
        if self.has_image(ref):
            return ref
        tar = self.dir / f"base-{key}.tar"
        if not tar.is_file():
            start = time.monotonic()
            self.log(f"base image: mmdebstrap {DEBIAN_SUITE} with {', '.join(BASE_PACKAGES)} (about a minute)...")
            partial = tar.with_name(f"base-{key}.partial.tar")  # mmdebstrap picks the format by the suffix
            _run(
                [
                    "mmdebstrap",
                    "--quiet",
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    DEBIAN_SUITE,
                    str(partial),
                ],
                timeout=1800,
            )
            partial.replace(tar)
            self.log(f"base image: debootstrapped in {time.monotonic() - start:.0f}s ({_mb(tar)} MB)")
        start = time.monotonic()
        container = self.buildah("from", "scratch").strip()
        try:
            self.buildah("add", container, str(tar), "/")
            self.buildah(
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "python3",
                container,
            )
            self.buildah("commit", "--quiet", container, ref)
        finally:
            self.buildah("rm", container)
        self.log(f"base image: {ref} imported into buildah in {time.monotonic() - start:.0f}s")
        return ref

    def dockerfile_target(self, target: str, image: Image) -> None:
        base = self.base()
        args = ["build", "--isolation", "chroot", "--pull=never", "--target", target]
        args += ["--build-arg", f"PYTHON_BASE={base}", "-t", image.ref, "-f", str(ROOT / "Dockerfile")]
        ca = host_ca_bundle()
        if ca is not None:
            args += ["--secret", f"id=ca-bundle,src={ca}"]
        self.buildah(*args, str(ROOT))
        self.export(image.ref, image.archive)

    def standin(self, image: Image) -> None:
        container = self.buildah("from", "--pull=never", self.base()).strip()
        try:
            for program in ("vllm", "sglang"):
                source = str(HERE / "standin" / program)
                self.buildah("copy", "--chmod", "0755", container, source, f"/usr/local/bin/{program}")
            self.buildah("config", "--entrypoint", '["vllm"]', "--cmd", "serve", "--user", "65532:65532", container)
            self.buildah("commit", "--quiet", container, image.ref)
        finally:
            self.buildah("rm", container)
        self.export(image.ref, image.archive)

    def pause(self, image: Image) -> None:
        with tempfile.TemporaryDirectory(prefix="fiar-pause-") as tmp:
            binary = Path(tmp) / "pause"
            env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOWORK="off", GOFLAGS="-mod=readonly")
            _run(
                ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(binary), "."],
                cwd=HERE / "pause",
                env=env,
                timeout=600,
            )
            container = self.buildah("from", "scratch").strip()
            try:
                self.buildah("copy", "--chmod", "0755", container, str(binary), "/pause")
                self.buildah("config", "--entrypoint", '["/pause"]', "--user", "65535:65535", container)
                self.buildah("commit", "--quiet", container, image.ref)
            finally:
                self.buildah("rm", container)
        self.export(image.ref, image.archive)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_images(log: Log | None = None) -> dict[str, Image]:
    """Build what the cache lacks; return every image (with its build time when it was built now)."""
    log = log or build.TextLog()
    missing = missing_tools()
    if missing:
        raise ImageBuildError(
            f"missing image tool(s): {', '.join(missing)} (Debian: apt-get install mmdebstrap buildah golang)"
        )
    images = planned()
    with _locked(cache_dir()):
        builder = Builder(log)
        if any(not image.archive.is_file() for image in images.values()):
            builder.buildah("rm", "--all")  # working containers an interrupted build left behind
        steps: dict[str, Callable[[Image], None]] = {
            "operator": lambda img: builder.dockerfile_target("operator", img),
            "agent-sim": lambda img: builder.dockerfile_target("agent-sim", img),
            "vllm-standin": builder.standin,
            "pause": builder.pause,
        }
        for name, image in images.items():
            if image.archive.is_file():
                continue
            start = time.monotonic()
            log(f"image {name}: building {image.ref}...")
            steps[name](image)
            seconds = time.monotonic() - start
            images[name] = Image(image.name, image.key, image.archive, seconds)
            log(f"image {name}: built in {seconds:.0f}s, {_mb(image.archive)} MB")
            _prune(name, image.archive)
    return images


KEEP_ARCHIVES = 3
"""Archives kept per image (the newest): other branches' images stay, the cache stays bounded."""


def _prune(name: str, current: Path) -> None:
    archives = sorted(current.parent.glob(f"{name}-*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [a for a in archives if a != current][KEEP_ARCHIVES - 1 :]:
        old.unlink(missing_ok=True)


def _mb(path: Path) -> int:
    return round(path.stat().st_size / 1e6)


def _run(argv: list[str], *, timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(f"{' '.join(argv[:6])} ... timed out after {timeout:.0f}s") from exc
    if proc.returncode != 0:
        raise ImageBuildError(
            f"{' '.join(argv[:8])} ... exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout
