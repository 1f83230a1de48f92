"""Build the local control-plane binaries from the pinned Go modules in tools/controlplane.

Each wrapper module (k8s, etcd, kwok, helm, kyverno) pins its tool through go.mod + go.sum. Binaries go to
a cache folder outside git, keyed by tool and version: ``<cache>/<tool>-<version>/<binary>``.
A binary that already exists is never rebuilt.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MODULES_DIR = Path(__file__).resolve().parents[1] / "controlplane"


class BuildError(RuntimeError):
    """A control-plane binary could not be built."""


@dataclass(frozen=True)
class Tool:
    name: str  # wrapper module folder
    module: str  # module whose version keys the cache
    packages: tuple[str, ...]  # main packages to build
    binaries: tuple[str, ...]  # resulting binary names
    realnode: bool = False  # needed only by tier D
    peer: bool = False  # a peer the benchmarks compare with: built only when named

    def version(self) -> str:
        gomod = (MODULES_DIR / self.name / "go.mod").read_text()
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(self.module)} (v\S+)", gomod, re.M)
        if match is None:
            raise BuildError(f"{self.name}/go.mod does not require {self.module}")
        return match.group(1)


TOOLS = (
    Tool(
        "k8s",
        "k8s.io/kubernetes",
        (
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "k8s.io/kubernetes/cmd/kubectl",
        ),
        ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
    ),
    # The real node of tier D, from the same wrapper module: built only for tier D (not for the demo).
    Tool("k8s", "k8s.io/kubernetes", ("k8s.io/kubernetes/cmd/kubelet",), ("kubelet",), realnode=True),
    Tool("etcd", "go.etcd.io/etcd/server/v3", ("go.etcd.io/etcd/server/v3",), ("etcd",)),
    Tool("kwok", "sigs.k8s.io/kwok", ("sigs.k8s.io/kwok/cmd/kwok",), ("kwok",)),
    Tool("helm", "helm.sh/helm/v3", ("helm.sh/helm/v3/cmd/helm",), ("helm",)),
    # Kyverno's admission controller, for bench/kyverno_compare.py: ``python -m devcluster build kyverno``.
    Tool("kyverno", "github.com/kyverno/kyverno", ("github.com/kyverno/kyverno/cmd/kyverno",), ("kyverno",), peer=True),
)


class TextLog:
    def __call__(self, msg: str) -> None:
        print(f"[controlplane] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    env = os.environ.get("FIAR_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fiar"
    return base / "controlplane"


def tool_dir(tool: Tool) -> Path:
    return cache_root() / f"{tool.name}-{tool.version()}"


def binary_path(binary: str) -> Path:
    """Path of a built binary (it may not exist yet)."""
    for tool in TOOLS:
        if binary in tool.binaries:
            return tool_dir(tool) / binary
    raise KeyError(binary)


def _ldflags(tool: Tool) -> str:
    flags = ["-s", "-w"]
    version = tool.version()
    if tool.name == "k8s":
        major, minor = version.lstrip("v").split(".")[:2]
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += [
                f"-X {pkg}.gitVersion={version}",
                f"-X {pkg}.gitMajor={major}",
                f"-X {pkg}.gitMinor={minor}",
                f"-X {pkg}.gitTreeState=clean",
            ]
    elif tool.name == "helm":
        flags.append(f"-X helm.sh/helm/v3/internal/version.version={version}")
    elif tool.name == "kyverno":
        flags.append(f"-X github.com/kyverno/kyverno/pkg/version.BuildVersion={version}")
    return " ".join(flags)


KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


def kwok_stages_path() -> Path:
    """kwok's "fast" Stage set (node init + lease heartbeat, pod ready/complete/delete)."""
    kwok = next(t for t in TOOLS if t.name == "kwok")
    return tool_dir(kwok) / "stages.yaml"


