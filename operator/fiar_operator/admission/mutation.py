"""The pod CREATE mutation: which containers get the env vars, how their commands read the fusion
decision (``commands.py``), and the JSONPatch that says so.

The patch is computed against the pod as it arrives, so a reinvocation (``reinvocationPolicy:
IfNeeded``) or a pod that already went through the webhook yields no new operations: there is never a
second env entry, label, affinity term or flag.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Final

import fiar_contract as contract
from fiar_operator.core import affinity, commands, decide, nodefacts, patches
from fiar_operator.core.limits import Budget
from fiar_operator.core.pods import (
    INJECTED,
    PodRecord,
    annotations_read,
    field_path,
    group_plan,
    is_injected,
    lws_size,
    multi_pod,
    pod_options,
    pod_record,
    vllm_release,
)
from fiar_operator.core.policy import Policy


def injected_entry(name: str) -> dict[str, Any]:
    """The env entry that reads variable ``name`` from its pod annotation (see ``pods.INJECTED``)."""
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path(INJECTED[name])}}}


ENV_ENTRY: Final = injected_entry(contract.ENV_VAR)


def fusion_entries(engine: str = "vllm") -> list[dict[str, Any]]:
    """Fresh copies of fiar's fusion variables for an engine's container (its row in
    ``commands.ENGINES``); first in the env list, so that any later variable (VLLM_ADDITIONAL_ARGS) may
    refer to them."""
    row = commands.ENGINE[engine]
    return [injected_entry(name) for name in row.injected] + [{"name": n, "value": v} for n, v in row.values]


FUSION_NAMES: Final = frozenset(
    name for row in commands.ENGINES for name in (*row.injected, *(n for n, _v in row.values))
)
UNMANAGED_DEFAULTS: Final = {
    contract.ANNOTATION_POD_BACKEND: "auto",
    contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: contract.FUSE_ALLREDUCE_RMS["on"],
    contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER: contract.ALLREDUCE_USE_FLASHINFER["on"],
    **{g.annotation: g.own for g in contract.MULTICAST_GUARD},
    contract.ANNOTATION_POD_SGLANG_FLAG: contract.SGLANG_FLAGS["engine"],
}
"""The engines' own defaults, for a pod that reads fiar's annotations without a policy taking it."""


@dataclass(frozen=True)
class PodPlan:
    policy: Policy | None
    ops: list[patches.Op] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    decision: decide.Decision | None = None
    pod: Mapping[str, Any] = field(default_factory=dict)
    """The pod as it will be stored (the input with ``ops`` applied)."""
    record: PodRecord | None = None
    """``pod``'s record as far as a decision reads it (no command parsed), built once per review:
    what the binding memo keeps. None where no policy configures the pod."""

    @property
    def managed(self) -> bool:
        return self.decision is not None


def _reads(pod: Mapping[str, Any]) -> frozenset[str]:
    spec = pod.get("spec")
    return annotations_read(spec) if isinstance(spec, Mapping) else frozenset()


def default_backend_ops(pod: Mapping[str, Any]) -> list[patches.Op]:
    """vLLM's defaults (``fiar.io/backend=auto``, the fusion as the container sets it) for the fiar
    annotations a pod's containers read but the pod lacks, or holds with a value outside
    ``contract.POD_ANNOTATION_VALUES`` (which the containers would read into their command lines).

    Such a pod carries injected env entries without a policy taking it (e.g. copied from a live pod
    into a template). The kubelet would resolve a variable to "": vLLM raises ValueError on an empty
    backend or VLLM_ALLREDUCE_USE_FLASHINFER, and an empty fusion value breaks its command line.
    """
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    present = annotations if isinstance(annotations, Mapping) else {}
    missing = {
        key: UNMANAGED_DEFAULTS[key]
        for key in sorted(_reads(pod))
        if contract.pod_annotation_value(key, present.get(key)) is None
    }
    if not missing:
        return []
    return patches.set_map_entries(pod, ("metadata", "annotations"), missing)


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


def _fusion_env(env: list[Any], plan: commands.CommandPlan, respect: bool) -> list[Any]:
    """The env list with fiar's fusion variables first, VLLM_ADDITIONAL_ARGS extended, and the
    standalone FlashInfer allreduce switch read from its annotation (a container's own value is kept
    under respectExplicitFusion)."""
    rest = [e for e in env if not (isinstance(e, Mapping) and e.get("name") in FUSION_NAMES)]
    out: list[Any] = fusion_entries(plan.engine) + rest
    if not commands.ENGINE[plan.engine].standalone:
        return out
    if plan.additional_args is not None:
        at = [j for j, e in enumerate(out) if isinstance(e, Mapping) and e.get("name") == commands.ADDITIONAL_ARGS]
        entry = {"name": commands.ADDITIONAL_ARGS, "value": plan.additional_args}
        if at:
            out[at[0]] = entry
        else:
            out.append(entry)
    hits = [
        j
        for j, e in enumerate(out)
        if isinstance(e, Mapping) and e.get("name") == contract.ENV_ALLREDUCE_USE_FLASHINFER
    ]
    if not hits:
        out.append(injected_entry(contract.ENV_ALLREDUCE_USE_FLASHINFER))
    elif not respect and not all(is_injected(out[j]) for j in hits):
        # The kubelet takes the last of duplicate names: keep one entry, ours, where the first was.
        out[hits[0]] = injected_entry(contract.ENV_ALLREDUCE_USE_FLASHINFER)
        out = [e for j, e in enumerate(out) if j not in hits[1:]]
    return out


def _fusion_ops(
    policy: Policy, index: int, container: Mapping[str, Any], plan: commands.CommandPlan, warnings: list[str]
) -> list[patches.Op]:
    """Ops that make a container's command read the fusion decision (``plan``: how ``commands`` reads it).

    A command with fiar's placeholder always gets the variables it refers to; other commands are
    changed only under ``fusionControl: Enabled``, and only when ``commands`` understands them.
    """
    name = str(container.get("name", ""))
    if plan.form != "placeholder":
        if policy.fusion_control == "Disabled":
            return []
        if plan.explicit:
            what = commands.ENGINE[plan.engine].explicit
            warnings.append(f"container {name} sets {what} itself; left alone (respectExplicitFusion)")
            return []
        if not plan.understood:
            if plan.mentions_vllm:
                warnings.append(f"container {name}: fusion not controlled: {plan.reason}")
            return []
    env = container.get("env") or []
    own = [e for e in env if isinstance(e, Mapping) and e.get("name") == contract.ENV_ALLREDUCE_USE_FLASHINFER]
    if own and not is_injected(own[0]) and policy.respect_explicit_fusion and commands.ENGINE[plan.engine].standalone:
        warnings.append(f"container {name} sets {contract.ENV_ALLREDUCE_USE_FLASHINFER} itself; kept")
    base = ("spec", "containers", index)
    ops: list[patches.Op] = []
    for key, value in (("command", plan.command), ("args", plan.args)):
        if value is not None:
            ops.append({"op": "add", "path": patches.pointer(*base, key), "value": list(value)})
    new_env = _fusion_env(list(env), plan, policy.respect_explicit_fusion)
    if new_env != env:
        ops.append({"op": "add", "path": patches.pointer(*base, "env"), "value": new_env})
    return ops


_NCCL_NUMBER: Final = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\s*")


def nccl_nvls_reading(value: str) -> str:
    """How NCCL reads a ``NCCL_NVLS_ENABLE`` value fiar does not write, per NCCL release (its own parser,
    ``ncclParamNvlsEnable``, run on 2.31.2 and 2.32.6 by bench/nccl_param_check.py)."""
    found = _NCCL_NUMBER.fullmatch(value)
    if found is not None:
        digits = found.group(2)
        base = 16 if digits[:2].lower() == "0x" else 8 if digits.startswith("0") and len(digits) > 1 else 10
        number = int(found.group(1) + digits, base)
        meaning = {0: "NVLS off", 2: "auto: NVLS where the device supports multicast"}.get(number, "NVLS on")
        return f"NCCL reads it as {number} ({meaning})"
    return (
        "NCCL up to 2.31 reads it as 0 (NVLS off), NCCL 2.32 as its default 2 (auto: NVLS on where the device "
        "supports multicast)"
    )


def _guard_env(env: list[Any], name: str, respect: bool, warnings: list[str], skip: tuple[str, ...] = ()) -> list[Any]:
    """The env list with each multicast-guard variable read from its annotation (``contract.MULTICAST_GUARD``).

    A container's own entry is kept under respectExplicitEnv and replaced without it; an entry whose
    value fiar does not know (empty, ``false``, ``2``, or read from elsewhere) is always kept and
    reported, never overwritten or duplicated."""
    out = list(env)
    for guard in contract.MULTICAST_GUARD:
        if guard.env in skip:
            continue
        hits = [j for j, e in enumerate(out) if isinstance(e, Mapping) and e.get("name") == guard.env]
        own = [j for j in hits if not is_injected(out[j])]
        if not hits:
            out.append(injected_entry(guard.env))
            continue
        odd = [j for j in own if set(out[j]) - {"name", "value"} or out[j].get("value") not in (guard.off, guard.own)]
        if odd:
            value = out[odd[0]].get("value", "from valueFrom")
            reading = (
                f" ({nccl_nvls_reading(value)})"
                if guard.env == "NCCL_NVLS_ENABLE" and isinstance(value, str) and "value" in out[odd[0]]
                else ""
            )
            warnings.append(
                f"container {name} sets {guard.env} to {value!r}{reading}, not a value fiar knows ({guard.off!r} or "
                f"{guard.own!r}); kept, {guard.consumer} is not guarded in it"
            )
            continue
        if own and respect:
            value = out[own[0]].get("value")
            warnings.append(f"container {name} sets {guard.env}={value!r} itself; kept (respectExplicitEnv)")
            continue
        if own:
            warnings.append(f"container {name}: its own {guard.env} replaced (respectExplicitEnv: false)")
        # The kubelet takes the last of duplicate names: keep one entry, ours, where the first was.
        out[hits[0]] = injected_entry(guard.env)
        out = [e for j, e in enumerate(out) if j not in hits[1:]]
    return out


def _guard_ops(
    policy: Policy, index: int, container: Mapping[str, Any], engine: commands.Engine, warnings: list[str]
) -> list[patches.Op]:
    """Ops that make a container (of ``engine``) read the multicast guard from the pod's annotations."""
    env = container.get("env") or []
    name = str(container.get("name", ""))
    words = [str(w) for key in ("command", "args") for w in (container.get(key) or []) if isinstance(w, str)]
    forced = [f for f in engine.forces_multicast if any(w == f or w.startswith(f + "=") for w in words)]
    if forced:
        warnings.append(
            f"container {name} passes {', '.join(forced)}: {engine.label} then sets "
            f"{', '.join(engine.guards_itself)} on itself, and the multicast guard cannot keep it off"
        )
    new_env = _guard_env(list(env), name, policy.respect_explicit_env, warnings, engine.guards_itself)
    if new_env == env:
        return []
    return [{"op": "add", "path": patches.pointer("spec", "containers", index, "env"), "value": new_env}]


