"""Which backend a managed pod gets on a node, and whether vLLM's FlashInfer allreduce fusion runs:
pure functions over node labels, the pod's group and its policy.

Which backends a node *verifies* is read from its labels by ``nodefacts``. A pod gets the first
backend of its policy's ``backends`` that its node verifies (reason ``Verified``); only then does
the fusion run as the container itself configures it (``fusion: on``). Everywhere else the fusion is
off (``fusion: off``: fiar turns vLLM's AR+RMSNorm fusion pass and the standalone FlashInfer
allreduce, which shares its workspace, off in the containers whose command it can change), because
vLLM's own guess there is the crash or the crawl (vLLM #48071: 0.25-0.26 crash at CUDA-graph
capture, 0.27-0.33 fall back to a trtllm path reported 10-34x slower than no fusion). The backend
value still matters for a container whose fusion cannot be turned off: on a node whose trtllm smoke
test ran it gets ``trtllm``, which runs, else the policy's ``fallbackBackend``. A policy with
``fusionControl: Disabled`` leaves the fusion on everywhere.

A multi-pod group (a LeaderWorkerSet group of size > 1, or every pod of a policy with
``multiNode: Always``) spans pods, which vLLM treats as separate nodes: trtllm then raises, so only
mnnvl qualifies, and only when every node the group may land on verifies mnnvl, all of them share
one NVLink clique (``fiar.io/clique`` or GFD's ``nvidia.com/gpu.clique``), and the pods carry an IMEX
channel claim (FlashInfer needs FABRIC memory handles across hosts, which need the channel). A group
is *pinned* when its pods carry the constraints the pod webhook injects for that (required node
affinity on mnnvl nodes with a clique, and a required pod affinity that keeps the group in one
clique); an unpinned group qualifies only when every node its placement admits already meets the
rule. A group that does not qualify gets the fallback with the fusion off. That check of the
candidate nodes is the only planning step whose work grows with the fleet: it spends the review's
``limits.Budget`` per node and requirement, stops at the first node that breaks the rule, and
raises ``OverBudget`` past the budget (the webhook then allows the pod unchanged).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

import fiar_contract as contract
from fiar_operator.core import limits, releases, sglang
from fiar_operator.core import options as engine_options
from fiar_operator.core.limits import Budget
from fiar_operator.core.nodefacts import (
    MULTI_NODE_BACKEND,
    RUNS_UNVERIFIED,
    NodeFacts,
    group_break,
    joins_group,
    node_facts,
)
from fiar_operator.core.policy import Policy
from fiar_operator.core.selectors import ANYWHERE, NodeConstraint

Reason = Literal[
    "Verified",
    "NotVerified",
    "NotProbed",
    "NodeUnknown",
    "Pending",
    "MultiNodeNeedsMnnvl",
    "MultiNodeNoSharedClique",
    "MultiNodeNoImexChannel",
]
Trigger = Literal["create", "binding", "reconcile"]
OffBy = Literal["failing-mnnvl-workspace"]
OFF_BY_FAILING_MNNVL: Final[OffBy] = "failing-mnnvl-workspace"

VERIFIED_REASON: Final = "Verified"
MAX_DECISION_LENGTH: Final = 4096
"""Longest fiar.io/decision annotation that is parsed; the operator writes about 200 characters."""


def utc_now() -> str:
    """The time a decision is taken, as its annotation records it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class GroupPlan:
    """How a pod relates to a multi-pod group."""

    multi: bool = False
    key: str | None = None
    pinned: bool = False
    constraint: NodeConstraint = ANYWHERE
    imex: bool = False
    """A container of the pod uses an IMEX channel claim (or the policy says the channel is provided)."""


SINGLE: Final = GroupPlan()


