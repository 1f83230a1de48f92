"""``bench/engine_release.py`` qualifies a release from cached wheels, with no network: 0.33.0 and 0.34.0
match their reviewed lists, and 0.34.0 against 0.33.0's list names every new caller and fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
WHEELS = Path(os.environ.get("FIAR_WHEEL_CACHE", Path.home() / ".cache" / "fiar" / "wheels"))
NEEDED = ("vllm-0.33.0-", "vllm-0.34.0-", "flashinfer_python-0.7.2.post1-", "flashinfer_python-0.7.4-")


def _cold() -> list[str]:
    return [n for n in NEEDED if not any(WHEELS.glob(f"{n}*.whl"))]


pytestmark = pytest.mark.skipif(
    bool(_cold()),
    reason=f"wheel cache {WHEELS} is cold (missing {', '.join(_cold())}): "
    "run bench/engine_release.py vllm 0.34.0 once with the network",
)


def qualify(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    # No proxy and no index: a download attempt would fail, so a pass proves the cache was enough.
    env = {**os.environ, "PIP_NO_INDEX": "1", "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    command = [sys.executable, str(ROOT / "bench" / "engine_release.py"), *args, "--scan-only", "--offline"]
    return subprocess.run(
        [*command, "--out", str(tmp)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_a_qualified_release_has_no_caller_outside_its_reviewed_list(version: str, tmp_path: Path) -> None:
    proc = qualify("vllm", version, tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NEW CALLER" not in proc.stdout
    assert f"reviewed list compared: vllm-{version}.txt" in proc.stdout


def test_the_new_callers_of_0_34_are_named_and_fail_the_command(tmp_path: Path) -> None:
    proc = qualify("vllm", "0.34.0", "--against", "0.33.0", tmp=tmp_path)
    assert proc.returncode == 1
    new = {line.split(": ", 1)[1] for line in proc.stdout.splitlines() if "NEW CALLER" in line}
    assert {
        "vllm/models/qwen3_5/nvidia/model.py",
        "vllm/models/qwen3_5/nvidia/ops/fused_allreduce_norm_quant.py",
        "vllm/models/kimi_k3/nvidia/specialized_decode/drafter/model.py",
        "vllm/models/mistral/mistral_large4/nvidia/model.py",
        "vllm/models/muse_spark/nvidia/specialized_decode/runtime/flashinfer_ops.py",
        "vllm/models/minimax_m3/nvidia/ops/finalize_allreduce_norm.py",
    } <= new
    assert "Not qualified" in proc.stdout


def test_the_flashinfer_0_34_pins_has_the_comm_code_fiar_verified(tmp_path: Path) -> None:
    proc = qualify("vllm", "0.34.0", tmp=tmp_path)
    assert "FlashInfer pin 0.7.3 (read as 0.7.4)" in proc.stdout
    assert "DIFFERS" not in proc.stdout and "same: allreduce.py:create_allreduce_fusion_workspace" in proc.stdout


def test_a_release_that_names_no_release_is_refused(tmp_path: Path) -> None:
    proc = qualify("vllm", "latest", tmp=tmp_path)
    assert proc.returncode == 2 and "not a release" in proc.stderr