def _write_kwok_stages(log: TextLog) -> None:
    """Copy the Stage manifests out of the pinned kwok module: kwok >= 0.8 runs none by default."""
    target = kwok_stages_path()
    if target.is_file():
        return
    env = dict(os.environ, GOTOOLCHAIN="local", GOWORK="off", GOFLAGS="-mod=readonly")
    proc = subprocess.run(
        ["go", "mod", "download", "-json", "sigs.k8s.io/kwok"],
        cwd=MODULES_DIR / "kwok",
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"cannot locate the kwok module source: {proc.stderr[-2000:]}")
    stage_dir = Path(json.loads(proc.stdout)["Dir"]) / "kustomize" / "stage"
    docs = [(stage_dir / rel).read_text().strip() for rel in KWOK_STAGES]
    target.write_text("\n---\n".join(docs) + "\n")
    log(f"kwok stages written to {target}")


def require_tools() -> None:
    missing = [t for t in ("go", "git") if shutil.which(t) is None]
    if missing:
        raise BuildError(
            f"missing required tool(s): {', '.join(missing)}. Install Go >= 1.26 and git "
            "(e.g. 'apt-get install golang git') and retry."
        )


def _go_binary_name(package: str) -> str:
    """The file name ``go build -o dir/`` gives a main package (a major-version suffix is skipped)."""
    parts = package.split("/")
    if len(parts) > 1 and re.fullmatch(r"v[0-9]+", parts[-1]):
        return parts[-2]
    return parts[-1]


def build_tool(tool: Tool, log: TextLog) -> None:
    out = tool_dir(tool)
    todo = [b for b in tool.binaries if not (out / b).is_file()]
    if not todo:
        log(f"{tool.name} {tool.version()}: cached in {out}")
        return
    require_tools()
    out.mkdir(parents=True, exist_ok=True)
    # A folder of this build's own: two builds of one tool at once (two checkouts sharing the cache)
    # each write their own, and the last rename wins with an identical binary.
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=out))
    env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOWORK="off", GOFLAGS="-mod=readonly")
    log(f"{tool.name} {tool.version()}: building {', '.join(todo)} (cold builds take minutes)...")
    start = time.monotonic()
    packages = [p for p, b in zip(tool.packages, tool.binaries, strict=True) if b in todo]
    cmd = ["go", "build", "-trimpath", "-ldflags", _ldflags(tool), "-o", f"{tmp}/", *packages]
    proc = subprocess.run(cmd, cwd=MODULES_DIR / tool.name, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(f"building {tool.name} failed:\n{proc.stderr[-4000:]}")
    for binary, pkg in zip(tool.binaries, tool.packages, strict=True):
        if binary not in todo:
            continue
        built = tmp / _go_binary_name(pkg)
        if not built.exists():
            candidates = sorted(p.name for p in tmp.iterdir())
            raise BuildError(f"{tool.name}: expected {built.name} in {tmp}, found {candidates}")
        built.replace(out / binary)
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"{tool.name} {tool.version()}: built in {time.monotonic() - start:.0f}s")


def selected(only: list[str] | None = None, realnode: bool = False) -> list[Tool]:
    """The tools ``build_all`` builds: those named (all of tiers A-C when none is), the kubelet of tier
    D only with ``realnode``, and a peer only when named."""
    return [
        tool
        for tool in TOOLS
        if not ((only and tool.name not in only) or (tool.realnode and not realnode) or (tool.peer and not only))
    ]


def build_all(only: list[str] | None = None, realnode: bool = False) -> dict[str, Path]:
    """Build what the cache lacks: tiers A-C, with ``realnode`` the kubelet of tier D too, and a
    peer (Kyverno) only when ``only`` names it."""
    log = TextLog()
    start = time.monotonic()
    built: dict[str, Path] = {}
    for tool in selected(only, realnode):
        build_tool(tool, log)
        if tool.name == "kwok" and not tool.realnode:
            _write_kwok_stages(log)
        built.update({b: tool_dir(tool) / b for b in tool.binaries})
    log(f"all binaries ready in {cache_root()} ({time.monotonic() - start:.0f}s)")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("tools", nargs="*", help="subset of: " + ", ".join(t.name for t in TOOLS))
    parser.add_argument("--realnode", action="store_true", help="also the kubelet of tier D")
    args = parser.parse_args(argv)
    try:
        build_all(args.tools or None, realnode=args.realnode)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
