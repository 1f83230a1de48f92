"""FiAllreducePolicy: the typed form of a policy object, and which policy manages a pod.

The CRD (``crds/fiallreducepolicies.yaml``) validates and defaults policies in the API server;
``parse_policy`` applies the same defaults so that an object stored before a default existed, or a
policy built in a test, reads the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import fiar_contract as contract
from fiar_operator.core import selectors
from fiar_operator.core.errors import PolicyError

Placement = Literal["Anywhere", "VerifiedNodesOnly"]
Mode = Literal["Enforce", "Audit"]
MultiNode = Literal["Auto", "Always", "Never"]
FusionControl = Literal["Enabled", "Disabled"]
MulticastGuard = Literal["Enabled", "Disabled"]
ImexChannel = Literal["Claim", "Provided"]

PLACEMENTS: Final[tuple[Placement, ...]] = ("Anywhere", "VerifiedNodesOnly")
MODES: Final[tuple[Mode, ...]] = ("Enforce", "Audit")
MULTI_NODE: Final[tuple[MultiNode, ...]] = ("Auto", "Always", "Never")
FUSION_CONTROLS: Final[tuple[FusionControl, ...]] = ("Enabled", "Disabled")
MULTICAST_GUARDS: Final[tuple[MulticastGuard, ...]] = ("Enabled", "Disabled")
IMEX_CHANNELS: Final[tuple[ImexChannel, ...]] = ("Claim", "Provided")
DEFAULT_IMEX_CLAIMS: Final = ("mnnvl-claim", "*imex*", "*channel*", "*compute-domain*")
"""Names (of a pod's resource claim, or of its template or claim) that stand for an IMEX channel claim:
Grove's ``mnnvl-claim`` and the names the NVIDIA DRA driver's guides and the stacks' recipes use."""

LWS_GROUP_KEY: Final = "leaderworkerset.sigs.k8s.io/group-key"
"""Label LeaderWorkerSet puts on every pod of one group (a unique hash per group)."""
LWS_SIZE: Final = "leaderworkerset.sigs.k8s.io/size"
"""Annotation LeaderWorkerSet puts on its pods: pods per group; > 1 means a multi-pod group."""

DEFAULT_CONTAINERS: Final = ("*",)
DEFAULT_BACKENDS: Final[tuple[contract.Backend, ...]] = contract.BACKENDS


@dataclass(frozen=True)
class Policy:
    name: str
    pod_selector: selectors.LabelSelector
    namespace_selector: selectors.LabelSelector = selectors.EVERYTHING
    containers: tuple[str, ...] = DEFAULT_CONTAINERS
    backends: tuple[contract.Backend, ...] = DEFAULT_BACKENDS
    fallback: contract.EnvValue = contract.AUTO
    placement: Placement = "Anywhere"
    respect_explicit_env: bool = True
    mode: Mode = "Enforce"
    priority: int = 0
    multi_node: MultiNode = "Auto"
    group_key_label: str = LWS_GROUP_KEY
    fusion_control: FusionControl = "Enabled"
    respect_explicit_fusion: bool = True
    multicast_guard: MulticastGuard = "Enabled"
    vllm_release: str | None = None
    """The vLLM release the selected containers run (``vllmRelease``); None: read from their images."""
    imex_channel: ImexChannel = "Claim"
    imex_claims: tuple[str, ...] = DEFAULT_IMEX_CLAIMS
    generation: int = 0

    def matches(self, namespace_labels: Mapping[str, str], pod_labels: Mapping[str, str]) -> bool:
        return self.namespace_selector.matches(namespace_labels) and self.pod_selector.matches(pod_labels)


NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
"""The label the API server gives every namespace: its name."""


DEFAULT: Final = Policy(name="", pod_selector=selectors.EVERYTHING)
"""A policy with every default: the one source of ``parse_policy``'s defaults (the CRD's are checked
against it by a test)."""


def _choice(spec: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = spec.get(key, default)
    if value not in allowed:
        raise PolicyError(f"spec.{key}: {value!r} is not one of {', '.join(allowed)}")
    return str(value)


RELEASE_PATTERN: Final = re.compile(r"^v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?$")
"""A vLLM release as ``vllmRelease`` and image tags give it: ``0.33``, ``0.33.0``, ``v0.32.1``."""


def _release(name: str, raw: object) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or RELEASE_PATTERN.match(raw) is None:
        raise PolicyError(f"{name}: spec.vllmRelease must be a release such as 0.33.0, not {raw!r}")
    return raw.removeprefix("v")


def parse_policy(obj: Mapping[str, Any]) -> Policy:
    """Build a Policy from a FiAllreducePolicy object (as a dict); raise PolicyError on a bad spec."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise PolicyError("metadata.name: a policy needs a name")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise PolicyError(f"{name}: spec is missing")
    if "podSelector" not in spec:
        raise PolicyError(f"{name}: spec.podSelector is required ({{}} selects every pod)")
    containers = spec.get("containers", list(DEFAULT.containers))
    if not isinstance(containers, list) or not containers or not all(isinstance(c, str) and c for c in containers):
        raise PolicyError(f"{name}: spec.containers must be a non-empty list of container-name globs")
    backends = spec.get("backends", list(DEFAULT.backends))
    if not isinstance(backends, list) or not backends:
        raise PolicyError(f"{name}: spec.backends must list at least one of {', '.join(contract.BACKENDS)}")
    if any(b not in contract.BACKENDS for b in backends) or len(set(backends)) != len(backends):
        raise PolicyError(f"{name}: spec.backends must be distinct values of {', '.join(contract.BACKENDS)}")
    priority = spec.get("priority", DEFAULT.priority)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise PolicyError(f"{name}: spec.priority must be an integer")
    group_key = spec.get("groupKeyLabel", DEFAULT.group_key_label)
    if not isinstance(group_key, str) or not group_key:
        raise PolicyError(f"{name}: spec.groupKeyLabel must be a label key")
    imex_claims = spec.get("imexChannelClaims", list(DEFAULT.imex_claims))
    if not isinstance(imex_claims, list) or not all(isinstance(c, str) and c for c in imex_claims):
        raise PolicyError(f"{name}: spec.imexChannelClaims must be a list of claim-name globs")
    generation = meta.get("generation", 0)
    return Policy(
        name=name,
        pod_selector=selectors.parse_label_selector(spec.get("podSelector"), f"{name}: spec.podSelector"),
        namespace_selector=selectors.parse_label_selector(
            spec.get("namespaceSelector"), f"{name}: spec.namespaceSelector"
        ),
        containers=tuple(containers),
        backends=tuple(cast("list[contract.Backend]", backends)),
        fallback=cast("contract.EnvValue", _choice(spec, "fallbackBackend", contract.ENV_VALUES, DEFAULT.fallback)),
        placement=cast("Placement", _choice(spec, "placement", PLACEMENTS, DEFAULT.placement)),
        respect_explicit_env=bool(spec.get("respectExplicitEnv", DEFAULT.respect_explicit_env)),
        mode=cast("Mode", _choice(spec, "mode", MODES, DEFAULT.mode)),
        priority=priority,
        multi_node=cast("MultiNode", _choice(spec, "multiNode", MULTI_NODE, DEFAULT.multi_node)),
        group_key_label=group_key,
        fusion_control=cast("FusionControl", _choice(spec, "fusionControl", FUSION_CONTROLS, DEFAULT.fusion_control)),
        respect_explicit_fusion=bool(spec.get("respectExplicitFusion", DEFAULT.respect_explicit_fusion)),
        multicast_guard=cast(
            "MulticastGuard", _choice(spec, "multicastGuard", MULTICAST_GUARDS, DEFAULT.multicast_guard)
        ),
        vllm_release=_release(name, spec.get("vllmRelease")),
        imex_channel=cast("ImexChannel", _choice(spec, "imexChannel", IMEX_CHANNELS, DEFAULT.imex_channel)),
        imex_claims=tuple(imex_claims),
        generation=generation if isinstance(generation, int) else 0,
    )


def select_policy(
    policies: Iterable[Policy], namespace_labels: Mapping[str, str], pod_labels: Mapping[str, str]
) -> Policy | None:
    """The policy that manages a pod: among those that match, the highest priority; ties by name."""
    best: Policy | None = None
    for policy in policies:
        if not policy.matches(namespace_labels, pod_labels):
            continue
        if best is None or (-policy.priority, policy.name) < (-best.priority, best.name):
            best = policy
    return best


def covers_namespace(policies: Iterable[Policy], namespace_labels: Mapping[str, str]) -> bool:
    """Whether any policy could manage a pod in a namespace with these labels."""
    return any(p.namespace_selector.matches(namespace_labels) for p in policies)
