"""Which backend a managed pod gets on a node: pure functions over node labels and the pod's policy.

A node *verifies* a backend when the agent's verdict label names it, or when the verdict is
``mnnvl`` and the trtllm smoke test also passed. A pod gets the first backend of its policy's
``backends`` that its node verifies, else the policy's ``fallbackBackend``.

A multi-pod group (a LeaderWorkerSet group of size > 1, or every pod of a policy with
``multiNode: Always``) spans pods, which vLLM treats as separate nodes: trtllm then raises, so only
mnnvl qualifies, and only when every node the group may land on verifies mnnvl and all of them share
one NVLink clique. A group is *pinned* when its pods carry the constraints the pod webhook injects
for that (required node affinity on mnnvl nodes with a clique, and a required pod affinity that keeps
the group in one clique); an unpinned group qualifies only when every node its placement admits
already meets the rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import fiar_contract as contract
from fiar_operator.policy import Policy
from fiar_operator.selectors import ANYWHERE, NodeConstraint

Reason = Literal[
    "Verified",
    "NotVerified",
    "NotProbed",
    "NodeUnknown",
    "Pending",
    "MultiNodeNeedsMnnvl",
    "MultiNodeNoSharedClique",
]
Trigger = Literal["create", "binding", "reconcile"]

VERIFIED_REASON: Final = "Verified"
MAX_DECISION_LENGTH: Final = 4096
"""Longest fiar.io/decision annotation that is parsed; the operator writes about 200 characters."""


@dataclass(frozen=True)
class NodeFacts:
    """What the agent's labels say about one node."""

    name: str
    verdict: contract.Verdict | None
    """``None`` when the node has no (valid) fiar.io/backend label: never probed."""
    verified: frozenset[contract.Backend]
    clique: str | None


def node_facts(name: str, labels: Mapping[str, str]) -> NodeFacts:
    raw = labels.get(contract.LABEL_BACKEND)
    verdict: contract.Verdict | None = None
    verified: set[contract.Backend] = set()
    for candidate in contract.BACKEND_VERDICTS:
        if raw == candidate:
            verdict = candidate
    if verdict == "mnnvl":
        verified.add("mnnvl")
        if labels.get(contract.LABEL_TRTLLM) == "pass":
            verified.add("trtllm")
    elif verdict == "trtllm":
        verified.add("trtllm")
    return NodeFacts(name, verdict, frozenset(verified), labels.get(contract.LABEL_CLIQUE) or None)


@dataclass(frozen=True)
class GroupPlan:
    """How a pod relates to a multi-pod group."""

    multi: bool = False
    key: str | None = None
    pinned: bool = False
    constraint: NodeConstraint = ANYWHERE


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

    @property
    def verified(self) -> bool:
        return self.reason == VERIFIED_REASON

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "backend": self.backend,
            "node": self.node,
            "nodeVerdict": self.node_verdict,
            "policy": self.policy,
            "reason": self.reason,
            "trigger": self.trigger,
        }
        for key, value in (("time", self.time), ("previous", self.previous), ("group", self.group)):
            if value is not None:
                doc[key] = value
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


def pending(policy: Policy) -> Decision:
    """The CREATE-time decision of a pod not yet bound: the fallback, replaced at binding."""
    return Decision(policy.fallback, "Pending", policy.name, trigger="create")


def choose(policy: Policy, facts: NodeFacts | None) -> tuple[contract.EnvValue, Reason]:
    """The backend for a single-pod workload on a node."""
    if facts is None:
        return policy.fallback, "NodeUnknown"
    if facts.verdict is None:
        return policy.fallback, "NotProbed"
    for backend in policy.backends:
        if backend in facts.verified:
            return backend, "Verified"
    return policy.fallback, "NotVerified"


def _group_ok(candidates: Iterable[NodeFacts]) -> bool:
    cliques = set()
    count = 0
    for facts in candidates:
        count += 1
        if "mnnvl" not in facts.verified or facts.clique is None:
            return False
        cliques.add(facts.clique)
    return count > 0 and len(cliques) == 1


def choose_for_group(
    policy: Policy,
    facts: NodeFacts | None,
    group: GroupPlan,
    nodes: Mapping[str, Mapping[str, str]],
) -> tuple[contract.EnvValue, Reason]:
    """The backend for one pod of a multi-pod group bound to ``facts``' node."""
    if "mnnvl" not in policy.backends:
        return policy.fallback, "MultiNodeNeedsMnnvl"
    if facts is None:
        return policy.fallback, "NodeUnknown"
    if facts.verdict is None:
        return policy.fallback, "NotProbed"
    if "mnnvl" not in facts.verified or facts.clique is None:
        return policy.fallback, "MultiNodeNoSharedClique"
    if group.pinned:
        return "mnnvl", "Verified"
    # list() copies the items in one step, so an informer adding a node meanwhile cannot break the loop.
    candidates = [node_facts(name, labels) for name, labels in list(nodes.items()) if group.constraint.admits(labels)]
    if _group_ok(candidates):
        return "mnnvl", "Verified"
    return policy.fallback, "MultiNodeNoSharedClique"


def decide(
    policy: Policy,
    node: str,
    node_labels: Mapping[str, str] | None,
    group: GroupPlan = SINGLE,
    nodes: Mapping[str, Mapping[str, str]] | None = None,
    trigger: Trigger = "binding",
    time: str | None = None,
) -> Decision:
    """The decision for a pod of ``policy`` bound to ``node`` (whose labels may be unknown)."""
    facts = node_facts(node, node_labels) if node_labels is not None else None
    if group.multi:
        backend, reason = choose_for_group(policy, facts, group, nodes or {})
    else:
        backend, reason = choose(policy, facts)
    return Decision(
        backend=backend,
        reason=reason,
        policy=policy.name,
        node=node,
        node_verdict=facts.verdict if facts and facts.verdict else None,
        trigger=trigger,
        time=time,
        group=group.key if group.multi else None,
    )


def verified_for(policy: Policy, facts: NodeFacts) -> frozenset[contract.Backend]:
    """The backends of ``policy`` that a node verifies."""
    return frozenset(b for b in policy.backends if b in facts.verified)
