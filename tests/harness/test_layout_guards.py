"""The source layout never shadows the standard library, both console scripts exist, and the shared
top-level modules are packaged, copied into the images, and keep the two packages apart."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_operator_folder_is_not_a_package() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists(), "operator/__init__.py shadows the stdlib 'operator'"


def test_no_tests_operator_folder() -> None:
    assert not (ROOT / "tests" / "operator").exists(), "tests/operator/ shadows the stdlib 'operator' under pytest"


def test_stdlib_operator_resolves_to_the_standard_library() -> None:
    spec = importlib.util.find_spec("operator")
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve().is_relative_to(Path(sysconfig.get_paths()["stdlib"]).resolve())


def test_asyncio_imports_from_the_repository_root() -> None:
    proc = subprocess.run([sys.executable, "-c", "import asyncio, operator; operator.eq"], cwd=ROOT,
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", ["fiar-operator", "fiar-agent", "kubectl-fiar"])
def test_console_script_answers_help(script: str) -> None:
    exe = Path(sys.executable).parent / script
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"usage: {script.replace('-', ' ', 1) if script.startswith('kubectl-') else script}" in proc.stdout


@pytest.mark.parametrize("package", ["fiar_operator", "node_agent", "kubectl_fiar"])
def test_packages_import_from_their_source_folders(package: str) -> None:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve().is_relative_to(ROOT)


def _py_modules() -> list[str]:
    found = re.search(r"^py-modules = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert found, "pyproject.toml names its top-level modules in py-modules"
    return re.findall(r'"([^"]+)"', found.group(1))


SHARED_PACKAGES = ("fiar_kube",)
"""Shared by both components like the modules of py-modules, as packages (found by setuptools)."""


def test_shared_modules_are_packaged_and_copied_into_every_image() -> None:
    from devcluster import images

    modules = _py_modules()
    assert "fiar_contract" in modules
    copies = re.findall(r"^COPY pyproject\.toml (.*) \./$", (ROOT / "Dockerfile").read_text(), re.M)
    assert len(copies) == 2, "the operator and agent build stages each copy the sources"
    for module in modules:
        assert all(f"{module}.py" in line.split() for line in copies), f"{module}.py missing from a COPY line"
        assert f"{module}.py" in images.DOCKERFILE_CONTEXT, f"{module}.py missing from the image cache key"
    include = re.search(r"^include = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert include
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in SHARED_PACKAGES:
        assert (ROOT / package / "__init__.py").is_file()
        assert f'"{package}*"' in include.group(1), f"{package} missing from the packages setuptools finds"
        assert dockerfile.count(f"COPY {package} ./{package}\n") == 2, f"{package} missing from a build stage"
        assert package in images.DOCKERFILE_CONTEXT, f"{package} missing from the image cache key"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("operator/fiar_operator", "node_agent"),
        ("node_agent", "fiar_operator"),
        ("operator/fiar_operator", "kubectl_fiar"),
        ("node_agent", "kubectl_fiar"),
    ],
)
def test_neither_package_imports_the_other(folder: str, forbidden: str) -> None:
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*.py") if forbidden in _imports(p)]
    assert not offenders


def _shared_files(name: str) -> list[Path]:
    return sorted((ROOT / name).rglob("*.py")) if (ROOT / name).is_dir() else [ROOT / f"{name}.py"]


@pytest.mark.parametrize("module", ["fiar_contract", *SHARED_PACKAGES])
def test_shared_modules_import_none_of_the_components(module: str) -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in _shared_files(module)
        if {"fiar_operator", "node_agent", "kubectl_fiar", "devcluster"} & _imports(p)
    ]
    assert not offenders


KUBE_SEAM = ROOT / "fiar_kube"
KUBE_SEAM_ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "backoff": set(),
    "deadline": set(),
    "proxy": set(),
    "pem": set(),
    "watch": {"errors"},
    "tls": {"pem"},
    "http1": {"deadline", "errors"},
    "credentials": set(),
    "kubeconfig": {"credentials", "errors", "pem"},
    "pool": {"deadline", "errors", "proxy", "tls"},
    "lane": {"deadline", "errors", "http1", "proxy", "tls"},
    "client": {"credentials", "deadline", "errors", "http1", "lane", "pool", "watch"},
    "__init__": {"backoff", "client", "credentials", "deadline", "errors", "http1", "kubeconfig", "lane"}
    | {"pool", "proxy", "tls", "watch"},
}
"""What each module of the seam may import of the others: the plain parts (errors, backoff, time limits,
the proxy rule, the watch line splitter, PEM in memory) import none or only errors; the transports
import those; the client composes them; ``__init__`` re-exports the public names."""


def _seam_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found |= {alias.name for alias in node.names}
            elif node.module and node.module.startswith("fiar_kube."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("fiar_kube.")}
    return found


def test_every_module_of_the_seam_has_its_imports_listed() -> None:
    assert {p.stem for p in KUBE_SEAM.glob("*.py")} == set(KUBE_SEAM_ALLOWED)


@pytest.mark.parametrize("module", sorted(KUBE_SEAM_ALLOWED))
def test_the_seams_modules_import_one_way(module: str) -> None:
    wrong = _seam_imports(KUBE_SEAM / f"{module}.py") - KUBE_SEAM_ALLOWED[module]
    assert not wrong, f"fiar_kube.{module} may import only {sorted(KUBE_SEAM_ALLOWED[module])} of the seam"


def test_the_reading_of_the_seams_imports_sees_them() -> None:
    """The check above would pass on a reader that sees nothing: it sees the client's imports."""
    assert _seam_imports(KUBE_SEAM / "client.py") >= {"lane", "pool", "errors"}


def test_the_kubectl_plugin_imports_only_the_shared_modules() -> None:
    """kubectl fiar reads what the agent and the operator write through the contract, never their code."""
    found = set().union(*(_imports(p) for p in (ROOT / "kubectl_fiar").rglob("*.py")))
    assert not {"fiar_operator", "node_agent", "devcluster"} & found