@dataclass(frozen=True)
class Decision:
    backend: contract.EnvValue
    reason: Reason
    policy: str
    node: str | None = None
    node_verdict: str | None = None
    trigger: Trigger = "binding"
    time: str | None = None
    previous: str | None = None
    group: str | None = None
    fusion: contract.Fusion = "on"
    previous_fusion: str | None = None
    guard: bool = True
    """The multicast guard: the containers read the variables that keep every multicast consumer off
    (``contract.MULTICAST_GUARD``); False where the node verifies multicast or the policy turns it off."""
    previous_guard: bool | None = None
    off_by: OffBy | None = None
    """How FlashInfer allreduce paths the fusion switches miss are turned off (``releases``), if they are."""
    not_turned_off: tuple[str, ...] = ()
    """FlashInfer allreduce paths still on although the fusion is off (no safe value for the release)."""
    release: str | None = None
    """The vLLM release the decision was made for (None: not known)."""
    sglang_flag: contract.SglangFlag = "off"
    """The same decision as SGLang's option (``sglang.py``), taken with it."""
    standalone_kept: bool = False
    """The standalone FlashInfer allreduce stays as the container sets it although the fusion is off
    (an option of the pod needs it: ``options.BREAKS``)."""
    not_applied: tuple[str, ...] = ()
    """The values fiar left out because an option of the pod makes vLLM refuse them, each with why."""
    release_qualified: bool | None = None
    """Whether ``release`` is on a line fiar qualified (``releases.QUALIFIED``; None: release not known)."""
    node_flashinfer: str | None = None
    """The FlashInfer the node's verdict was made with (its agent's ``fiar.io/flashinfer``)."""
    pod_flashinfer: str | None = None
    """The FlashInfer the pod's vLLM release pins (``releases.FLASHINFER_PINS``)."""
    same_flashinfer_comm: bool | None = None
    """Whether the two have the same workspace and multicast code (``releases.same_flashinfer_comm``;
    None: not known)."""

    @property
    def verified(self) -> bool:
        return self.reason == VERIFIED_REASON

    @property
    def flashinfer_allreduce(self) -> bool:
        """Whether the standalone FlashInfer allreduce may run: it creates the fusion's workspace with
        the same backend resolution, so it runs exactly where the fusion does."""
        return self.fusion == "on" or self.standalone_kept

    def annotations(self) -> dict[str, str]:
        """The pod annotations that carry this decision to the containers (through fieldRef env vars)."""
        return {
            contract.ANNOTATION_POD_BACKEND: self.backend,
            contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: contract.FUSE_ALLREDUCE_RMS[self.fusion],
            contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER: contract.ALLREDUCE_USE_FLASHINFER[
                "on" if self.flashinfer_allreduce else "off"
            ],
            **{g.annotation: g.off if self.guard else g.own for g in contract.MULTICAST_GUARD},
            contract.ANNOTATION_POD_SGLANG_FLAG: contract.SGLANG_FLAGS[self.sglang_flag],
            contract.ANNOTATION_POD_DECISION: self.to_json(),
        }

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "backend": self.backend,
            "fusion": self.fusion,
            "guard": self.guard,
            "node": self.node,
            "nodeVerdict": self.node_verdict,
            "policy": self.policy,
            "reason": self.reason,
            "trigger": self.trigger,
        }
        for key, value in (
            ("time", self.time),
            ("previous", self.previous),
            ("previousFusion", self.previous_fusion),
            ("previousGuard", self.previous_guard),
            ("group", self.group),
            ("offBy", self.off_by),
            ("release", self.release),
        ):
            if value is not None:
                doc[key] = value
        if self.not_turned_off:
            doc["notTurnedOff"] = list(self.not_turned_off)
        if self.not_applied:
            doc["notApplied"] = list(self.not_applied)
        if self.release_qualified is False:
            doc["releaseQualified"] = False
        for key, known in (
            ("nodeFlashinfer", self.node_flashinfer),
            ("podFlashinfer", self.pod_flashinfer),
            ("sameFlashinferComm", self.same_flashinfer_comm),
        ):
            if known is not None:
                doc[key] = known
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def parse_decision(raw: str | None) -> dict[str, Any] | None:
    """The fiar.io/decision annotation as a dict, or None when absent, too long, or not ours.

    Anyone who may edit a pod may write this annotation: it is read as untrusted input, so deeply
    nested JSON (RecursionError) or any other parse failure counts as no decision.
    """
    if not raw or len(raw) > MAX_DECISION_LENGTH:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def fusion(policy: Policy, reason: Reason) -> contract.Fusion:
    """The one fusion rule: it runs only where the node verifies an allowed backend for the pod.

    ``Pending`` (created, not bound yet) is off too: that is what a pod runs with when the binding
    webhook misses it, and off is safe on every node, while on crashes or crawls on nodes that
    verify nothing (a verified node loses a few percent until the containers restart).
    """
    return "on" if policy.fusion_control == "Disabled" or reason == VERIFIED_REASON else "off"


