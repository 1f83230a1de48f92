"""What fiar's decision means for an SGLang container: pure functions over a ``decide.Decision``.

SGLang (0.5.x, read in the 0.5.15.post1, 0.5.20 and 0.5.23 wheels) runs the same FlashInfer allreduce
fusion as vLLM, chosen on its command line only (no environment variable chooses the backend):

- ``--flashinfer-allreduce-fusion-backend {auto,trtllm,mnnvl[,cutedsl]}``, default unset;
- ``--enforce-disable-flashinfer-allreduce-fusion``, a store-true switch that its post-process pass
  ``_enforce_disable_allreduce_fusion`` applies right after ``_flashinfer_allreduce_fusion_auto_enable``,
  so it wins over every model adjustment (``sglang/srt/arg_groups/overrides.py``);
- left unset, ``_flashinfer_allreduce_fusion_auto_enable`` turns the fusion on (``auto``; MiMo:
  ``cutedsl``) only for the architectures it lists, on SM90/SM10x, TP > 1, without attention DP or a
  MoE all-to-all backend, single node or SM100. ``auto`` then resolves to ``mnnvl`` on SM100/SM103
  (one node or several) and ``trtllm`` on SM90 single node (``_resolve_backend`` in
  ``layers/flashinfer_comm_fusion.py``).

A backend *set* on the command line skips that list: the auto-enable pass runs only while the backend
is unset, and with any backend set SGLang pre-allocates the workspace
(``_pre_initialize_flashinfer_allreduce_workspace``), routes every attention-TP and MoE allreduce
through FlashInfer (``set_flashinfer_allreduce_only`` and ``_tag_groups_for_flashinfer_allreduce_only``
in 0.5.23) and fuses at every layer boundary whose norm supports it, whatever the model; a set
``trtllm`` raises ``ValueError`` across nodes, and so does a set ``mnnvl`` across SM90 nodes. So fiar
never sets a backend: that would turn the fusion on for models SGLang leaves it off for.

The one decision of the pod (``Decision``) therefore becomes one of two options (``contract.SGLANG_FLAGS``):

- ``engine``: SGLang's own choice, where every backend that choice can be on the node's GPU generation
  (``OWN_CHOICES``, by the agent's ``fiar.io/compute-capability``) is verified on the node and allowed
  by the policy;
- ``off``: ``--enforce-disable-flashinfer-allreduce-fusion`` everywhere else: where the decision's
  fusion is off, and where SGLang's own choice might be a backend the node did not verify.

SGLang's own choice, per generation (``_flashinfer_allreduce_fusion_auto_enable`` and ``_resolve_backend``,
read in 0.5.20 and 0.5.23; ``is_sm90`` is compute capability major 9, ``is_sm100`` major 10):

- SM90 (H100, H200): ``trtllm`` for one pod; nothing across nodes (the auto-enable pass needs one node
  off SM100, and MiMo's ``cutedsl`` needs SM100);
- SM10x (B200, GB200, B300): ``mnnvl`` for one pod or a group; MiMo's ``cutedsl`` uses the same multicast
  fabric memory and counts as ``mnnvl`` (inferred: the agent tests ``mnnvl``, not ``cutedsl``);
- any other generation: nothing (the pass runs on SM90 and SM10x only);
- not known (no label: an agent that predates it, GPUs that differ or could not be read): any of them,
  ``mnnvl`` and ``trtllm`` for one pod, ``mnnvl`` for a group.

No multicast fact enters: where an mnnvl workspace fails (``fiar.io/mnnvl-workspace``), SGLang's
``FlashInferWorkspaceManager.initialize`` turns the fusion off on every rank, but MiMo's ``cutedsl``
workspace (``prepare_cutedsl_fusion``, 0.5.23) is built outside any ``try`` and its failure stops the
server; so a failing mnnvl is not SGLang's own "nothing" where ``cutedsl`` can run (SM10x, or not known),
and on SM90 SGLang never picks mnnvl.

A policy with ``fusionControl: Disabled`` gives ``engine`` everywhere (``Decision``), as it leaves
vLLM's fusion on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import fiar_contract as contract
from fiar_operator.core.nodefacts import MULTI_NODE_BACKEND


@dataclass(frozen=True)
class OwnChoice:
    """The backends SGLang's own choice can be on one GPU generation."""

    single: frozenset[contract.Backend]
    """For one pod (one node)."""
    group: frozenset[contract.Backend]
    """Across the nodes of a multi-pod group."""


OWN_CHOICES: Final[Mapping[int, OwnChoice]] = {
    # SM90: auto -> trtllm on one node; the auto-enable pass skips several nodes (nnodes == 1 or SM100).
    9: OwnChoice(frozenset({"trtllm"}), frozenset()),
    # SM10x: auto -> mnnvl on one node or several; MiMo's cutedsl counts as mnnvl.
    10: OwnChoice(frozenset({"mnnvl"}), frozenset({MULTI_NODE_BACKEND})),
}
"""Compute capability major -> SGLang's own choice there. One row per generation SGLang's auto-enable runs on."""
NO_CHOICE: Final = OwnChoice(frozenset(), frozenset())
"""A known generation without a row: SGLang turns the fusion on nowhere."""
NOT_KNOWN: Final = OwnChoice(frozenset({"mnnvl", "trtllm"}), frozenset({MULTI_NODE_BACKEND}))
"""A node whose generation is not known: every row's backends."""


def own_choice(compute_capability: tuple[int, int] | None) -> OwnChoice:
    """The backends SGLang's own choice can be on GPUs of ``compute_capability`` (None: not known)."""
    if compute_capability is None:
        return NOT_KNOWN
    return OWN_CHOICES.get(compute_capability[0], NO_CHOICE)


def sglang_flag(
    fusion: contract.Fusion,
    verified: bool,
    backends: frozenset[contract.Backend],
    multi: bool,
    compute_capability: tuple[int, int] | None = None,
) -> contract.SglangFlag:
    """The SGLang option for a decision: its ``fusion``, whether its reason is ``Verified``, the allowed
    backends its node (or group) verifies, whether the pod is one of a multi-pod group, and the node's
    ``fiar.io/compute-capability`` (None: not known)."""
    if fusion == "off":
        return "off"
    if not verified:  # fusion on without a verified backend: fusionControl Disabled, the engine's own
        return "engine"
    choice = own_choice(compute_capability)
    return "engine" if (choice.group if multi else choice.single) <= backends else "off"
