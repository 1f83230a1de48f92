"""Container images, built without Docker and without a registry (``devcluster build --images``).

    base          Debian bookworm with python3 and venv (mmdebstrap), one per architecture, imported into buildah
    operator      the Dockerfile's ``operator`` target, FROM that base (build arg PYTHON_BASE)
    agent-sim     the Dockerfile's ``agent-sim`` target (the agent on simulated hosts, no CUDA)
    vllm-standin  the base plus ``standin/vllm`` and ``standin/sglang``: each prints its argv and env, then waits
    pause         ``pause/main.go`` built static: the sandbox image of every pod
    agent         the Dockerfile's ``agent`` target (CUDA from wheels), only on request (``--agent-image``)

``operator`` and ``agent-sim`` are built for every architecture of ``fiar_contract.IMAGE_ARCHITECTURES``
(``buildah build --platform linux/<arch>``; a foreign one runs under qemu through binfmt_misc,
``devcluster/binfmt.py``) and stored as one multi-architecture image: an OCI archive whose image is an
OCI index of one manifest per architecture (``buildah manifest push --all``), as a registry serves it
to each node. The stand-in and the pause image are test parts and built for this host only.

Each image is an OCI archive in ``<cache>/images``, named after a hash of everything it is built
from (for a Dockerfile target: the stages it uses, not the whole Dockerfile), so a warm run builds
nothing; containerd imports the archives (``ctr images import``; ``platform_archive`` cuts one
architecture's manifest out of an index, for a node that runs a foreign architecture under
emulation). buildah runs with chroot isolation and the vfs driver (no daemon, no overlay inside
overlay), its storage under the cache. pip inside the build trusts the host's CA bundle, handed in
as a build secret (never stored in a layer). The real ``agent`` image (multi-GB) is built only by
``build_agent_image``, never for the tests; the build runs its probe inside it (no GPU here: a clean
"degraded, 0 GPUs" report) and imports its GPU stack.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fiar_contract as contract
from devcluster import binfmt, build

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

REQUIRED_TOOLS = ("mmdebstrap", "buildah", "go", "arch-test")
"""arch-test: mmdebstrap's check that a foreign architecture runs (under qemu) before it bootstraps one."""

ARCHITECTURES: tuple[str, ...] = contract.IMAGE_ARCHITECTURES
"""Every architecture ``operator`` and ``agent-sim`` are built for (one multi-architecture image each)."""


class ImageBuildError(RuntimeError):
    """An image could not be built; the message names the step and carries its output."""


@dataclass(frozen=True)
class Image:
    name: str
    key: str
    archive: Path
    build_seconds: float | None = None  # None: taken from the cache
    architectures: tuple[str, ...] = ()
    """The architectures of a multi-architecture image (its archive holds an OCI index); () for this host's only."""

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


def base_key(arch: str | None = None) -> str:
    return content_key("mmdebstrap", "minbase", DEBIAN_SUITE, arch or binfmt.host_arch(), *BASE_PACKAGES)


def dockerfile_stages(text: str) -> tuple[str, dict[str, str]]:
    """The Dockerfile's global part (before the first FROM) and each stage's instructions by its name.

    Comments and blank lines are left out, so that only what a build runs counts.
    """
    preamble: list[str] = []
    stages: dict[str, list[str]] = {}
    current = preamble
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if words[0].upper() == "FROM":
            name = words[3] if len(words) >= 4 and words[2].upper() == "AS" else str(len(stages))
            current = stages.setdefault(name, [])
        current.append(line)
    return "\n".join(preamble), {name: "\n".join(lines) for name, lines in stages.items()}


def stages_used(target: str, stages: dict[str, str]) -> list[str]:
    """``target`` and every stage it is built FROM or copies from, transitively, in the Dockerfile's order."""
    if target not in stages:
        raise ImageBuildError(f"the Dockerfile has no stage {target!r}")
    used: set[str] = set()
    todo = [target]
    while todo:
        name = todo.pop()
        if name in used:
            continue
        used.add(name)
        for line in stages[name].splitlines():
            words = line.split()
            if words[0].upper() == "FROM" and len(words) > 1 and words[1] in stages:
                todo.append(words[1])
            # COPY --from=NAME and RUN --mount=...,from=NAME
            parts = [part for word in words for part in word.split(",")]
            sources = [part.split("=", 1)[1] for part in parts if part.startswith(("--from=", "from="))]
            todo += [source for source in sources if source in stages]
    return [name for name in stages if name in used]


