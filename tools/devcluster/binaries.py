"""Run the pinned helm and kubectl binaries (tests, demo and benchmarks share these)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from devcluster import build


def kubernetes_version() -> str:
    return next(t for t in build.TOOLS if t.name == "k8s").version()


def run(
    argv: Sequence[str], *, check: bool = True, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, input=stdin, timeout=timeout)
    if check and proc.returncode != 0:
        shown = " ".join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv[:4]))
        raise RuntimeError(f"{shown} ... exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def helm(*args: str, kubeconfig: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [str(build.binary_path("helm")), *args]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    return run(argv, check=check)


def kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return run([str(build.binary_path("kubectl")), "--kubeconfig", str(kubeconfig), *args], stdin=stdin, check=check)


def set_args(values: Mapping[str, Any]) -> list[str]:
    """``--set``/``--set-string`` arguments: strings stay strings, numbers and booleans are typed, lists and
    maps go whole (``--set-json``)."""
    out: list[str] = []
    for key, value in values.items():
        if isinstance(value, (list, dict)):
            out += ["--set-json", f"{key}={json.dumps(value)}"]
        elif isinstance(value, str):
            out += ["--set-string", f"{key}={value}"]
        else:
            out += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return out


def render(
    chart: Path,
    values: Mapping[str, Any] | None = None,
    namespace: str = "fiar-system",
    release: str = "fiar",
    include_crds: bool = False,
) -> list[dict[str, Any]]:
    """``helm template`` for the pinned Kubernetes version, parsed into documents (with the chart's
    crds/ folder first when ``include_crds``)."""
    proc = helm(
        "template",
        release,
        str(chart),
        "--namespace",
        namespace,
        "--kube-version",
        kubernetes_version(),
        *(["--include-crds"] if include_crds else []),
        *set_args(values or {}),
    )
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
