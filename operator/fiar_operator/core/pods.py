"""What the operator keeps about a pod, read from a pod object (a watch event, a read or a CREATE)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any, Final, TypeVar

import fiar_contract as contract
from fiar_operator.core import options as engine_options
from fiar_operator.core.commands import plan_command, vllm_options
from fiar_operator.core.decide import MAX_DECISION_LENGTH, GroupPlan, parse_decision
from fiar_operator.core.nodefacts import MULTI_NODE_BACKEND
from fiar_operator.core.policy import LWS_SIZE, Policy
from fiar_operator.core.releases import image_release
from fiar_operator.core.selectors import ANYWHERE, NodeConstraint, node_constraint
from fiar_operator.core.strings import SHARED, Kept

GENERATED_SUFFIX: Final = 5
"""Characters the API server appends to ``generateName`` (names.SimpleNameGenerator)."""
GENERATED_BASE_MAX: Final = 63 - GENERATED_SUFFIX
"""The API server truncates ``generateName`` to this many characters before appending the suffix."""

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})

NOTHING: Final[Mapping[str, str]] = MappingProxyType({})
"""The one empty mapping every record without labels, starts or reasons shares."""
NONE: Final[frozenset[Any]] = frozenset()
"""The one empty set likewise (each ``frozenset()`` of an empty iterable is a new 216-byte object)."""
T = TypeVar("T")


def _set(found: Iterable[T]) -> frozenset[T]:
    return frozenset(found) or NONE


def _nothing() -> Mapping[str, str]:
    return NOTHING


MAPS: Final[Kept[tuple[tuple[str, str], ...], Mapping[str, str]]] = Kept(1 << 14, 4 * 1024 * 1024)
"""One map per distinct content, for the maps records hold (labels, starts, reasons): a
Deployment's pods hold one map of labels."""
PARTS: Final[Kept[Hashable, Any]] = Kept(1 << 14, 4 * 1024 * 1024)
"""One copy per distinct value, for what a record reads from the spec and its annotations (the
pods of one template hold one tuple of containers, one set of the annotations they read, ...)."""
DECISIONS: Final[Kept[str, Mapping[str, Any] | None]] = Kept(1 << 12, 1024 * 1024)
"""The parsed ``fiar.io/decision`` of each distinct text (the pods on one node, decided alike,
hold one), sized by its text."""


def _size(value: object) -> int:
    """Rough bytes of a part a record holds (a string, a tuple or set of them, a node constraint)."""
    if isinstance(value, str):
        return 50 + len(value)
    if isinstance(value, tuple | frozenset):
        return 64 + sum(_size(item) for item in value)
    if isinstance(value, NodeConstraint):
        return 64 + _size(value.node_selector) + sum(_size(r.key) + _size(r.values) for t in value.terms for r in t)
    return 32


def _same(value: Any) -> Any:
    return value


def _part(value: T) -> T:
    """The copy of ``value`` (immutable and hashable) that other records hold, if any."""
    kept: T = PARTS(value, _same, _size(value))
    return kept


def _map(pairs: tuple[tuple[str, str], ...]) -> Mapping[str, str]:
    """The map of ``pairs`` (strings from ``SHARED``) that other records hold, if any."""
    if not pairs:
        return NOTHING
    return MAPS(pairs, dict, sum(100 + len(k) + len(v) for k, v in pairs))


def _decision(raw: str | None) -> Mapping[str, Any] | None:
    """``parse_decision`` of the annotation's text, its keys and string values from ``SHARED``; one
    parsed map per distinct text (read only: records never change what they hold)."""
    if not raw or len(raw) > MAX_DECISION_LENGTH:
        return None
    return DECISIONS(raw, _parsed_decision, len(raw))


def _parsed_decision(raw: str) -> Mapping[str, Any] | None:
    doc = parse_decision(raw)
    if doc is None:
        return None
    return {SHARED(k): SHARED(v) if type(v) is str else v for k, v in doc.items()}


def _annotation(annotations: Mapping[str, str], key: str) -> str | None:
    """``contract.pod_annotation_value`` of the annotation, the copy other records hold."""
    value = contract.pod_annotation_value(key, annotations.get(key))
    return None if value is None else SHARED(value)


def field_path(annotation: str) -> str:
    return f"metadata.annotations['{annotation}']"


FIELD_PATH: Final = field_path(contract.ANNOTATION_POD_BACKEND)
"""Where the injected variable takes its value from (the binding copies the annotation onto the pod)."""
INJECTED: Final = {
    contract.ENV_VAR: contract.ANNOTATION_POD_BACKEND,
    contract.ENV_FUSE_ALLREDUCE_RMS: contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS,
    contract.ENV_ALLREDUCE_USE_FLASHINFER: contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER,
    **{g.env: g.annotation for g in contract.MULTICAST_GUARD},
    contract.ENV_SGLANG_FLAG: contract.ANNOTATION_POD_SGLANG_FLAG,
}
"""The env vars the pod webhook injects, each read from the pod annotation it names."""


