"""What the operator holds: its index sizes, read from its metrics port's ``/indexes`` through the API
server's service proxy (the chart's operator Service, when ``metrics.services`` gives it that port).

Optional: a user without ``services/proxy``, a release without the port, or an operator that does not
answer leaves the line out; nothing else of ``status`` depends on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import fiar_kube as kube

SERVICES: Final = "/api/v1/services"
SELECTOR: Final = "app.kubernetes.io/name=fiar,app.kubernetes.io/component=operator"
MAX_SERVICES: Final = 4
"""Operator Services tried at most (one per release)."""


def _count(raw: object) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < 2**53 else None


def sizes(doc: object) -> dict[str, int] | None:
    """``pods``, ``nodes``, ``podBytes``, ``nodeBytes`` of an ``/indexes`` answer (None: not one)."""
    if not isinstance(doc, Mapping):
        return None
    objects, held = doc.get("objects"), doc.get("bytes")
    if not isinstance(objects, Mapping) or not isinstance(held, Mapping):
        return None
    found = {
        "pods": _count(objects.get("pods")),
        "nodes": _count(objects.get("nodes")),
        "podBytes": _count(held.get("pods")),
        "nodeBytes": _count(held.get("nodes")),
    }
    return {k: v for k, v in found.items() if v is not None} if found["pods"] is not None else None


def read(
    list_: Callable[..., Iterator[dict[str, Any]]], get: Callable[[str], Any]
) -> tuple[str, dict[str, int]] | None:
    """(``namespace/name`` of the operator Service, its sizes) from the first that answers."""
    try:
        services = []
        for service in list_(SERVICES, labelSelector=SELECTOR):
            services.append(service)
            if len(services) >= MAX_SERVICES:
                break
    except (kube.ApiError, OSError, ValueError):
        return None
    for service in services:
        meta, spec = service.get("metadata") or {}, service.get("spec") or {}
        ports = spec.get("ports") if isinstance(spec, Mapping) else None
        if not isinstance(ports, list) or not any(isinstance(p, Mapping) and p.get("name") == "metrics" for p in ports):
            continue
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        try:
            doc = get(
                f"/api/v1/namespaces/{kube.segment(namespace)}/services/{kube.segment(name)}:metrics/proxy/indexes"
            )
        except (kube.ApiError, OSError, ValueError):
            continue
        found = sizes(doc)
        if found is not None:
            return f"{namespace}/{name}", found
    return None


def _mib(value: int | None) -> str:
    return f" ({value / 2**20:.1f} MiB)" if value is not None else ""


def line(where: str, found: Mapping[str, int]) -> str:
    return (
        f"operator ({where}) holds {found['pods']:,} pods{_mib(found.get('podBytes'))}, "
        f"{found.get('nodes', 0):,} nodes{_mib(found.get('nodeBytes'))}\n"
    )
