"""``bench/engine_release.py`` qualifies a release from cached wheels, with no network: vLLM 0.33.0 and 0.34.0
and SGLang 0.5.20 and 0.5.23 match their reviewed lists, and a release against the list of the one before it
names every new caller and fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
WHEELS = Path(os.environ.get("FIAR_WHEEL_CACHE", Path.home() / ".cache" / "fiar" / "wheels"))
NEEDED = ("vllm-0.33.0-", "vllm-0.34.0-", "flashinfer_python-0.7.2.post1-", "flashinfer_python-0.7.4-")
SGLANG_NEEDED = (
    "sglang-0.5.20-",
    "sglang-0.5.23-",
    "flashinfer_python-0.6.18-",
    "flashinfer_python-0.7.2-",
    "flashinfer_python-0.7.2.post1-",
)


def _cold(needed: tuple[str, ...]) -> list[str]:
    return [n for n in needed if not any(WHEELS.glob(f"{n}*.whl"))]


def _warm(needed: tuple[str, ...], engine: str, version: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        bool(_cold(needed)),
        reason=f"wheel cache {WHEELS} is cold (missing {', '.join(_cold(needed))}): "
        f"run bench/engine_release.py {engine} {version} once with the network",
    )


vllm_wheels = _warm(NEEDED, "vllm", "0.34.0")
sglang_wheels = _warm(SGLANG_NEEDED, "sglang", "0.5.23")


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


@vllm_wheels
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_a_qualified_release_has_no_caller_outside_its_reviewed_list(version: str, tmp_path: Path) -> None:
    proc = qualify("vllm", version, tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NEW CALLER" not in proc.stdout
    assert f"reviewed list compared: vllm-{version}.txt" in proc.stdout


@vllm_wheels
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


@vllm_wheels
def test_the_flashinfer_0_34_pins_has_the_comm_code_fiar_verified(tmp_path: Path) -> None:
    proc = qualify("vllm", "0.34.0", tmp=tmp_path)
    assert "FlashInfer pin 0.7.3 (read as 0.7.4)" in proc.stdout
    assert "DIFFERS" not in proc.stdout and "same: allreduce.py:create_allreduce_fusion_workspace" in proc.stdout


def test_a_release_that_names_no_release_is_refused(tmp_path: Path) -> None:
    proc = qualify("vllm", "latest", tmp=tmp_path)
    assert proc.returncode == 2 and "not a release" in proc.stderr


@sglang_wheels
@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_a_qualified_sglang_release_has_no_caller_outside_its_reviewed_list(version: str, tmp_path: Path) -> None:
    proc = qualify("sglang", version, tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NEW CALLER" not in proc.stdout
    assert f"reviewed list compared: sglang-{version}.txt" in proc.stdout


@sglang_wheels
def test_the_new_sglang_callers_of_0_5_23_are_named_and_fail_the_command(tmp_path: Path) -> None:
    proc = qualify("sglang", "0.5.23", "--against", "0.5.20", tmp=tmp_path)
    assert proc.returncode == 1
    new = {line.split(": ", 1)[1] for line in proc.stdout.splitlines() if "NEW CALLER" in line}
    assert {
        "sglang/srt/models/beam.py",  # its own FlashInfer mnnvl allreduce
        "sglang/srt/layers/communication/sp_collective_gemm_workspace.py",  # raises without multicast
        "sglang/srt/layers/layer_boundary/fusions/cutedsl.py",
    } <= new
    gone = {line.split(": ", 1)[1] for line in proc.stdout.splitlines() if "gone since 0.5.20" in line}
    assert "sglang/srt/layers/moe/qwen35_flashinfer_fusion.py" in gone  # the opt-in variable's fusion
    assert "Not qualified" in proc.stdout and "sglang-0.5.23.txt" in proc.stdout


@sglang_wheels
def test_sglang_pins_are_compared_with_the_pin_before_and_the_oldest_with_the_agents_flashinfer(
    tmp_path: Path,
) -> None:
    older = qualify("sglang", "0.5.20", tmp=tmp_path).stdout
    assert "FlashInfer pin 0.6.18 (read as 0.6.18); flashinfer/comm against 0.7.2.post1 (the agent's" in older
    assert "DIFFERS: allreduce.py:create_allreduce_fusion_workspace" in older  # 0.6.18 is not the agent's code
    newer = qualify("sglang", "0.5.23", tmp=tmp_path).stdout
    assert "FlashInfer pin 0.7.2 (read as 0.7.2); flashinfer/comm against 0.6.18 (sglang 0.5.20's pin)" in newer
    assert "DIFFERS" not in newer


def test_every_file_of_a_reviewed_list_says_what_reaches_it() -> None:
    for path in (ROOT / "bench" / "engine_releases").glob("*.txt"):
        entries = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
        assert entries, path.name
        assert all("  # " in line and line.split("  # ", 1)[1].strip() for line in entries), path.name