def guard(policy: Policy, facts: NodeFacts | None) -> bool:
    """The one guard rule: multicast consumers stay off unless the node verified multicast.

    Before binding (``facts`` None) the guard is on: that is what a pod runs with when the binding
    webhook misses it, and it is safe on every node (NCCL, PyTorch and NVSHMEM take their
    non-multicast paths), while multicast on a node that cannot bind it aborts NCCL at init."""
    return policy.multicast_guard == "Enabled" and not (facts is not None and facts.multicast_verified)


def pending(
    policy: Policy, release: str | None = None, options: engine_options.Options = engine_options.NO_OPTIONS
) -> Decision:
    """The CREATE-time decision of a pod not yet bound: the fallback, fusion off, the multicast guard on
    (less what an option of the pod makes vLLM refuse); replaced at binding."""
    fusion_of = fusion(policy, "Pending")
    decision = Decision(
        policy.fallback,
        "Pending",
        policy.name,
        trigger="create",
        fusion=fusion_of,
        guard=guard(policy, None),
        release=release,
        release_qualified=releases.qualified(release),
        sglang_flag=_sglang_flag(policy, fusion_of, "Pending", frozenset(), multi=False),
    )
    return respect_options(decision, policy, None, SINGLE, options)


def respect_options(
    decision: Decision,
    policy: Policy,
    facts: NodeFacts | None,
    group: GroupPlan,
    options: engine_options.Options,
) -> Decision:
    """``decision`` less every value that an option of the pod makes vLLM refuse (``options.BREAKS``):
    each left out is named, with why, in ``not_applied``.

    - A backend the option refuses: ``mnnvl`` (HiSparse) becomes what vLLM's own ``auto`` gives there
      where that is verified (``trtllm`` on a single-pod node that verifies it), else the fusion off
      with ``trtllm`` where the node's trtllm test ran (one node) or ``auto`` (vLLM's choice: across
      nodes no FlashInfer backend with HiSparse on 0.34); ``trtllm`` (Muse Spark at TP 8/16) becomes
      ``auto``, vLLM's default, which the option accepts.
    - ``VLLM_ALLREDUCE_USE_FLASHINFER=0`` where the option needs it on: left as the container sets it.
    """
    limits_ = engine_options.constraints("vllm", decision.release, options)
    if not limits_ or (policy.fusion_control == "Disabled" and decision.backend not in limits_.forbidden):
        return decision
    left: list[str] = []
    out = decision
    if out.backend in limits_.forbidden:
        left.append(limits_.backend_why(out.backend))
        out = _replace_backend(out, limits_.forbidden, policy, facts, group)
    if out.fusion == "off" and policy.fusion_control == "Enabled" and limits_.keep_standalone:
        left.append(limits_.standalone_why())
        out = replace(out, standalone_kept=True)
    return replace(out, not_applied=tuple(left)) if left else out


