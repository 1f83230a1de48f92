"""Bounds on the work one AdmissionReview may cause.

The API server accepts pods far larger than any inference pod (tens of thousands of containers or
labels fit in its 3 MiB request limit), and planning such a pod against every policy and node would
hold up every other review. A pod past these bounds is admitted unchanged, with a warning: fiar
configures no pod it cannot plan within bounded time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

MAX_CONTAINERS: Final = 256
"""Containers and init containers of one pod (a vLLM pod has a handful)."""
MAX_LABELS: Final = 1_000
"""Labels of one pod."""
MAX_AFFINITY_EXPRESSIONS: Final = 1_000
"""Match expressions over all required node-affinity terms of one pod."""


def _count(value: Any) -> int:
    return len(value) if isinstance(value, (list, Mapping)) else 0


def _affinity_expressions(spec: Mapping[str, Any]) -> int:
    affinity = spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(node, Mapping) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not isinstance(terms, list):
        return 0
    return len(terms) + sum(
        _count(t.get("matchExpressions")) + _count(t.get("matchFields")) for t in terms if isinstance(t, Mapping)
    )


def oversized(pod: Mapping[str, Any]) -> str | None:
    """Why a pod is past the bounds fiar plans within, or None when it is not."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(meta, Mapping) and isinstance(spec, Mapping)
    containers = _count(spec.get("containers")) + _count(spec.get("initContainers"))
    if containers > MAX_CONTAINERS:
        return f"{containers} containers (more than {MAX_CONTAINERS})"
    labels = _count(meta.get("labels"))
    if labels > MAX_LABELS:
        return f"{labels} labels (more than {MAX_LABELS})"
    expressions = _affinity_expressions(spec)
    if expressions > MAX_AFFINITY_EXPRESSIONS:
        return f"{expressions} node-affinity terms and expressions (more than {MAX_AFFINITY_EXPRESSIONS})"
    return None