def _placement_ops(policy: Policy, pod: Mapping[str, Any], multi: bool, warnings: list[str]) -> list[patches.Op]:
    spec = pod.get("spec") or {}
    current = spec.get("affinity")
    if policy.placement != "VerifiedNodesOnly" or policy.mode == "Audit" or spec.get("nodeName"):
        return []
    if multi and nodefacts.MULTI_NODE_BACKEND in policy.backends:
        wanted = affinity.merge_node_requirements(
            current, [affinity.backend_requirement([nodefacts.MULTI_NODE_BACKEND]), affinity.clique_requirement()]
        )
        key = ((pod.get("metadata") or {}).get("labels") or {}).get(policy.group_key_label)
        if key:
            wanted = affinity.merge_pod_affinity(wanted, affinity.clique_pod_affinity(policy.group_key_label, key))
        else:
            warnings.append(f"multi-pod group without label {policy.group_key_label}: not kept in one NVLink clique")
    else:
        wanted = affinity.merge_node_alternatives(current, nodefacts.verified_alternatives(policy.backends))
    return [] if wanted == current else [{"op": "add", "path": "/spec/affinity", "value": wanted}]


def plan_pod_create(
    pod: Mapping[str, Any],
    policy: Policy | None,
    nodes: Mapping[str, Mapping[str, str]],
    budget: Budget | None = None,
) -> PodPlan:
    """The mutation for a pod being created, given the policy that manages it (if any).

    ``nodes`` maps node names to labels; it is read only for a pod created with ``spec.nodeName``
    (decided at once) or a multi-pod group that must check its candidate nodes (spending ``budget``).
    """
    if policy is None:
        return PodPlan(None, pod=pod)
    spec = pod.get("spec") or {}
    warnings: list[str] = []
    ops: list[patches.Op] = []
    selected = 0
    work: Mapping[str, Any] = pod
    for index, container in enumerate(spec.get("containers") or []):
        if not isinstance(container, Mapping):
            continue
        if not any(fnmatchcase(str(container.get("name", "")), g) for g in policy.containers):
            continue
        container_ops = _container_ops(policy, index, container, warnings)
        if container_ops is None:
            continue
        selected += 1
        work = patches.applied(work, container_ops)
        if policy.mode == "Enforce":
            selected_container = work["spec"]["containers"][index]
            plan = commands.plan_command(selected_container, policy.respect_explicit_fusion)
            fusion_ops = _fusion_ops(policy, index, selected_container, plan, warnings)
            work = patches.applied(work, fusion_ops)
            container_ops = patches.superseded(container_ops, fusion_ops) + fusion_ops
            if policy.multicast_guard == "Enabled":
                engine = commands.ENGINE[plan.engine]
                guard_ops = _guard_ops(policy, index, work["spec"]["containers"][index], engine, warnings)
                work = patches.applied(work, guard_ops)
                container_ops = patches.superseded(container_ops, guard_ops) + guard_ops
        ops += container_ops
    if not selected:
        warnings.append(f"policy {policy.name} matches this pod but selects none of its containers")
        return PodPlan(policy, warnings=warnings, pod=pod)

    placement_warnings: list[str] = []
    rest = _placement_ops(policy, pod, multi_pod(policy, lws_size(pod)), placement_warnings)
    rest += patches.set_map_entries(pod, ("metadata", "labels"), {contract.LABEL_POD_POLICY: policy.name})
    ops += rest
    after = patches.applied(work, rest)  # ``work`` already holds the containers' ops
    record = pod_record(after, commands=False)  # the pod as stored: its group, decision and memo
    group = group_plan(record, policy)
    if group.multi and nodefacts.MULTI_NODE_BACKEND not in policy.backends:
        warnings.append(f"multi-pod group: trtllm is invalid across pods; it gets {policy.fallback}")
    elif group.multi and policy.placement == "Anywhere" and policy.mode == "Enforce":
        warnings.append("multi-pod group, placement Anywhere: mnnvl only if all candidate nodes share one clique")
    if group.multi and nodefacts.MULTI_NODE_BACKEND in policy.backends and not group.imex and policy.mode == "Enforce":
        warnings.append("multi-pod group without an IMEX channel claim: no mnnvl, fusion off (see imexChannelClaims)")
    warnings += placement_warnings

    node = spec.get("nodeName")
    if node:
        decision = decide.decide(
            policy,
            str(node),
            nodes.get(str(node)),
            group,
            nodes,
            trigger="create",
            budget=budget,
            release=vllm_release(record, policy),
            options=pod_options(record, policy),
        )
        if policy.placement == "VerifiedNodesOnly" and not decision.verified:
            warnings.append(f"spec.nodeName {node} verifies no allowed backend; it gets {decision.backend}")
    else:
        decision = decide.pending(policy, vllm_release(record, policy), pod_options(record, policy))
    meta_ops = patches.set_map_entries(after, ("metadata", "annotations"), decision.annotations())
    after = patches.applied(after, meta_ops)
    return PodPlan(policy, ops + meta_ops, warnings, decision, after, record)
