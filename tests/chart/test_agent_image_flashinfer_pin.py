"""The agent image's FlashInfer is one pinned version, and that version has run the agent on a GPU.

The pin lives in pyproject's ``gpu`` extra, which the Dockerfile's agent stage installs (with ``jit``: nvcc); the raw
output of ``bench/agent_gpu_verify.sh`` under ``bench/results/`` records which FlashInfer it ran with
(``env.txt``) and what ``fiar-agent prebuild`` built (``prebuild.json``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pinned_flashinfer() -> str:
    found = re.findall(r'^\s*"flashinfer-python==([^"]+)",', (ROOT / "pyproject.toml").read_text(), re.M)
    assert len(found) == 1, "pyproject's gpu extra pins flashinfer-python to exactly one version (==)"
    return found[0]


def test_the_agent_image_installs_the_gpu_extra() -> None:
    text = (ROOT / "Dockerfile").read_text()
    agent_build = text.split("AS agent-build\n", 1)[1].split("\nFROM ", 1)[0]
    assert re.search(r'"\.\[gpu(,\w+)*\]"', agent_build), "the agent image takes FlashInfer from the pinned gpu extra"
    assert not re.search(r"flashinfer-python\s*[=<>~]", text), "the pin is in pyproject only, not the Dockerfile"


def test_the_pinned_flashinfer_ran_the_agent_on_a_gpu() -> None:
    version = pinned_flashinfer()
    runs = [
        env.parent
        for env in sorted((ROOT / "bench" / "results").rglob("env.txt"))
        if re.search(rf"^flashinfer {re.escape(version)}$", env.read_text(), re.M)
    ]
    assert runs, f"no bench/results/*/env.txt of bench/agent_gpu_verify.sh ran FlashInfer {version}"
    built = [
        run for run in runs
        if (run / "prebuild.json").stat().st_size
        and json.loads((run / "prebuild.json").read_text())["modules"]["trtllm"]["source"] in ("compiled", "jit-cache")
    ]  # fmt: skip
    assert built, f"no GPU run with FlashInfer {version} built trtllm_comm through fiar-agent prebuild"