def _replace_backend(
    decision: Decision,
    forbidden: frozenset[contract.Backend],
    policy: Policy,
    facts: NodeFacts | None,
    group: GroupPlan,
) -> Decision:
    trtllm_ok = not group.multi and "trtllm" not in forbidden
    verified, ran = (facts.verified, facts.trtllm_runs) if facts is not None else (frozenset(), False)
    if decision.backend == "mnnvl" and decision.fusion == "on" and trtllm_ok and "trtllm" in verified:
        return replace(decision, backend="trtllm", off_by=None)
    line = releases.line_of(decision.release)
    # Before 0.34, vLLM's auto tries mnnvl first on one node: where the node's mnnvl workspace works, auto
    # would run the mnnvl kernels the option crashes in, so trtllm is the one value that avoids them.
    mnnvl_works = facts is not None and ("mnnvl" in verified or facts.mnnvl_workspace == "created")
    auto_tries_mnnvl = "mnnvl" in forbidden and (line is None or line < engine_options.AUTO_AVOIDS_MNNVL_WITH_HISPARSE)
    runs: contract.EnvValue = "trtllm" if trtllm_ok and (ran or (mnnvl_works and auto_tries_mnnvl)) else "auto"
    if decision.backend == "trtllm" and "trtllm" in forbidden:
        return replace(decision, backend="auto")
    fusion_of: contract.Fusion = "on" if policy.fusion_control == "Disabled" else "off"
    return replace(
        decision,
        backend=runs,
        fusion=fusion_of,
        off_by=None,
        not_turned_off=releases.model_level_callers(decision.release) if fusion_of == "off" else (),
        sglang_flag="off" if fusion_of == "off" and decision.sglang_flag != "engine" else decision.sglang_flag,
    )


def choose(policy: Policy, facts: NodeFacts | None) -> tuple[contract.EnvValue, Reason]:
    """The backend for a single-pod workload on a node.

    A node that verifies none of the allowed backends gives ``trtllm`` when its trtllm smoke test
    passed (it runs, where vLLM's ``auto`` would first try mnnvl), else the fallback.
    """
    if facts is None:
        return policy.fallback, "NodeUnknown"
    if facts.verdict is None:
        return policy.fallback, "NotProbed"
    for backend in policy.backends:
        if backend in facts.verified:
            return backend, "Verified"
    return (RUNS_UNVERIFIED if facts.trtllm_runs else policy.fallback), "NotVerified"


def _candidates_break(constraint: NodeConstraint, nodes: Mapping[str, Mapping[str, str]], budget: Budget) -> bool:
    """Whether the nodes ``constraint`` admits break the multi-pod rule (or it admits none).

    Each node evaluated spends ``constraint.cost`` of ``budget`` (``OverBudget`` past it), and the
    walk stops at the first node that breaks the rule."""
    cost, admitted = constraint.cost, 0

    def members() -> Iterator[tuple[str, NodeFacts]]:
        nonlocal admitted
        # list() copies the items in one step, so an informer adding a node meanwhile cannot break the loop.
        for name, labels in list(nodes.items()):
            budget.spend(cost)
            if constraint.admits(labels):
                admitted += 1
                yield f"node {name}", node_facts(name, labels)

    return group_break(members()) is not None or not admitted


def choose_for_group(
    policy: Policy,
    facts: NodeFacts | None,
    group: GroupPlan,
    nodes: Mapping[str, Mapping[str, str]],
    budget: Budget | None = None,
) -> tuple[contract.EnvValue, Reason]:
    """The backend for one pod of a multi-pod group bound to ``facts``' node; an unpinned group's
    check of its candidate nodes spends ``budget`` (None: unbounded)."""
    budget = budget if budget is not None else limits.unbounded()
    if MULTI_NODE_BACKEND not in policy.backends:
        return policy.fallback, "MultiNodeNeedsMnnvl"
    if facts is None:
        return policy.fallback, "NodeUnknown"
    if facts.verdict is None:
        return policy.fallback, "NotProbed"
    if not joins_group(facts):
        return policy.fallback, "MultiNodeNoSharedClique"
    if not group.pinned and _candidates_break(group.constraint, nodes, budget):
        return policy.fallback, "MultiNodeNoSharedClique"
    if not group.imex:
        return policy.fallback, "MultiNodeNoImexChannel"
    return MULTI_NODE_BACKEND, "Verified"


