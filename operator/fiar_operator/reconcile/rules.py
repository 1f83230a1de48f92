"""What the reconciler changes on running pods, and the status it writes on policies: pure functions.

A bound, managed pod is re-annotated when
- it was bound without a binding decision (the operator was unavailable): it gets the decision
  now, which takes effect at its containers' next start;
- its node's verdict changed so that its backend is no longer verified there (drift);
- it belongs to a multi-pod group whose nodes no longer all verify mnnvl in one clique.
A backend that is still verified is left alone even when a better one appeared.

A pod that a policy selects but that carries no ``fiar.io/policy`` label was created before the
policy existed, or while the pod webhook was unavailable (it fails open). Its containers run with
vLLM's default and cannot be changed: it is reported (status count, condition, one Warning event)
until it is recreated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any, Final

import fiar_contract as contract
from fiar_operator.core import decide, nodefacts, releases
from fiar_operator.core.pods import PodRecord, group_plan, pod_options, vllm_release
from fiar_operator.core.policy import Policy, select_policy

UNCONFIGURED_EXAMPLES: Final = 3
"""Unconfigured pods named in the UnconfiguredPods condition message."""


@dataclass(frozen=True)
class Reannotation:
    pod: PodRecord
    decision: decide.Decision
    event_type: str
    event_reason: str
    message: str


def _missed(record: PodRecord) -> bool:
    doc = record.decision
    return doc is None or (doc.get("trigger") == "create" and doc.get("reason") == "Pending")


def _group_break(members: Iterable[PodRecord], nodes: Mapping[str, Mapping[str, str]]) -> str | None:
    """Why the bound members of a group break the multi-pod rule (``nodefacts.group_break``); None if they keep it."""
    return nodefacts.group_break(
        (f"node {m.node} of member {m.name}", nodefacts.node_facts(m.node, nodes.get(m.node, {})))
        for m in members
        if m.node is not None and m.active
    )


def _values(record: PodRecord, decision: decide.Decision | None = None) -> tuple[str | None, ...]:
    """The annotation values the pod's containers read: from ``decision``, or as the pod has them now.

    The backend always counts (a pod admitted before fiar controlled the fusion reads only that one)."""
    keys = [contract.ANNOTATION_POD_BACKEND, *sorted(k for k in contract.POD_ANNOTATION_VALUES if k in record.reads)]
    if decision is None:
        return tuple(record.annotation(k) for k in dict.fromkeys(keys))
    wanted = decision.annotations()
    return tuple(wanted.get(k) for k in dict.fromkeys(keys))


def _fusion_of(record: PodRecord) -> str:
    return "off" if record.fuse == contract.FUSE_ALLREDUCE_RMS["off"] else "on"


def review_pod(
    record: PodRecord,
    policy: Policy,
    nodes: Mapping[str, Mapping[str, str]],
    members: Sequence[PodRecord] = (),
    now: str | None = None,
) -> Reannotation | None:
    """The re-annotation a bound managed pod needs now, if any (``members``: its group's pods)."""
    if record.node is None or not record.active or record.policy != policy.name:
        return None
    group = group_plan(record, policy)
    labels = nodes.get(record.node)
    fresh = decide.decide(
        policy,
        record.node,
        labels,
        group,
        nodes,
        trigger="reconcile",
        time=now,
        release=vllm_release(record, policy),
        options=pod_options(record, policy),
    )
    broken = _group_break(members, nodes) if group.multi else None
    if broken is not None and fresh.backend == nodefacts.MULTI_NODE_BACKEND:
        fresh = replace(fresh, backend=policy.fallback, reason="MultiNodeNoSharedClique", fusion="off")
    current = record.backend
    fresh = replace(fresh, previous=current, previous_fusion=_fusion_of(record), previous_guard=record.guarded)
    same = _values(record, fresh) == _values(record)
    if _missed(record):
        missed = "bound while the binding webhook was unavailable"
        if same:
            return Reannotation(
                record, fresh, "Normal", "DecidedAfterBinding", f"{missed}; {current} confirmed on node {record.node}"
            )
        return Reannotation(
            record,
            fresh,
            "Warning",
            "DecidedAfterBinding",
            f"{missed}: {_change(record, fresh)} on node {record.node} ({fresh.reason}), "
            "effective at the next container start",
        )
    if same:
        return None
    facts = nodefacts.node_facts(record.node, labels) if labels is not None else None
    kept_ok = not group.multi and not fresh.not_applied and fresh.release_qualified is not False
    if facts is not None and current in decide.verified_for(policy, facts) and kept_ok:
        # The pod's backend is still verified: it keeps it (and its fusion); only what else changed on the
        # node (the multicast guard) is re-annotated.
        kept = replace(fresh, backend=current, fusion="on", off_by=None, not_turned_off=())
        if _values(record, kept) == _values(record):
            return None
        fresh = kept
    if group.multi and fresh.reason == "MultiNodeNoSharedClique" and facts is not None and nodefacts.joins_group(facts):
        # This pod's own node still verifies mnnvl: the group around it changed.
        broken = broken or "a node its placement admits does not verify mnnvl in the clique of the others"
        name = f"multi-pod group {group.key}" if group.key else "the multi-pod group"
        return Reannotation(
            record,
            fresh,
            "Warning",
            "GroupInconsistent",
            f"{name} no longer verifies mnnvl in one NVLink clique ({broken}): "
            f"{_change(record, fresh)} ({fresh.reason}), effective at the next container start",
        )
    verdict = facts.verdict if facts and facts.verdict else "unprobed"
    return Reannotation(
        record,
        fresh,
        "Warning",
        "NodeVerdictChanged",
        f"node {record.node} verdict is now {verdict}: {_change(record, fresh)} ({fresh.reason}), "
        "effective at the next container start",
    )


def _change(record: PodRecord, decision: decide.Decision) -> str:
    """``backend A -> B`` (and ``fusion on -> off`` for a pod whose command reads the fusion)."""
    text = f"backend {record.backend} -> {decision.backend}"
    if contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS in record.reads:
        text += f", fusion {_fusion_of(record)} -> {decision.fusion}"
    if any(g.annotation in record.reads for g in contract.MULTICAST_GUARD) and record.guarded != decision.guard:
        before = {True: "on", False: "off", None: "unset"}[record.guarded]
        text += f", multicast guard {before} -> {'on' if decision.guard else 'off'}"
    if contract.ANNOTATION_POD_SGLANG_FLAG in record.reads:
        was = f"--{record.sglang}" if record.sglang else "-"
        text += f", SGLang {was} -> --{contract.SGLANG_FLAGS[decision.sglang_flag]}"
    return text


def is_stale(record: PodRecord) -> bool:
    """Whether a running container started before the pod's backend last changed (it runs the old value)."""
    return contract.runs_an_older_decision(record.decision, record.container_starts.values())


def multi_node_warning(record: PodRecord, policy: Policy) -> str | None:
    """The Warning event message for a pod of a multi-pod group that got the fallback when it was
    decided at binding (or at CREATE, for a pod created with ``spec.nodeName``), if it did.

    A group gets mnnvl only with the reason ``Verified``; any other final reason is a fallback,
    whether the group rule refused mnnvl or the pod's own node could not give it (never probed,
    unknown, verdict without mnnvl).
    """
    doc = record.decision
    if not doc or doc.get("trigger") not in ("binding", "create") or doc.get("policy") != policy.name:
        return None
    reason = doc.get("reason")
    if reason in (decide.VERIFIED_REASON, "Pending") or not group_plan(record, policy).multi:
        return None
    node = doc.get("node") or record.node
    if reason == "MultiNodeNeedsMnnvl":
        why = "the policy does not allow mnnvl and trtllm is invalid across pods"
    elif reason == "MultiNodeNoSharedClique":
        why = "not every node the group may use verifies mnnvl in one NVLink clique"
    elif reason == "MultiNodeNoImexChannel":
        why = (
            "its pods carry no IMEX channel claim (a ComputeDomain channel, device class "
            f"{contract.IMEX_CHANNEL_DEVICE_CLASS}), which mnnvl across pods needs"
        )
    elif reason == "NotProbed":
        why = f"node {node} has no verdict yet (never probed by the fiar agent)"
    elif reason == "NodeUnknown":
        why = f"node {node} was not known to the operator"
    else:
        why = f"node {node} does not verify mnnvl (verdict {doc.get('nodeVerdict') or 'unprobed'})"
    group = f"multi-pod group {doc['group']}" if doc.get("group") else "multi-pod group"
    runs = f"{doc.get('backend')}, fusion {doc['fusion']}" if doc.get("fusion") else doc.get("backend")
    return f"{group}: {why}; it runs with {runs}"


def not_turned_off(record: PodRecord) -> list[str]:
    """The FlashInfer allreduce paths a bound pod whose containers read the fusion decision still runs
    although its fusion is off (its decision's ``notTurnedOff``)."""
    if record.node is None or contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS not in record.reads:
        return []
    paths = (record.decision or {}).get("notTurnedOff")
    return [str(p) for p in paths[:8]] if isinstance(paths, list) else []


def not_turned_off_message(record: PodRecord, paths: Sequence[str]) -> str:
    release = (record.decision or {}).get("release")
    return (
        f"fusion is off on node {record.node}, but fiar could not turn off the model-level FlashInfer allreduce "
        f"of: {', '.join(paths)} "
        f"(vLLM {release or 'release unknown'}: no value turns them off there without a crash; "
        "docs/vllm-flashinfer-paths.md). Set spec.vllmRelease or use a vllm/vllm-openai:vX.Y.Z image "
        "where the release is one fiar checked."
    )


def release_not_qualified(record: PodRecord) -> str | None:
    """The release of a pod whose decision says fiar has not qualified it (None: qualified or unknown)."""
    doc = record.decision or {}
    release = doc.get("release")
    return str(release)[:40] if doc.get("releaseQualified") is False and release else None


def release_not_qualified_message(policy: str, release: str) -> str:
    return (
        f"vLLM {release} is not a release fiar qualified (newest qualified line: {releases.newest_qualified()}): "
        f"pods of policy {policy} on it get the most conservative decision their node allows (FlashInfer "
        "allreduce fusion and standalone allreduce off, the multicast guard as the node needs it). Qualify it "
        f"with bench/engine_release.py vllm {release} (docs/vllm-flashinfer-paths.md#qualifying-a-release)."
    )


def not_applied(record: PodRecord) -> list[str]:
    """The values a pod's decision left out because an option of its command makes the engine refuse
    them (its decision's ``notApplied``), each with why."""
    values = (record.decision or {}).get("notApplied")
    return [str(v)[:400] for v in values[:4]] if isinstance(values, list) else []


def not_applied_message(record: PodRecord, values: Sequence[str]) -> str:
    release = (record.decision or {}).get("release")
    where = f"on node {record.node}" if record.node else "before binding"
    return (
        f"{where} (vLLM {release or 'release unknown'}): {'; '.join(values)}. "
        "The pod runs without these values of fiar (docs/vllm-flashinfer-paths.md#options-that-fiars-values-break)."
    )


def uncontrolled_containers(record: PodRecord, policy: Policy) -> list[str]:
    """The containers of a managed pod whose fusion the policy should control but fiar cannot: their
    command is not one it understands (see ``commands``)."""
    if policy.fusion_control != "Enabled" or policy.mode != "Enforce" or record.policy != policy.name:
        return []
    explicit = {name for name, own in record.containers if own and policy.respect_explicit_env}
    return [
        name
        for name in record.uncontrolled
        if name not in explicit and any(fnmatchcase(name, glob) for glob in policy.containers)
    ]


def uncontrolled_message(record: PodRecord, names: Sequence[str]) -> str:
    reasons = record.uncontrolled_reasons
    why = "; ".join(f"{name}: {reasons[name]}" for name in names if name in reasons)
    return (
        f"fiar cannot switch the FlashInfer allreduce fusion in container(s) {', '.join(names)}: their command "
        f"is not one it understands, so it is left as it is; on nodes without a verified backend they run with "
        f"{contract.ENV_VAR}={record.backend} only. Use exec form 'vllm serve ...' or put "
        f"$({contract.ENV_VLLM_ARGS}) after 'vllm serve' in a shell command (SGLang: exec form "
        f"'python3 -m sglang.launch_server ...', or \"${{{contract.ENV_SGLANG_ARGS}}}\" right after it)"
        + (f" ({why})" if why else "")
    )


# -- pods the pod webhook never saw ----------------------------------------------------------------
def selects_a_container(record: PodRecord, policy: Policy) -> bool:
    """Whether the pod webhook would give one of the pod's containers the variable under ``policy``."""
    return any(
        any(fnmatchcase(name, glob) for glob in policy.containers) and not (explicit and policy.respect_explicit_env)
        for name, explicit in record.containers
    )


def unconfigured_by(
    record: PodRecord, policies: Iterable[Policy], namespace_labels: Mapping[str, str] | None
) -> Policy | None:
    """The policy that selects a pod the pod webhook never configured (no ``fiar.io/policy`` label).

    None for a managed or finished pod, a pod in a namespace labelled ``fiar.io/ignore`` or not in
    the namespace index (nothing is known of it), a pod whose containers the policy leaves alone, and
    a pod of an Audit policy (the webhook would have changed nothing in it).
    """
    if record.managed or not record.active or not record.containers or namespace_labels is None:
        return None
    if contract.NAMESPACE_IGNORE_LABEL in namespace_labels:
        return None
    policy = select_policy(policies, namespace_labels, record.labels)
    if policy is None or policy.mode != "Enforce" or not selects_a_container(record, policy):
        return None
    return policy


def unconfigured_message(policy: Policy) -> str:
    """The Warning event message for a pod that ``policy`` selects but the pod webhook never configured."""
    return (
        f"policy {policy.name} selects this pod, but it was created before the policy or while the fiar pod "
        f"webhook was unavailable: its containers run with vLLM's default {contract.ENV_VAR} (auto), "
        "not a verified backend; recreate the pod (e.g. kubectl rollout restart) to apply the policy"
    )


# -- policy status ---------------------------------------------------------------------------------
def _condition(
    previous: Sequence[Mapping[str, Any]], kind: str, status: bool, reason: str, message: str, generation: int, now: str
) -> dict[str, Any]:
    value = "True" if status else "False"
    old = next((c for c in previous if c.get("type") == kind), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == value else None
    return {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since or now,
    }


def node_counts(policy: Policy, nodes: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
    """Nodes per verdict, and the nodes that verify a backend ``policy`` allows: one pass over every
    node (tens of milliseconds at 10,000 nodes), so the status writer keeps it until a node changes."""
    counts = dict.fromkeys([*contract.BACKEND_VERDICTS, "unprobed", "verified"], 0)
    for name, labels in nodes.items():
        facts = nodefacts.node_facts(name, labels)
        # A verdict the counts do not know (untrusted input) counts as unprobed, as decide reads it.
        counts[facts.verdict if facts.verdict in counts else "unprobed"] += 1
        if decide.verified_for(policy, facts):
            counts["verified"] += 1
    return counts


POD_COUNTS: Final = (
    "decided",
    "fallback",
    "pending",
    "stale",
    "unconfigured",
    "fusionOff",
    "fusionUncontrolled",
    "multicastGuarded",
    "flashinferNotTurnedOff",
    "valuesNotApplied",
    "releaseNotQualified",
)
"""The pod counts of a policy's status, in the order ``status.pods`` lists them."""


def pod_outcome(pod: PodRecord, policy: Policy) -> tuple[str, ...]:
    """The counts of ``policy``'s status that ``pod`` adds one to (none: ended, deleted, or another
    policy's). A pure function of the two immutable records, so a caller may keep it per record."""
    if not pod.active or pod.policy != policy.name:
        return ()
    found = ["fusionUncontrolled"] if uncontrolled_containers(pod, policy) else []
    if pod.node is None:
        return _outcome((*found, "pending"))
    reason = (pod.decision or {}).get("reason")
    found.append("decided" if reason == decide.VERIFIED_REASON else "fallback")
    if (contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS in pod.reads and _fusion_of(pod) == "off") or (
        contract.ANNOTATION_POD_SGLANG_FLAG in pod.reads and pod.sglang == contract.SGLANG_FLAGS["off"]
    ):
        found.append("fusionOff")
    if pod.guarded and any(g.annotation in pod.reads for g in contract.MULTICAST_GUARD):
        found.append("multicastGuarded")
    if not_turned_off(pod):
        found.append("flashinferNotTurnedOff")
    if not_applied(pod):
        found.append("valuesNotApplied")
    if release_not_qualified(pod):
        found.append("releaseNotQualified")
    if is_stale(pod):
        found.append("stale")
    return _outcome(tuple(found))


def _outcome(outcome: tuple[str, ...]) -> tuple[str, ...]:
    return OUTCOMES.setdefault(outcome, outcome)


OUTCOMES: Final[dict[tuple[str, ...], tuple[str, ...]]] = {}
"""One tuple per distinct outcome (``status.Outcomes`` keeps one per pod; the counts' names are
this module's constants, so the outcomes are few)."""


def policy_status(
    policy: Policy,
    nodes: Mapping[str, Mapping[str, str]],
    pods: Iterable[PodRecord],
    previous: Mapping[str, Any] | None,
    now: str,
    unconfigured: Sequence[str] = (),
    counts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The status subresource of a policy from the indexes (``unconfigured``: ``namespace/name`` of the
    pods the policy selects that the pod webhook never configured, see ``unconfigured_by``;
    ``counts``: ``node_counts(policy, nodes)`` when the caller has it already)."""
    counts = counts if counts is not None else node_counts(policy, nodes)
    return status_of(policy, [pod_outcome(pod, policy) for pod in pods], previous, now, unconfigured, counts)


def status_of(
    policy: Policy,
    outcomes: Iterable[tuple[str, ...]],
    previous: Mapping[str, Any] | None,
    now: str,
    unconfigured: Sequence[str],
    counts: Mapping[str, int],
    recreated: int = 0,
) -> dict[str, Any]:
    """``policy_status`` from the ``pod_outcome`` of each pod the policy selects (``recreated``: the
    unconfigured pods evicted for their controller to recreate, shown only once there are any)."""
    counts = dict(counts)
    outcome = dict.fromkeys(POD_COUNTS, 0)
    outcome["unconfigured"] = len(unconfigured)
    if recreated:
        outcome["recreated"] = recreated
    for found in outcomes:
        for key in found:
            outcome[key] += 1
    old_conditions = list((previous or {}).get("conditions") or [])
    managed = outcome["decided"] + outcome["fallback"] + outcome["pending"]
    allowed = ", ".join(policy.backends)
    conditions = [
        _condition(
            old_conditions,
            "Ready",
            True,
            "Active",
            f"{managed} pods managed; {counts['verified']} nodes verify one of: {allowed}",
            policy.generation,
            now,
        ),
        _condition(
            old_conditions,
            "NoVerifiedNodes",
            counts["verified"] == 0,
            "NoVerifiedNodes" if counts["verified"] == 0 else "VerifiedNodesPresent",
            f"no node verifies any of: {allowed}; pods get {policy.fallback}"
            if counts["verified"] == 0
            else f"{counts['verified']} nodes verify one of: {allowed}",
            policy.generation,
            now,
        ),
        _condition(
            old_conditions,
            "UnconfiguredPods",
            bool(unconfigured),
            "PodsNotConfigured" if unconfigured else "AllPodsConfigured",
            _unconfigured_summary(unconfigured),
            policy.generation,
            now,
        ),
    ]
    return {"observedGeneration": policy.generation, "nodes": counts, "pods": outcome, "conditions": conditions}


def _unconfigured_summary(pods: Sequence[str]) -> str:
    if not pods:
        return "every pod this policy selects was configured when it was created"
    examples = ", ".join(pods[:UNCONFIGURED_EXAMPLES]) + (", ..." if len(pods) > UNCONFIGURED_EXAMPLES else "")
    return (
        f"{len(pods)} pods this policy selects ({examples}) were created before it or while the pod webhook "
        "was unavailable; they run with vLLM's default (auto) until recreated (e.g. kubectl rollout restart)"
    )


def invalid_status(generation: int, error: str, previous: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    old = list((previous or {}).get("conditions") or [])
    return {
        "observedGeneration": generation,
        "conditions": [_condition(old, "Ready", False, "InvalidSpec", error, generation, now)],
    }


def same_status(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Whether writing ``b`` over ``a`` would change nothing."""
    return a is not None and all(a.get(k) == v for k, v in b.items())
