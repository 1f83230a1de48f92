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


def test_shared_modules_are_packaged_and_copied_into_every_image() -> None:
    from devcluster import images

    modules = _py_modules()
    assert {"fiar_contract", "fiar_kube"} <= set(modules)
    copies = re.findall(r"^COPY pyproject\.toml (.*) \./$", (ROOT / "Dockerfile").read_text(), re.M)
    assert len(copies) == 2, "the operator and agent build stages each copy the sources"
    for module in modules:
        assert all(f"{module}.py" in line.split() for line in copies), f"{module}.py missing from a COPY line"
        assert f"{module}.py" in images.DOCKERFILE_CONTEXT, f"{module}.py missing from the image cache key"


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


@pytest.mark.parametrize("module", ["fiar_contract", "fiar_kube"])
def test_shared_modules_import_neither_package(module: str) -> None:
    assert not {"fiar_operator", "node_agent"} & _imports(ROOT / f"{module}.py")


def test_the_kubectl_plugin_imports_only_the_shared_modules() -> None:
    """kubectl fiar reads what the agent and the operator write through the contract, never their code."""
    found = set().union(*(_imports(p) for p in (ROOT / "kubectl_fiar").rglob("*.py")))
    assert not {"fiar_operator", "node_agent", "devcluster"} & found