@dataclass(frozen=True, slots=True)
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
    labels: Mapping[str, str] = field(default_factory=_nothing)
    lws_size: int = 0
    backend: str | None = None
    decision: Mapping[str, Any] | None = None
    constraint: NodeConstraint = ANYWHERE
    pinned_backend: bool = False
    """Every required node-selector term demands fiar.io/backend In [mnnvl] and fiar.io/clique Exists."""
    clique_affinity: frozenset[tuple[str, str]] = frozenset()
    """(label, value) of required pod-affinity terms whose topologyKey is fiar.io/clique."""
    container_starts: Mapping[str, str] = field(default_factory=_nothing)
    """Container name -> RFC 3339 time the running container started."""
    containers: tuple[tuple[str, bool], ...] = ()
    """(name, sets the backend variable itself) of each container, in spec order."""
    fuse: str | None = None
    use_flashinfer: str | None = None
    """The fiar.io/fuse-allreduce-rms and fiar.io/allreduce-use-flashinfer annotations. These and
    ``backend`` are None when absent or outside ``contract.POD_ANNOTATION_VALUES`` (a value fiar never
    writes is never read)."""
    guard: tuple[str | None, ...] = ()
    """The multicast-guard annotations, in ``contract.MULTICAST_GUARD`` order (None: absent or not allowed)."""
    sglang: str | None = None
    """The fiar.io/sglang-flag annotation (None likewise)."""
    reads: frozenset[str] = frozenset()
    """Annotations that an injected env var of a container reads."""
    uncontrolled: tuple[str, ...] = ()
    """Managed pods only: containers whose command fiar cannot make read the fusion decision (it does
    not understand it) and that do not set the fusion themselves."""
    uncontrolled_reasons: Mapping[str, str] = field(default_factory=_nothing)
    """Why, per container of ``uncontrolled`` (``commands.CommandPlan.reason``)."""
    imex_claims: frozenset[str] = frozenset()
    """Names of the pod's resource claims that a container uses, with their template or claim names."""
    releases: tuple[tuple[str, str], ...] = ()
    """(container name, vLLM release) of the containers whose image is vLLM's with a release tag."""
    options: tuple[tuple[str, engine_options.Options], ...] = ()
    """(container name, options) of the containers whose vLLM command sets an option of
    ``options.BREAKS`` or one fiar cannot read."""
    generation: int = 0
    """``metadata.generation``: the API server counts every change of the spec in it (0: not given)."""
    key: tuple[str, str] = field(init=False, repr=False, compare=False)
    """(namespace, name): one tuple for the record's entries in every index and table that keeps it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.namespace, self.name))

    @property
    def managed(self) -> bool:
        return self.policy is not None

    @property
    def guarded(self) -> bool | None:
        """Whether the pod's guard annotations keep multicast off (True), leave it on (False), or neither."""
        if self.guard == tuple(g.off for g in contract.MULTICAST_GUARD):
            return True
        if self.guard == tuple(g.own for g in contract.MULTICAST_GUARD):
            return False
        return None

    def annotation(self, key: str) -> str | None:
        """The value of a fiar annotation the containers read, as the record holds it."""
        values: dict[str, str | None] = {
            contract.ANNOTATION_POD_BACKEND: self.backend,
            contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: self.fuse,
            contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER: self.use_flashinfer,
            contract.ANNOTATION_POD_SGLANG_FLAG: self.sglang,
        }
        values.update(zip((g.annotation for g in contract.MULTICAST_GUARD), self.guard, strict=False))
        return values.get(key)

    @property
    def active(self) -> bool:
        return not self.deleting and self.phase not in TERMINAL_PHASES


def _str_map(raw: Any, shared: bool = False) -> Mapping[str, str]:
    """``raw`` as strings; ``shared``: keys and values shared with other records (labels, not annotations,
    which a record does not keep and which can be large)."""
    if not isinstance(raw, Mapping) or not raw:
        return NOTHING
    if shared:
        return _map(tuple((SHARED(k), SHARED(v)) for k, v in raw.items()))
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
            and set(e.get("values") or []) == {MULTI_NODE_BACKEND}
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
    return _part(_set(found))


def _starts(status: Mapping[str, Any]) -> Mapping[str, str]:
    starts = {}
    for cs in status.get("containerStatuses") or []:
        running = (cs.get("state") or {}).get("running") or {}
        if running.get("startedAt") and cs.get("name"):
            starts[SHARED(cs["name"])] = SHARED(running["startedAt"])
    return _map(tuple(starts.items()))


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
        found.append((SHARED(container.get("name", "")), explicit))
    return _part(tuple(found))


