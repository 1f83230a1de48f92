"""The pod CREATE mutation: which containers get the env var, and the JSONPatch that says so.

The patch is computed against the pod as it arrives, so a reinvocation (``reinvocationPolicy:
IfNeeded``) or a pod that already went through the webhook yields no new operations: there is never a
second env entry, label or affinity term.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Final

import fiar_contract as contract
from fiar_operator import affinity, decide, patches
from fiar_operator.pods import FIELD_PATH, group_plan, is_injected, pod_record
from fiar_operator.policy import Policy

ENV_ENTRY: Final = {
    "name": contract.ENV_VAR,
    "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": FIELD_PATH}},
}


@dataclass(frozen=True)
class PodPlan:
    policy: Policy | None
    ops: list[patches.Op] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    decision: decide.Decision | None = None
    pod: Mapping[str, Any] = field(default_factory=dict)
    """The pod as it will be stored (the input with ``ops`` applied)."""

    @property
    def managed(self) -> bool:
        return self.decision is not None


def reads_backend(pod: Mapping[str, Any]) -> bool:
    """Whether a container (or init container) of the pod has the injected env entry."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else []:
            env = container.get("env") if isinstance(container, Mapping) else None
            if isinstance(env, list) and any(isinstance(e, Mapping) and is_injected(e) for e in env):
                return True
    return False


def default_backend_ops(pod: Mapping[str, Any]) -> list[patches.Op]:
    """``fiar.io/backend=auto`` for a pod whose containers read that annotation but that lacks it.

    Such a pod carries the injected env entry without a policy taking it (e.g. copied from a live
    pod into a template). The kubelet would resolve the variable to "" and vLLM would raise
    ValueError; ``auto`` is vLLM's own default.
    """
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if isinstance(annotations, Mapping) and contract.ANNOTATION_POD_BACKEND in annotations:
        return []
    if not reads_backend(pod):
        return []
    return patches.set_map_entries(pod, ("metadata", "annotations"), {contract.ANNOTATION_POD_BACKEND: "auto"})


def _container_ops(
    policy: Policy, index: int, container: Mapping[str, Any], warnings: list[str]
) -> list[patches.Op] | None:
    """Ops for one container matching the globs; None when the container is left alone."""
    name = str(container.get("name", ""))
    env = container.get("env") or []
    if not isinstance(env, list):
        warnings.append(f"container {name}: env is not a list; left alone")
        return None
    hits = [j for j, e in enumerate(env) if isinstance(e, Mapping) and e.get("name") == contract.ENV_VAR]
    explicit = [j for j in hits if not is_injected(env[j])]
    if explicit and policy.respect_explicit_env:
        warnings.append(f"container {name} sets {contract.ENV_VAR} itself; left alone (respectExplicitEnv)")
        return None
    if policy.mode == "Audit":
        return []
    base = ("spec", "containers", index, "env")
    ops: list[patches.Op] = []
    if not hits:
        if env:
            ops.append({"op": "add", "path": patches.pointer(*base, "-"), "value": copy.deepcopy(ENV_ENTRY)})
        else:
            ops.append({"op": "add", "path": patches.pointer(*base), "value": [copy.deepcopy(ENV_ENTRY)]})
    else:
        if explicit and hits[0] in explicit:
            ops.append({"op": "replace", "path": patches.pointer(*base, hits[0]), "value": copy.deepcopy(ENV_ENTRY)})
            warnings.append(f"container {name}: its own {contract.ENV_VAR} replaced (respectExplicitEnv: false)")
        ops += [{"op": "remove", "path": patches.pointer(*base, j)} for j in reversed(hits[1:])]
    if container.get("envFrom"):
        warnings.append(f"container {name} uses envFrom; the injected {contract.ENV_VAR} takes precedence")
    return ops


def _placement_ops(policy: Policy, pod: Mapping[str, Any], multi: bool, warnings: list[str]) -> list[patches.Op]:
    spec = pod.get("spec") or {}
    current = spec.get("affinity")
    if policy.placement != "VerifiedNodesOnly" or policy.mode == "Audit" or spec.get("nodeName"):
        return []
    if multi and "mnnvl" in policy.backends:
        wanted = affinity.merge_node_requirements(
            current, [affinity.backend_requirement(["mnnvl"]), affinity.clique_requirement()]
        )
        key = ((pod.get("metadata") or {}).get("labels") or {}).get(policy.group_key_label)
        if key:
            wanted = affinity.merge_pod_affinity(wanted, affinity.clique_pod_affinity(policy.group_key_label, key))
        else:
            warnings.append(f"multi-pod group without label {policy.group_key_label}: not kept in one NVLink clique")
    else:
        wanted = affinity.merge_node_requirements(current, affinity.verified_requirements(policy.backends))
    return [] if wanted == current else [{"op": "add", "path": "/spec/affinity", "value": wanted}]


def plan_pod_create(
    pod: Mapping[str, Any],
    policy: Policy | None,
    nodes: Mapping[str, Mapping[str, str]],
) -> PodPlan:
    """The mutation for a pod being created, given the policy that manages it (if any).

    ``nodes`` maps node names to labels; it is read only for a pod created with ``spec.nodeName``
    (decided at once) or a multi-pod group that must check its candidate nodes.
    """
    if policy is None:
        return PodPlan(None, pod=pod)
    spec = pod.get("spec") or {}
    warnings: list[str] = []
    ops: list[patches.Op] = []
    selected = 0
    for index, container in enumerate(spec.get("containers") or []):
        if not isinstance(container, Mapping):
            continue
        if not any(fnmatchcase(str(container.get("name", "")), g) for g in policy.containers):
            continue
        container_ops = _container_ops(policy, index, container, warnings)
        if container_ops is not None:
            selected += 1
            ops += container_ops
    if not selected:
        warnings.append(f"policy {policy.name} matches this pod but selects none of its containers")
        return PodPlan(policy, warnings=warnings, pod=pod)

    group = group_plan(pod_record(pod), policy)
    if group.multi and "mnnvl" not in policy.backends:
        warnings.append(f"multi-pod group: trtllm is invalid across pods; it gets {policy.fallback}")
    elif group.multi and policy.placement == "Anywhere" and policy.mode == "Enforce":
        warnings.append("multi-pod group, placement Anywhere: mnnvl only if all candidate nodes share one clique")
    ops += _placement_ops(policy, pod, group.multi, warnings)
    ops += patches.set_map_entries(pod, ("metadata", "labels"), {contract.LABEL_POD_POLICY: policy.name})
    after = patches.apply(copy.deepcopy(dict(pod)), ops)

    node = spec.get("nodeName")
    if node:
        decision = decide.decide(
            policy, str(node), nodes.get(str(node)), group_plan(pod_record(after), policy), nodes, trigger="create"
        )
        if policy.placement == "VerifiedNodesOnly" and not decision.verified:
            warnings.append(f"spec.nodeName {node} verifies no allowed backend; it gets {decision.backend}")
    else:
        decision = decide.pending(policy)
    meta_ops = patches.set_map_entries(
        after,
        ("metadata", "annotations"),
        {
            contract.ANNOTATION_POD_BACKEND: decision.backend,
            contract.ANNOTATION_POD_DECISION: decision.to_json(),
        },
    )
    patches.apply(after, meta_ops)
    return PodPlan(policy, ops + meta_ops, warnings, decision, after)
