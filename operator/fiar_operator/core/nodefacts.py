"""What a node's labels say it verifies, and the placement rule that admits exactly those nodes.

The two rules sit side by side because ``placement: VerifiedNodesOnly`` must admit the nodes that
``node_facts`` says verify an allowed backend, no more and no fewer (a test checks them against each
other over every combination of labels). Backend values, their order of preference and the label
names come from ``fiar_contract``.

A node *verifies* a backend when the agent's verdict (``fiar.io/backend``) names it, or when the
verdict names a backend preferred over it and its own smoke test passed (``fiar.io/<backend>=pass``).
The agent gives a verdict only to a backend whose test passed, and never writes ``none`` without a
conclusive probe (docs/DESIGN.md#verdict-none); a label value that is not one of the contract's is
untrusted input and reads as no verdict at all.

A multi-pod group needs ``MULTI_NODE_BACKEND`` on nodes of one NVLink clique (``group_break``: the
one clique rule, used at binding by ``decide`` and on running pods by ``reconcile``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import fiar_contract as contract
from fiar_operator.core.affinity import Json, backend_requirement

MULTI_NODE_BACKEND: Final[contract.Backend] = "mnnvl"
"""The only backend that works across pods (vLLM treats each pod as a node; the others raise there).
It needs FABRIC memory handles, so one NVLink clique and an IMEX channel."""
RUNS_UNVERIFIED: Final[contract.Backend] = "trtllm"
"""The backend a pod still gets on a node that verifies none of its policy's backends, where this
backend's smoke test passed: it runs (it never needs multicast), where vLLM's ``auto`` might not."""


@dataclass(frozen=True)
class NodeFacts:
    """What the agent's labels say about one node."""

    name: str
    verdict: contract.Verdict | None
    """``None`` when the node has no (valid) fiar.io/backend label: never probed."""
    verified: frozenset[contract.Backend]
    clique: str | None
    """The NVLink clique: fiar's label or GFD's; None when neither is set or the two disagree."""
    trtllm_runs: bool = False
    """The ``RUNS_UNVERIFIED`` backend's smoke test passed (whether or not it is the verdict)."""
    multicast: contract.MulticastUsable = "unknown"
    """``fiar.io/multicast-usable``; for an agent that predates the label, ``verified`` where its other
    labels say the mnnvl test passed (``fiar.io/multicast=supported``, ``fiar.io/mnnvl=pass`` or the
    verdict ``mnnvl``: the same proof), else ``unknown``."""
    mnnvl_workspace: contract.MnnvlWorkspace | None = None
    """``fiar.io/mnnvl-workspace``: how the node's own mnnvl workspace creation ended (None: not known)."""
    compute_capability: tuple[int, int] | None = None
    """``fiar.io/compute-capability``: the one compute capability of the node's GPUs (None: not known)."""
    flashinfer: str | None = None
    """``fiar.io/flashinfer``: the FlashInfer the node's verdict was made with (None: not known)."""

    @property
    def multicast_verified(self) -> bool:
        return self.multicast == contract.MULTICAST_VERIFIED


def clique(labels: Mapping[str, str]) -> str | None:
    found = {labels.get(contract.LABEL_CLIQUE) or None, labels.get(contract.LABEL_GFD_CLIQUE) or None} - {None}
    return found.pop() if len(found) == 1 else None


def _passed(labels: Mapping[str, str], backend: contract.Backend) -> bool:
    return labels.get(contract.result_label(backend)) == "pass"


def node_facts(name: str, labels: Mapping[str, str]) -> NodeFacts:
    verdict = contract.verdict_value(labels.get(contract.LABEL_BACKEND))
    verified: frozenset[contract.Backend] = frozenset()
    chosen = contract.backend_value(verdict)
    if chosen is not None:
        later = contract.BACKENDS[contract.BACKENDS.index(chosen) + 1 :]
        verified = frozenset({chosen, *(b for b in later if _passed(labels, b))})
    runs = RUNS_UNVERIFIED in verified or _passed(labels, RUNS_UNVERIFIED)
    return NodeFacts(
        name,
        verdict,
        verified,
        clique(labels),
        runs,
        multicast_usable(labels),
        mnnvl_workspace(labels),
        contract.compute_capability_value(labels.get(contract.LABEL_COMPUTE_CAPABILITY)),
        contract.flashinfer_value(labels.get(contract.LABEL_FLASHINFER)),
    )


def multicast_usable(labels: Mapping[str, str]) -> contract.MulticastUsable:
    """The node's multicast usability; a value not of the contract's is untrusted input: ``unknown``."""
    raw = labels.get(contract.LABEL_MULTICAST_USABLE)
    if raw is None:  # an agent that predates the label: its proof is the same mnnvl pass
        proved = labels.get(contract.LABEL_MULTICAST) == "supported" or _passed(labels, "mnnvl")
        return "verified" if proved or labels.get(contract.LABEL_BACKEND) == "mnnvl" else "unknown"
    return next((m for m in contract.MULTICAST_USABLE_STATES if m == raw), "unknown")


def mnnvl_workspace(labels: Mapping[str, str]) -> contract.MnnvlWorkspace | None:
    raw = labels.get(contract.LABEL_MNNVL_WORKSPACE)
    return next((w for w in contract.MNNVL_WORKSPACE_STATES if w == raw), None)


def _verifies(backend: contract.Backend) -> list[Json]:
    """Requirements (ANDed) of the nodes that verify ``backend``: a verdict no worse than it, and its
    test passed (implied where the verdict is the backend itself, the only one no worse than it)."""
    no_worse = list(contract.BACKENDS[: contract.BACKENDS.index(backend) + 1])
    if no_worse == [backend]:
        return [backend_requirement(no_worse)]
    passed = {"key": contract.result_label(backend), "operator": "In", "values": ["pass"]}
    return [backend_requirement(no_worse), passed]


def verified_alternatives(backends: Sequence[contract.Backend]) -> list[list[Json]]:
    """The placement rule: alternatives (ORed) of node-selector requirements (ANDed) that admit exactly
    the nodes verifying one of ``backends``.

    Where ``backends`` holds every backend preferred over its least preferred member, the verdict
    alone decides (one requirement); otherwise one alternative per backend.
    """
    last = max(contract.BACKENDS.index(b) for b in backends)
    if set(backends) == set(contract.BACKENDS[: last + 1]):
        return [[backend_requirement(backends)]]
    return [_verifies(b) for b in contract.BACKENDS if b in backends]


def joins_group(facts: NodeFacts) -> bool:
    """Whether a node can hold a member of a multi-pod group: it verifies the multi-node backend in a clique."""
    return MULTI_NODE_BACKEND in facts.verified and facts.clique is not None


def group_break(members: Iterable[tuple[str, NodeFacts]]) -> str | None:
    """The one multi-pod rule: every node verifies ``MULTI_NODE_BACKEND``, and all share one NVLink
    clique. Why ``members`` (``(who, facts)``, e.g. ``("node n1 of member p0", facts)``) break it;
    None while they keep it (and for no members)."""
    cliques: dict[str, str] = {}
    for who, facts in members:
        if MULTI_NODE_BACKEND not in facts.verified:
            return f"{who} has verdict {facts.verdict or 'unprobed'}"
        if facts.clique is None:
            return f"{who} is in no NVLink clique"
        cliques.setdefault(facts.clique, facts.name)
    if len(cliques) > 1:
        return "its nodes span NVLink cliques " + ", ".join(f"{c} ({n})" for c, n in sorted(cliques.items()))
    return None
