"""The source layout never shadows the standard library, and both console scripts exist."""

from __future__ import annotations

import importlib.util
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


@pytest.mark.parametrize("script", ["fiar-operator", "fiar-agent"])
def test_console_script_answers_help(script: str) -> None:
    exe = Path(sys.executable).parent / script
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"usage: {script}" in proc.stdout


@pytest.mark.parametrize("package", ["fiar_operator", "node_agent"])
def test_packages_import_from_their_source_folders(package: str) -> None:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve().is_relative_to(ROOT)
