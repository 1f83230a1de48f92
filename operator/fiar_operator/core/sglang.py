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

- ``engine``: SGLang's own choice, where every backend that choice can be is verified on the node and
  allowed by the policy: ``mnnvl`` and ``trtllm`` for one pod (fiar cannot tell SM90 from SM100 from
  the node's labels, nor the model from the pod), only ``trtllm`` on a node whose multicast is
  ``unsupported`` (there SGLang's mnnvl fails before any kernel runs and SGLang turns the fusion off on
  every rank: a failed workspace disables it, ``layers/flashinfer_comm_fusion.py``), ``mnnvl`` for a
  multi-pod group (``trtllm`` is single node only in SGLang). ``cutedsl`` (MiMo on SM100) uses the
  same multicast fabric memory as ``mnnvl`` and counts as verified with it (inferred: fiar's agent
  tests ``mnnvl``, not ``cutedsl``);
- ``off``: ``--enforce-disable-flashinfer-allreduce-fusion`` everywhere else: where the decision's
  fusion is off, and where SGLang's own choice might be a backend the node did not verify (``auto``
  gives ``mnnvl`` on an SM100 node whose multicast is supported but whose mnnvl test failed, or whose
  host policy disables multicast; ``trtllm`` on an SM90 node whose trtllm test failed).

A policy with ``fusionControl: Disabled`` gives ``engine`` everywhere (``Decision``), as it leaves
vLLM's fusion on.
"""

from __future__ import annotations

from typing import Final

import fiar_contract as contract
from fiar_operator.core.nodefacts import MULTI_NODE_BACKEND

SINGLE_POD_CHOICES: Final[frozenset[contract.Backend]] = frozenset({"mnnvl", "trtllm"})
"""The backends SGLang's own choice can be for one pod (``auto`` on SM100 or SM90; cutedsl as mnnvl)."""
GROUP_CHOICES: Final[frozenset[contract.Backend]] = frozenset({MULTI_NODE_BACKEND})
"""The backends SGLang's own choice can be across nodes (``auto`` on SM100; trtllm raises there)."""


def sglang_flag(
    fusion: contract.Fusion,
    verified: bool,
    backends: frozenset[contract.Backend],
    multi: bool,
    multicast: str | None = None,
) -> contract.SglangFlag:
    """The SGLang option for a decision: its ``fusion``, whether its reason is ``Verified``, the allowed
    backends its node (or group) verifies, whether the pod is one of a multi-pod group, and the node's
    ``fiar.io/multicast`` label."""
    if fusion == "off":
        return "off"
    if not verified:  # fusion on without a verified backend: fusionControl Disabled, the engine's own
        return "engine"
    choices = GROUP_CHOICES if multi else SINGLE_POD_CHOICES
    if not multi and multicast == "unsupported":
        # SGLang's mnnvl (or cutedsl) cannot start here: FlashInfer refuses a workspace without multicast
        # (attribute 0, no cuMulticastCreate, or a null multicast pointer) and SGLang then turns the
        # fusion off on every rank (``_sync_allreduce_unavailable_across_tp``). Its own choice is
        # trtllm or nothing.
        choices = frozenset({"trtllm"})
    return "engine" if choices <= backends else "off"
