"""Which vLLM release a pod runs, and what that release does with FlashInfer allreduce paths that the
fusion switches do not reach.

vLLM's model-level fused ops (0.33.0: ``vllm/models/common/ops/fused_allreduce_rms_norm.py`` and
``vllm/model_executor/layers/fused_allreduce_gemma_rms_norm.py``, used in every layer of the NVIDIA
model files of DeepSeek-V3.2 and GLM-5.x, Kimi-K3 and Kimi-Linear, and MiniMax-M3; 0.34.0 adds
Kimi-K3.1, the Kimi-K3 DSpark drafter and Qwen3.5: ``MODEL_LEVEL_CALLERS``) call ``get_fi_ar_workspace`` whatever
``pass_config.fuse_allreduce_rms`` and ``VLLM_ALLREDUCE_USE_FLASHINFER`` say. On a node that verifies
no backend they would run the path the node's agent measured slower than NCCL, or the one that
crashes. What turns them off too is a workspace that fails: where a release uses an explicit
``VLLM_FLASHINFER_ALLREDUCE_BACKEND`` as given (no trtllm fallback) and turns a failed mnnvl
workspace into ``None`` (every caller then runs NCCL), a pod on a node whose own mnnvl workspace
creation failed in that way gets ``mnnvl``: the one value that makes every path take NCCL there.

``OFF_BY_FAILING_MNNVL`` is the table, one row per release line, read from each release's code and
run on CPU by ``bench/vllm_fi_ar_check.py`` (docs/vllm-flashinfer-paths.md has the matrix). A release
that is not in the table, or a node whose workspace end is not in its row, gets no release-specific
value: the pod gets the ordinary decision, and its decision says which paths stay on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import fiar_contract as contract

Line = tuple[int, int]

OFF_BY_FAILING_MNNVL: Final[Mapping[Line, frozenset[contract.MnnvlWorkspace]]] = {
    # 0.25.1 has no mc_ptr check, and its FlashInfer 0.6.13 builds the mnnvl workspace on torch
    # symmetric memory: a null pointer there crashes later (vLLM #48071) whatever the node.
    (0, 25): frozenset(),
    # 0.27.1 turns a failed workspace into None but does not remember it: every fused call retries.
    # On a GPU without multicast the retry is a local attribute read that raises (a cost per call,
    # no collective); a failed bind would repeat the collective multicast setup every call.
    (0, 27): frozenset({"no-multicast"}),
    # 0.32 and 0.33 try once and remember the failure; a bind that fails on every rank returns on
    # every rank (one that fails on some ranks only would leave the others in FlashInfer's barrier).
    (0, 32): frozenset({"no-multicast", "failed-on-every-rank"}),
    (0, 33): frozenset({"no-multicast", "failed-on-every-rank"}),
    # 0.34 as 0.33 (run with FlashInfer 0.7.4 for its unserved pin 0.7.3). Qwen3.5's fused norm + quant asks
    # for the quant workspace itself: a failing mnnvl returns None there too, after one more creation.
    (0, 34): frozenset({"no-multicast", "failed-on-every-rank"}),
}
"""Release line -> the node's ``fiar.io/mnnvl-workspace`` ends on which ``mnnvl`` turns every
FlashInfer allreduce path of that release off without a crash or a hang (empty: none does).
``created`` is never in a row: a workspace that works turns nothing off."""

FLASHINFER_PINS: Final[Mapping[Line, str]] = {
    (0, 25): "0.6.13",
    (0, 27): "0.6.16.post3",
    (0, 32): "0.7.0.post1",
    (0, 33): "0.7.2.post1",
    (0, 34): "0.7.3",  # not on PyPI: checked with 0.7.4, whose flashinfer/comm functions fiar relies on are the same
}
"""Release line -> the flashinfer-python its wheel pins (METADATA), as ``bench/engine_release.py`` reads it."""
FLASHINFER_COMM: Final[Mapping[str, str]] = {
    "0.6.13": "2b0e6d5eafd34fc1",
    "0.6.16.post3": "48356aaff97b9b2f",
    "0.7.0.post1": "48356aaff97b9b2f",
    "0.7.2.post1": "94ba6145cd1d5817",
    "0.7.3": "94ba6145cd1d5817",  # not on PyPI: its stand-in 0.7.4's, the source the 0.34 qualification read
    "0.7.4": "94ba6145cd1d5817",
}
"""FlashInfer version -> ``functions_sha256`` of its ``flashinfer/comm`` functions fiar's verdicts rest on
(the workspace creation and the multicast setup: ``bench/engine_release.py`` ``FLASHINFER_FUNCTIONS``,
``comm_diff``), as the qualification computed it from the wheel (bench/results/engine-release/). Two
versions with one value run the same code there. A version not in the table: not known."""
QUALIFIED: Final = frozenset(OFF_BY_FAILING_MNNVL)
"""The release lines fiar qualified (``bench/engine_release.py``: callers reviewed, workspace, parser and
option checks run). A pod of a known release outside them gets the most conservative decision its node
allows (``decide``: the fusion off even where a backend is verified) and a ``ReleaseNotQualified`` Warning."""

FAILING_BACKEND: Final[contract.Backend] = "mnnvl"
"""The value a pod gets where its node's failing workspace of this backend turns every path off."""
MODEL_LEVEL_OPS: Final = "model-level fused allreduce ops"
"""The paths the fusion switches leave on, for a release whose callers fiar has not listed."""
_V33_CALLERS: Final = (
    "DeepSeek-V3.2 and GLM-5.x (deepseek_v32)",
    "Kimi-K3 and Kimi-Linear (kimi_k3)",
    "MiniMax-M3",
)
MODEL_LEVEL_CALLERS: Final[Mapping[Line, tuple[str, ...]]] = {
    # vllm/model_executor/models/registry.py: DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM and the MTP on
    # vllm.models.deepseek_v32; KimiK3ForConditionalGeneration, KimiLinearForCausalLM, the DSpark MLA
    # drafter and the MTP on vllm.models.kimi_k3; MiniMax-M3 and its MTP. Each NVIDIA model file calls
    # fused_allreduce_rms_norm / fused_allreduce_gemma_rms_norm (bench/results/engine-release/).
    (0, 33): _V33_CALLERS,
    # 0.34 adds Kimi-K3.1 (on kimi_k3), the Kimi-K3/K3.1 DSpark drafter of the specialized decode, and
    # Qwen3.5 (all six architectures on vllm.models.qwen3_5, with its fused norm + FP8/NVFP4 quant asking
    # for the quant workspace itself). Mistral Large 4's fused op reads pass_config.fuse_allreduce_rms,
    # which fiar turns off: it is not listed.
    (0, 34): (
        "DeepSeek-V3.2 and GLM-5.x (deepseek_v32)",
        "Kimi-K3, Kimi-K3.1 and Kimi-Linear (kimi_k3)",
        "Kimi-K3/K3.1 DSpark drafter (specialized decode)",
        "MiniMax-M3",
        "Qwen3.5 (qwen3_5, with its fused norm + FP8/NVFP4 quant)",
    ),
}
"""Release line -> the model families whose NVIDIA model code reaches a FlashInfer allreduce workspace
whatever the fusion switches say (named in the decision's ``notTurnedOff``)."""