def dockerfile_key(target: str, dockerfile: str | None = None, architectures: tuple[str, ...] = ARCHITECTURES) -> str:
    """The key of one target: the stages it uses (not the whole Dockerfile), the bases and the build context."""
    text = dockerfile if dockerfile is not None else (ROOT / "Dockerfile").read_text()
    preamble, stages = dockerfile_stages(text)
    used = [f"{name}\n{stages[name]}" for name in stages_used(target, stages)]
    bases = [f"{arch}={base_key(arch)}" for arch in architectures]
    return content_key(*bases, preamble, *used, target, "index", paths=tuple(ROOT / p for p in DOCKERFILE_CONTEXT))


AGENT_NAME = "localhost/fiar-agent"
AGENT_BUILD_ARGS = {"PREBUILD_ARCH": ""}
"""The agent image built here prebuilds no kernels (the Dockerfile's default prebuilds for sm_90a and
sm_100a): on this machine's two shared cores that build would take far longer than the image. Each node
compiles its own architecture's comm modules at its first probe, into the chart's kernel cache."""


AGENT_IMPORTS = (
    "import torch, flashinfer, cuda.bindings, pynvml; "
    "print('torch', torch.__version__, 'cuda', torch.version.cuda, 'flashinfer', flashinfer.__version__, "
    "'cuda-bindings', getattr(cuda.bindings, '__version__', '?'))"
)
"""Run in each architecture's agent image (a foreign one under qemu): the GPU stack imports without a GPU."""


def agent_key(architectures: tuple[str, ...]) -> str:
    args = [f"{k}={v}" for k, v in sorted(AGENT_BUILD_ARGS.items())]
    return content_key(dockerfile_key("agent", architectures=architectures), *args)


def agent_image(architectures: tuple[str, ...] | None = None) -> Image:
    """The real (CUDA) agent image: built only on request (``devcluster build --agent-image``), multi-GB."""
    archs = architectures or (binfmt.host_arch(),)
    key = agent_key(archs)
    return Image(AGENT_NAME, key, cache_dir() / f"agent-{key}.tar", architectures=archs)


def standin_key() -> str:
    return content_key(base_key(), paths=(HERE / "standin",))


def pause_key() -> str:
    go = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    return content_key(go, paths=(HERE / "pause",))