def unreached_paths(
    policy: Policy, facts: NodeFacts | None, group: GroupPlan, fusion_of: contract.Fusion, release: str | None
) -> tuple[OffBy | None, tuple[str, ...]]:
    """How the FlashInfer allreduce paths that the fusion switches do not reach (vLLM's model-level
    fused ops) are turned off where the fusion is off: by the node's failing mnnvl workspace where the
    release turns that into NCCL on every path (``releases``), else not (they are named)."""
    if fusion_of == "on":
        return None, ()
    if (
        not group.multi
        and facts is not None
        and releases.FAILING_BACKEND not in facts.verified
        and releases.off_by_failing_mnnvl(release, facts.mnnvl_workspace)
    ):
        return OFF_BY_FAILING_MNNVL, ()
    return None, releases.model_level_callers(release)


def decide(
    policy: Policy,
    node: str,
    node_labels: Mapping[str, str] | None,
    group: GroupPlan = SINGLE,
    nodes: Mapping[str, Mapping[str, str]] | None = None,
    trigger: Trigger = "binding",
    time: str | None = None,
    budget: Budget | None = None,
    release: str | None = None,
    options: engine_options.Options = engine_options.NO_OPTIONS,
) -> Decision:
    """The decision for a pod of ``policy`` bound to ``node`` (whose labels may be unknown) whose selected
    containers run vLLM ``release`` (None: not known) with ``options``; a group's node walk spends
    ``budget`` and raises ``OverBudget`` past it (None: unbounded)."""
    facts = node_facts(node, node_labels) if node_labels is not None else None
    if group.multi:
        backend, reason = choose_for_group(policy, facts, group, nodes or {}, budget)
    else:
        backend, reason = choose(policy, facts)
    fusion_of = fusion(policy, reason)
    qualified = releases.qualified(release)
    if qualified is False and policy.fusion_control == "Enabled":
        # A release fiar has not qualified: the most conservative decision the node allows.
        fusion_of = "off"
    off_by, not_turned_off = unreached_paths(policy, facts, group, fusion_of, release)
    if off_by == OFF_BY_FAILING_MNNVL:
        backend = releases.FAILING_BACKEND
    decision = Decision(
        backend=backend,
        reason=reason,
        policy=policy.name,
        node=node,
        node_verdict=facts.verdict if facts and facts.verdict else None,
        trigger=trigger,
        time=time,
        group=group.key if group.multi else None,
        fusion=fusion_of,
        guard=guard(policy, facts),
        off_by=off_by,
        not_turned_off=not_turned_off,
        release=release,
        release_qualified=qualified,
        node_flashinfer=facts.flashinfer if facts is not None else None,
        pod_flashinfer=releases.flashinfer_pin(release),
        same_flashinfer_comm=releases.same_flashinfer_comm(
            releases.flashinfer_pin(release), facts.flashinfer if facts is not None else None
        ),
        sglang_flag=_sglang_flag(
            policy,
            fusion_of,
            reason,
            _verified_backends(policy, facts, group, reason),
            group.multi,
            facts.compute_capability if facts is not None else None,
        ),
    )
    return respect_options(decision, policy, facts, group, options)


def _sglang_flag(
    policy: Policy,
    fusion_of: contract.Fusion,
    reason: Reason,
    verified: frozenset[contract.Backend],
    multi: bool,
    compute_capability: tuple[int, int] | None = None,
) -> contract.SglangFlag:
    """SGLang's option for the decision: the engine's own choice under fusionControl Disabled (it
    leaves vLLM's fusion on too), else ``sglang.sglang_flag``."""
    if policy.fusion_control == "Disabled":
        return "engine"
    return sglang.sglang_flag(fusion_of, reason == VERIFIED_REASON, verified, multi, compute_capability)


def _verified_backends(
    policy: Policy, facts: NodeFacts | None, group: GroupPlan, reason: Reason
) -> frozenset[contract.Backend]:
    if group.multi:
        return frozenset({MULTI_NODE_BACKEND}) if reason == VERIFIED_REASON else frozenset()
    return verified_for(policy, facts) if facts is not None else frozenset()


def verified_for(policy: Policy, facts: NodeFacts) -> frozenset[contract.Backend]:
    """The backends of ``policy`` that a node verifies."""
    return frozenset(b for b in policy.backends if b in facts.verified)