def is_injected(entry: Mapping[str, Any]) -> bool:
    """Whether an env entry is one the pod webhook injects (a fieldRef to the annotation of INJECTED)."""
    ref = entry.get("valueFrom")
    field_ref = ref.get("fieldRef") if isinstance(ref, Mapping) else None
    annotation = INJECTED.get(str(entry.get("name")))
    return (
        annotation is not None
        and isinstance(field_ref, Mapping)
        and field_ref.get("fieldPath") == field_path(annotation)
    )


def annotations_read(spec: Mapping[str, Any]) -> frozenset[str]:
    """The annotations that injected env entries of the pod's containers (and init containers) read."""
    found = set()
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else []:
            env = container.get("env") if isinstance(container, Mapping) else None
            for entry in env if isinstance(env, list) else []:
                if isinstance(entry, Mapping) and is_injected(entry):
                    found.add(INJECTED[str(entry["name"])])
    return _part(_set(found))


def _uncontrolled(spec: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> why fiar cannot make its command read the decision, in spec order."""
    containers = spec.get("containers")
    found = {}
    for container in containers if isinstance(containers, list) else []:
        if not isinstance(container, Mapping):
            continue
        plan = plan_command(container)
        if not plan.understood and not plan.explicit and plan.mentions_vllm:
            found[str(container.get("name", ""))] = plan.reason
    return found


def _claims(spec: Mapping[str, Any]) -> frozenset[str]:
    """The pod's resource claims that some container uses: claim names and template or claim names."""
    used = set()
    for container in spec.get("containers") or []:
        for claim in ((container.get("resources") or {}).get("claims") or []) if isinstance(container, Mapping) else []:
            if isinstance(claim, Mapping) and claim.get("name"):
                used.add(str(claim["name"]))
    found = set()
    for claim in spec.get("resourceClaims") or []:
        if not isinstance(claim, Mapping) or str(claim.get("name")) not in used:
            continue
        found.add(str(claim["name"]))
        for key in ("resourceClaimTemplateName", "resourceClaimName"):
            if claim.get(key):
                found.add(str(claim[key]))
    return _part(_set(found))


def _releases(spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    containers = spec.get("containers")
    found = []
    for container in containers if isinstance(containers, list) else []:
        if isinstance(container, Mapping) and (release := image_release(container.get("image"))) is not None:
            found.append((SHARED(container.get("name", "")), SHARED(release)))
    return _part(tuple(found))


def _options(spec: Mapping[str, Any]) -> tuple[tuple[str, engine_options.Options], ...]:
    containers = spec.get("containers")
    found = []
    for container in containers if isinstance(containers, list) else []:
        if not isinstance(container, Mapping):
            continue
        read = vllm_options(container)
        if read is not None and (read.decode_backends or read.hisparse or read.unread):
            found.append((SHARED(str(container.get("name", ""))), read))
    return tuple(found)


def pod_options(record: PodRecord, policy: Policy) -> engine_options.Options:
    """The options of ``options.BREAKS`` the pod's selected containers set (merged)."""
    merged = engine_options.NO_OPTIONS
    for name, read in record.options:
        if any(fnmatchcase(name, g) for g in policy.containers):
            merged = merged.merged(read)
    return merged


def vllm_release(record: PodRecord, policy: Policy) -> str | None:
    """The vLLM release the pod's selected containers run: the policy's ``vllmRelease``, else the one
    release their images name (None when none names one, or they name different ones)."""
    if policy.vllm_release is not None:
        return policy.vllm_release
    found = {r for name, r in record.releases if any(fnmatchcase(name, g) for g in policy.containers)}
    return found.pop() if len(found) == 1 else None


def has_imex_claim(record: PodRecord, policy: Policy) -> bool:
    """Whether the pod carries an IMEX channel claim by the policy's names (or the policy says the
    channel is provided without one, e.g. by the device plugin's ``imex.channelIDs``)."""
    if policy.imex_channel == "Provided":
        return True
    return any(fnmatchcase(name, glob) for name in record.imex_claims for glob in policy.imex_claims)


def _generation(meta: Mapping[str, Any]) -> int:
    value = meta.get("generation")
    return value if type(value) is int and value > 0 else 0


def _same_spec(previous: PodRecord | None, uid: str, generation: int) -> PodRecord | None:
    """``previous`` when it was read from the same spec of the same pod: the API server raises
    ``metadata.generation`` on every change of a pod's spec (updates, ephemeral containers, resize);
    only a binding sets ``spec.nodeName`` without it, which a record reads on every event."""
    if previous is None or not generation or not uid or previous.uid != uid or previous.generation != generation:
        return None
    return previous


def pod_record(pod: Mapping[str, Any], commands: bool = True, previous: PodRecord | None = None) -> PodRecord:
    """A PodRecord from a pod object; tolerant of missing fields (a partial object gives a partial record).

    ``commands=False`` leaves ``uncontrolled`` empty (the reconciler's records always read it; the
    admission memo, which only answers bindings, need not parse commands). ``previous``: the record of
    this pod the index holds (read with commands); what it read from the spec is kept when the spec is
    the same (``_same_spec``), so that a pod's status changes do not parse its containers again."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = _str_map(meta.get("labels"), shared=True)
    annotations = _str_map(meta.get("annotations"))
    uid, generation = str(meta.get("uid") or ""), _generation(meta)
    managed = bool(labels.get(contract.LABEL_POD_POLICY))
    readable = isinstance(spec, Mapping)
    same = _same_spec(previous, uid, generation) if readable else None
    if same is not None:
        constraint, pinned = same.constraint, same.pinned_backend
        clique_affinity, claims = same.clique_affinity, same.imex_claims
        containers, reads, releases = same.containers, same.reads, same.releases
        options = same.options
    else:
        try:
            constraint = _part(node_constraint(spec))
            pinned = _pinned_backend(spec)
            clique_affinity = _clique_affinity(spec)
            claims = _claims(spec)
        except (AttributeError, TypeError):
            constraint, pinned, clique_affinity, claims = ANYWHERE, False, NONE, NONE
        containers = _containers(spec) if readable else ()
        reads = annotations_read(spec) if readable else NONE
        releases = _releases(spec) if readable else ()
        options = _options(spec) if readable and managed else ()  # a scan of tenant text: managed pods only
    if not (commands and managed and readable):
        uncontrolled: Mapping[str, str] = NOTHING
    elif same is not None and same.managed:
        uncontrolled = same.uncontrolled_reasons
    else:
        uncontrolled = _map(tuple(_uncontrolled(spec).items()))
    return PodRecord(
        namespace=SHARED(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=uid,
        generate_name=SHARED(meta.get("generateName") or ""),
        policy=labels.get(contract.LABEL_POD_POLICY) or None,
        node=SHARED(spec.get("nodeName")) if spec.get("nodeName") else None,
        phase=SHARED(status.get("phase") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        resource_version=str(meta.get("resourceVersion") or ""),
        labels=labels,
        lws_size=_lws_size(annotations),
        backend=_annotation(annotations, contract.ANNOTATION_POD_BACKEND),
        decision=_decision(annotations.get(contract.ANNOTATION_POD_DECISION)),
        constraint=constraint,
        pinned_backend=pinned,
        clique_affinity=clique_affinity,
        container_starts=_starts(status),
        containers=containers,
        fuse=_annotation(annotations, contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS),
        use_flashinfer=_annotation(annotations, contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER),
        guard=_part(tuple(_annotation(annotations, g.annotation) for g in contract.MULTICAST_GUARD)),
        sglang=_annotation(annotations, contract.ANNOTATION_POD_SGLANG_FLAG),
        reads=reads,
        uncontrolled=_part(tuple(uncontrolled)),
        uncontrolled_reasons=uncontrolled,
        imex_claims=claims,
        releases=releases,
        options=options,
        generation=generation,
    )


def _lws_size(annotations: Mapping[str, str]) -> int:
    try:
        return int(annotations.get(LWS_SIZE, "0"))
    except ValueError:
        return 0


def lws_size(pod: Mapping[str, Any]) -> int:
    """The size of the LeaderWorkerSet group ``pod`` belongs to, by its annotation (0: none)."""
    return _lws_size(_str_map((pod.get("metadata") or {}).get("annotations")))


def multi_pod(policy: Policy, size: int) -> bool:
    """Whether a pod of an LWS group of ``size`` is part of a multi-pod group under ``policy``."""
    return policy.multi_node != "Never" and (policy.multi_node == "Always" or size > 1)


def group_plan(record: PodRecord, policy: Policy) -> GroupPlan:
    """Whether the pod is part of a multi-pod group under ``policy``, and whether the group is pinned."""
    if not multi_pod(policy, record.lws_size):
        return GroupPlan()
    key = record.labels.get(policy.group_key_label)
    pinned = record.pinned_backend and key is not None and (policy.group_key_label, key) in record.clique_affinity
    return GroupPlan(
        multi=True, key=key, pinned=pinned, constraint=record.constraint, imex=has_imex_claim(record, policy)
    )


def generated_base(name: str) -> str | None:
    """The ``generateName`` prefix a generated pod name may come from (None when too short)."""
    return name[:-GENERATED_SUFFIX] if len(name) > GENERATED_SUFFIX else None