def planned() -> dict[str, Image]:
    """Every image with its key and archive path; nothing is built."""
    out = cache_dir()
    images = {
        t: Image(n, dockerfile_key(t), out / f"{t}-{dockerfile_key(t)}.tar", architectures=ARCHITECTURES)
        for t, n in DOCKERFILE_IMAGES.items()
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

    def base(self, arch: str | None = None) -> str:
        arch = arch or binfmt.host_arch()
        key = base_key(arch)
        ref = f"{BASE_NAME}:{key}"
        if self.has_image(ref):
            return ref
        tar = self.dir / f"base-{key}.tar"
        if not tar.is_file():
            start = time.monotonic()
            self.log(f"base image ({arch}): mmdebstrap {DEBIAN_SUITE} with {', '.join(BASE_PACKAGES)}...")
            partial = tar.with_name(f"base-{key}.partial.tar")  # mmdebstrap picks the format by the suffix
            _run(
                [
                    "mmdebstrap",
                    "--quiet",
                    "--variant=minbase",
                    f"--architectures={arch}",
                    f"--include={','.join(BASE_PACKAGES)}",
                    DEBIAN_SUITE,
                    str(partial),
                ],
                timeout=1800,
            )
            partial.replace(tar)
            self.log(f"base image ({arch}): debootstrapped in {time.monotonic() - start:.0f}s ({_mb(tar)} MB)")
        start = time.monotonic()
        container = self.buildah("from", "scratch").strip()
        try:
            self.buildah("add", container, str(tar), "/")
            self.buildah(
                "config",
                "--os",
                "linux",
                "--arch",
                arch,
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

    def dockerfile_target(
        self,
        target: str,
        image: Image,
        build_args: dict[str, str] | None = None,
        check: Callable[[str, str], None] | None = None,
    ) -> None:
        """One build per architecture, then one OCI index of them all, pushed into the archive.

        ``check(arch, ref)`` runs on each architecture's image before it is stored.
        """
        refs = []
        for arch in image.architectures:
            start = time.monotonic()
            ref = f"{image.ref}-{arch}"
            if self.has_image(ref):  # built by an interrupted run
                refs.append(ref)
                continue
            args = ["build", "--isolation", "chroot", "--pull=never", "--platform", f"linux/{arch}"]
            args += ["--target", target, "--build-arg", f"PYTHON_BASE={self.base(arch)}"]
            for name, value in (build_args or {}).items():
                args += ["--build-arg", f"{name}={value}"]
            args += ["-t", ref, "-f", str(ROOT / "Dockerfile")]
            ca = host_ca_bundle()
            if ca is not None:
                args += ["--secret", f"id=ca-bundle,src={ca}"]
            self.buildah(*args, str(ROOT), timeout=3600)
            refs.append(ref)
            self.log(f"image {target} ({arch}): built in {time.monotonic() - start:.0f}s")
        for arch, ref in zip(image.architectures, refs, strict=True):
            if check is not None:
                check(arch, ref)
        with contextlib.suppress(ImageBuildError):
            self.buildah("manifest", "rm", image.ref)
        self.buildah("manifest", "create", image.ref)
        for arch, ref in zip(image.architectures, refs, strict=True):
            self.buildah("manifest", "add", "--os", "linux", "--arch", arch, image.ref, ref)
        partial = image.archive.with_name(image.archive.name + ".partial")
        partial.unlink(missing_ok=True)
        push = ["manifest", "push", "--all", "--quiet", image.ref, f"oci-archive:{partial}:{image.ref}"]
        self.buildah(*push, timeout=3600)
        partial.replace(image.archive)
        self.buildah("manifest", "rm", image.ref)
        for ref in refs:
            self.buildah("rmi", ref)

    def agent_check(self, arch: str, ref: str) -> AgentCheck:
        """The agent image's unpacked size and its ``fiar-agent probe --json`` run inside it (no GPU here)."""
        container = self.buildah("from", "--pull=never", ref).strip()
        try:
            mount = self.buildah("mount", container).strip()
            unpacked = int(_run(["du", "-sb", "-x", mount], timeout=600).split()[0])
            argv = ["buildah", "--root", str(self.storage / "root"), "--runroot", str(self.storage / "runroot")]
            argv += ["--storage-driver", "vfs", "run", "--isolation", "chroot", container, "--"]
            run: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 1800}
            start = time.monotonic()
            proc = subprocess.run([*argv, "tini", "--", "fiar-agent", "probe", "--json"], **run)
            seconds = time.monotonic() - start
            imports = subprocess.run([*argv, "python", "-c", AGENT_IMPORTS], **run)
        finally:
            self.buildah("rm", container)
        try:
            report = json.loads(proc.stdout)
        except ValueError as exc:
            why = f"exit {proc.returncode}: {proc.stderr[-2000:]}"
            raise ImageBuildError(f"agent ({arch}): the probe printed no report ({why})") from exc
        if imports.returncode != 0:  # a foreign architecture too: its qemu is one that runs torch (binfmt.QEMU_MIN)
            raise ImageBuildError(f"agent ({arch}): {AGENT_IMPORTS!r} failed: {imports.stderr[-2000:]}")
        result = AgentCheck(arch, unpacked, proc.returncode, report, seconds, imports.stdout.strip())
        self.log(f"image agent ({arch}): {unpacked / 1e9:.2f} GB unpacked; {result.summary()}")
        return result

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


@dataclass(frozen=True)
class AgentCheck:
    """What the agent image's own probe said on a host without a GPU."""

    arch: str
    unpacked_bytes: int
    exit_code: int
    report: dict[str, Any]
    seconds: float
    versions: str = ""
    """What ``AGENT_IMPORTS`` printed: the versions of torch, FlashInfer, cuda-bindings and NVML's bindings."""

    def summary(self) -> str:
        labels = self.report.get("labels", {})
        return (
            f"probe exit {self.exit_code}, status {self.report.get('status')}, "
            f"{contract.LABEL_GPUS}={labels.get(contract.LABEL_GPUS)}, "
            f"{contract.LABEL_BACKEND} {labels.get(contract.LABEL_BACKEND, 'absent')}, "
            f"first reason: {(self.report.get('reasons') or ['-'])[0]} ({self.seconds:.1f}s); {self.versions}"
        )


def build_agent_image(
    log: Log | None = None, architectures: tuple[str, ...] | None = None
) -> tuple[Image, list[AgentCheck]]:
    """Build the real agent image (cached like the others) and run its probe inside it, per architecture."""
    log = log or build.TextLog()
    missing = missing_tools()
    if missing:
        raise ImageBuildError(f"missing image tool(s): {', '.join(missing)}")
    image = agent_image(architectures)
    for arch in image.architectures:
        try:
            binfmt.ensure(arch)
        except binfmt.BinfmtError as exc:
            raise ImageBuildError(f"cannot build {arch} images here: {exc}") from exc
    checks: list[AgentCheck] = []
    if image.archive.is_file():
        return image, checks
    with _locked(cache_dir()):
        builder = Builder(log)
        start = time.monotonic()
        log(f"image agent: building {image.ref} for {', '.join(image.architectures)} (multi-GB)...")
        builder.dockerfile_target(
            "agent", image, AGENT_BUILD_ARGS, check=lambda arch, ref: checks.append(builder.agent_check(arch, ref))
        )
        seconds = time.monotonic() - start
        image = Image(image.name, image.key, image.archive, seconds, image.architectures)
        log(f"image agent: built in {seconds:.0f}s, {_mb(image.archive)} MB archive (gzip layers)")
        _prune("agent", image.archive)
    return image, checks


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
            f"missing image tool(s): {', '.join(missing)} (Debian: apt-get install mmdebstrap arch-test buildah golang)"
        )
    images = planned()
    for arch in ARCHITECTURES:
        try:
            binfmt.ensure(arch)
        except binfmt.BinfmtError as exc:
            raise ImageBuildError(f"cannot build {arch} images here: {exc}") from exc
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
            images[name] = Image(image.name, image.key, image.archive, seconds, image.architectures)
            log(f"image {name}: built in {seconds:.0f}s, {_mb(image.archive)} MB")
            _prune(name, image.archive)
    return images