def model_level_callers(release: str | None) -> tuple[str, ...]:
    """The model families of ``release`` whose FlashInfer allreduce the fusion switches leave on (a
    release fiar has not listed: the generic words)."""
    line = line_of(release)
    return MODEL_LEVEL_CALLERS.get(line, (MODEL_LEVEL_OPS,)) if line is not None else (MODEL_LEVEL_OPS,)


_RELEASE: Final = re.compile(r"^v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?(?:$|[-+._])")
_IMAGE_REPOSITORIES: Final = ("vllm-openai", "vllm")
"""The last path component of the image repositories whose tag is the vLLM release."""


def line_of(release: str | None) -> Line | None:
    """``0.33.0`` / ``v0.33`` / ``0.33.0-cu130`` -> (0, 33)."""
    found = _RELEASE.match(release) if release else None
    return (int(found.group(1)), int(found.group(2))) if found else None


def image_release(image: object) -> str | None:
    """The vLLM release in an image reference whose repository is vLLM's (``vllm/vllm-openai:v0.33.0``);
    None for any other image, a digest-only reference or a tag that names no release."""
    if not isinstance(image, str) or "@" in image or len(image) > 512:
        return None
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return None
    repository = name.rsplit("/", 1)[-1]
    if repository not in _IMAGE_REPOSITORIES:
        return None
    found = _RELEASE.match(tag)
    return f"{found.group(1)}.{found.group(2)}.{found.group(3) or 0}" if found else None


def flashinfer_pin(release: str | None) -> str | None:
    """The FlashInfer ``release`` pins (None: a release or line fiar has not read)."""
    line = line_of(release)
    return FLASHINFER_PINS.get(line) if line is not None else None


def same_flashinfer_comm(pinned: str | None, node: str | None) -> bool | None:
    """Whether the FlashInfer a pod's release pins (``pinned``) has the same workspace and multicast code
    as the one its node's verdict was made with (``node``); None when either is not known."""
    a = FLASHINFER_COMM.get(pinned) if pinned is not None else None
    b = FLASHINFER_COMM.get(node) if node is not None else None
    return None if a is None or b is None else a == b


def qualified(release: str | None) -> bool | None:
    """Whether ``release`` is on a line fiar qualified (None: the release is not known)."""
    line = line_of(release)
    return None if line is None else line in QUALIFIED


def newest_qualified() -> str:
    major, minor = max(QUALIFIED)
    return f"{major}.{minor}"


def off_by_failing_mnnvl(release: str | None, workspace: contract.MnnvlWorkspace | None) -> bool:
    """Whether ``mnnvl`` turns every FlashInfer allreduce path of ``release`` off on a node whose own
    mnnvl workspace creation ended in ``workspace``."""
    line = line_of(release)
    return line is not None and workspace is not None and workspace in OFF_BY_FAILING_MNNVL.get(line, frozenset())
