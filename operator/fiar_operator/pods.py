"""What the operator keeps about a pod, read from a pod object (a watch event, a read or a CREATE)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import fiar_contract as contract
from fiar_operator.decide import GroupPlan, parse_decision
from fiar_operator.policy import LWS_SIZE, Policy
from fiar_operator.selectors import ANYWHERE, NodeConstraint, node_constraint

GENERATED_SUFFIX: Final = 5
"""Characters the API server appends to ``generateName`` (names.SimpleNameGenerator)."""
GENERATED_BASE_MAX: Final = 63 - GENERATED_SUFFIX
"""The API server truncates ``generateName`` to this many characters before appending the suffix."""

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})

FIELD_PATH: Final = f"metadata.annotations['{contract.ANNOTATION_POD_BACKEND}']"
"""Where the injected variable takes its value from (the binding copies the annotation onto the pod)."""


@dataclass(frozen=True)
class PodRecord:
    namespace: str
    name: str
    uid: str = ""
    generate_name: str = ""
    policy: str | None = None
    node: str | None = None
    phase: str = ""
    deleting: bool = False
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    lws_size: int = 0
    backend: str | None = None
    decision: Mapping[str, Any] | None = None
    constraint: NodeConstraint = ANYWHERE
    pinned_backend: bool = False
    """Every required node-selector term demands fiar.io/backend In [mnnvl] and fiar.io/clique Exists."""
    clique_affinity: frozenset[tuple[str, str]] = frozenset()
    """(label, value) of required pod-affinity terms whose topologyKey is fiar.io/clique."""
    container_starts: Mapping[str, str] = field(default_factory=dict)
    """Container name -> RFC 3339 time the running container started."""
    containers: tuple[tuple[str, bool], ...] = ()
    """(name, sets the backend variable itself) of each container, in spec order."""

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def managed(self) -> bool:
        return self.policy is not None

    @property
    def active(self) -> bool:
        return not self.deleting and self.phase not in TERMINAL_PHASES


def _str_map(raw: Any) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def _pinned_backend(spec: Mapping[str, Any]) -> bool:
    affinity = spec.get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return False
    for term in terms:
        exprs = term.get("matchExpressions") or []
        backend_ok = any(
            e.get("key") == contract.LABEL_BACKEND
            and e.get("operator") == "In"
            and set(e.get("values") or []) == {"mnnvl"}
            for e in exprs
        )
        clique_ok = any(e.get("key") == contract.LABEL_CLIQUE and e.get("operator") == "Exists" for e in exprs)
        if not (backend_ok and clique_ok):
            return False
    return True


def _clique_affinity(spec: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    affinity = spec.get("affinity") or {}
    terms = (affinity.get("podAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []
    found = set()
    for term in terms:
        if term.get("topologyKey") != contract.LABEL_CLIQUE or term.get("namespaceSelector") is not None:
            continue
        selector = term.get("labelSelector") or {}
        match = selector.get("matchLabels") or {}
        if len(match) == 1 and not selector.get("matchExpressions"):
            ((key, value),) = match.items()
            found.add((str(key), str(value)))
    return frozenset(found)


def _starts(status: Mapping[str, Any]) -> dict[str, str]:
    starts = {}
    for cs in status.get("containerStatuses") or []:
        running = (cs.get("state") or {}).get("running") or {}
        if running.get("startedAt") and cs.get("name"):
            starts[str(cs["name"])] = str(running["startedAt"])
    return starts


def _containers(spec: Mapping[str, Any]) -> tuple[tuple[str, bool], ...]:
    """(name, sets the variable itself) of the containers the pod webhook could give the variable
    (a container whose env is not a list is left alone there, so it is left out here)."""
    containers = spec.get("containers")
    found = []
    for container in containers if isinstance(containers, list) else []:
        if not isinstance(container, Mapping):
            continue
        env = container.get("env")
        if env is not None and not isinstance(env, list):
            continue
        explicit = any(
            isinstance(e, Mapping) and e.get("name") == contract.ENV_VAR and not is_injected(e) for e in env or []
        )
        found.append((str(container.get("name", "")), explicit))
    return tuple(found)


def is_injected(entry: Mapping[str, Any]) -> bool:
    """Whether an env entry is the one the pod webhook injects."""
    ref = entry.get("valueFrom")
    field_ref = ref.get("fieldRef") if isinstance(ref, Mapping) else None
    return (
        entry.get("name") == contract.ENV_VAR
        and isinstance(field_ref, Mapping)
        and field_ref.get("fieldPath") == FIELD_PATH
    )


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    """A PodRecord from a pod object; tolerant of missing fields (a partial object gives a partial record)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = _str_map(meta.get("labels"))
    annotations = _str_map(meta.get("annotations"))
    try:
        lws_size = int(annotations.get(LWS_SIZE, "0"))
    except ValueError:
        lws_size = 0
    try:
        constraint = node_constraint(spec)
        pinned = _pinned_backend(spec)
        clique_affinity = _clique_affinity(spec)
    except (AttributeError, TypeError):
        constraint, pinned, clique_affinity = ANYWHERE, False, frozenset()
    return PodRecord(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        generate_name=str(meta.get("generateName") or ""),
        policy=labels.get(contract.LABEL_POD_POLICY) or None,
        node=str(spec.get("nodeName")) if spec.get("nodeName") else None,
        phase=str(status.get("phase") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        resource_version=str(meta.get("resourceVersion") or ""),
        labels=labels,
        lws_size=lws_size,
        backend=annotations.get(contract.ANNOTATION_POD_BACKEND),
        decision=parse_decision(annotations.get(contract.ANNOTATION_POD_DECISION)),
        constraint=constraint,
        pinned_backend=pinned,
        clique_affinity=clique_affinity,
        container_starts=_starts(status),
        containers=_containers(spec) if isinstance(spec, Mapping) else (),
    )


def group_plan(record: PodRecord, policy: Policy) -> GroupPlan:
    """Whether the pod is part of a multi-pod group under ``policy``, and whether the group is pinned."""
    if policy.multi_node == "Never":
        return GroupPlan()
    multi = policy.multi_node == "Always" or record.lws_size > 1
    if not multi:
        return GroupPlan()
    key = record.labels.get(policy.group_key_label)
    pinned = record.pinned_backend and key is not None and (policy.group_key_label, key) in record.clique_affinity
    return GroupPlan(multi=True, key=key, pinned=pinned, constraint=record.constraint)


def generated_base(name: str) -> str | None:
    """The ``generateName`` prefix a generated pod name may come from (None when too short)."""
    return name[:-GENERATED_SUFFIX] if len(name) > GENERATED_SUFFIX else None