KEEP_ARCHIVES = 3
"""Archives kept per image (the newest): other branches' images stay, the cache stays bounded."""


def _prune(name: str, current: Path) -> None:
    """Remove all but the newest ``KEEP_ARCHIVES`` archives of ``name`` (``agent`` never counts ``agent-sim``'s)."""
    pattern = re.compile(rf"{re.escape(name)}-[^-]+\.tar")  # a key has no dash: agent-sim-KEY is not agent's
    archives = [p for p in current.parent.glob(f"{name}-*.tar") if pattern.fullmatch(p.name)]
    archives.sort(key=lambda p: p.stat().st_mtime, reverse=True)
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


# -- reading archives -------------------------------------------------------------------------------
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    algo, _, hexdigest = digest.partition(":")
    member = tar.extractfile(f"blobs/{algo}/{hexdigest}")
    if member is None:
        raise ImageBuildError(f"blob {digest} missing from the archive")
    return member.read()


def read_index(archive: Path) -> dict[str, dict[str, Any]]:
    """The manifests of an OCI archive's image by architecture, as its own blobs say.

    Each entry: ``descriptor`` (the index's, with its platform), ``manifest`` and ``config`` (the image
    config, whose ``architecture`` and ``os`` the runtime checks). A single-manifest archive gives one entry.
    """
    with tarfile.open(archive) as tar:
        top = json.loads(_read(tar, "index.json"))["manifests"][0]
        if top.get("mediaType") in INDEX_TYPES:
            descriptors = json.loads(_blob(tar, top["digest"]))["manifests"]
        else:
            descriptors = [top]
        out: dict[str, dict[str, Any]] = {}
        for desc in descriptors:
            manifest = json.loads(_blob(tar, desc["digest"]))
            config = json.loads(_blob(tar, manifest["config"]["digest"]))
            out[config["architecture"]] = {"descriptor": desc, "manifest": manifest, "config": config}
        return out


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    if member is None:
        raise ImageBuildError(f"{name} missing from the archive")
    return member.read()


def platform_archive(archive: Path, arch: str, ref: str, dest: Path) -> Path:
    """An OCI archive of one architecture's manifest of a multi-architecture ``archive``, named ``ref``.

    containerd resolves an index by its own platform; a node that runs ``arch`` under emulation
    imports this one instead (a single manifest is run whatever its architecture).
    """
    entry = read_index(archive).get(arch)
    if entry is None:
        raise ImageBuildError(f"{archive.name} has no {arch} image")
    desc = {k: v for k, v in entry["descriptor"].items() if k in ("mediaType", "digest", "size")}
    desc["annotations"] = {"org.opencontainers.image.ref.name": ref}
    wanted = {entry["manifest"]["config"]["digest"], desc["digest"]} | {
        layer["digest"] for layer in entry["manifest"]["layers"]
    }
    partial = dest.with_name(dest.name + ".partial")
    with tarfile.open(archive) as src, tarfile.open(partial, "w") as out:
        for name, data in (
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", json.dumps({"schemaVersion": 2, "manifests": [desc]}).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
        for member in src.getmembers():
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 3 and parts[0] == "blobs" and f"{parts[1]}:{parts[2]}" in wanted:
                out.addfile(member, src.extractfile(member))
    partial.replace(dest)
    return dest
