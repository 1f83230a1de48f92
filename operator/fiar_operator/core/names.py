"""Kubernetes object names, checked before they go into an API path or an index key.

A namespace name is a DNS-1123 label, a pod name a DNS-1123 subdomain. The API server never sends
anything else in an AdmissionReview, so a name that fails here comes from a forged review.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

_LABEL: Final = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
LABEL_RE: Final = re.compile(_LABEL)
SUBDOMAIN_RE: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
LABEL_MAX: Final = 63
SUBDOMAIN_MAX: Final = 253


def is_namespace_name(value: object) -> bool:
    """Whether ``value`` is a valid namespace name (a DNS-1123 label)."""
    return isinstance(value, str) and len(value) <= LABEL_MAX and LABEL_RE.fullmatch(value) is not None


def is_pod_name(value: object) -> bool:
    """Whether ``value`` is a valid pod name (a DNS-1123 subdomain)."""
    return isinstance(value, str) and len(value) <= SUBDOMAIN_MAX and SUBDOMAIN_RE.fullmatch(value) is not None


def is_object(obj: Any, kind: str, name: str, namespace: str = "") -> bool:
    """Whether ``obj`` is the object of ``kind`` named ``namespace``/``name`` (what a read asked for)."""
    if not isinstance(obj, Mapping) or obj.get("kind") != kind:
        return False
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and meta.get("name") == name and (meta.get("namespace") or "") == namespace
