"""Kubernetes Events the reconciler posts, and a rate limit for them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

from fiar_operator.core.pods import PodRecord
from fiar_operator.state.kube import Kube

COMPONENT: Final = "fiar-operator"
MESSAGE_MAX: Final = 1024
"""Characters of an event message kept (kopf trims to the same)."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event the reconciler asks for (``post`` sends it)."""

    target: Mapping[str, Any]
    type: str
    reason: str
    message: str


def pod_ref(record: PodRecord) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": record.name, "namespace": record.namespace, "uid": record.uid},
    }


def body(event: Event, instance: str, now: datetime | None = None) -> dict[str, Any]:
    """The core/v1 Event object for ``event`` (its target's namespace, a generated name)."""
    meta = event.target.get("metadata") or {}
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = str(meta.get("namespace") or "default")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{str(meta.get('name') or 'fiar')[:200]}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": event.target.get("apiVersion"),
            "kind": event.target.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:MESSAGE_MAX],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def post(kube: Kube, event: Event, instance: str) -> None:
    """Create the Event (errors propagate as ApiError)."""
    doc = body(event, instance)
    kube.call("POST", f"/api/v1/namespaces/{doc['metadata']['namespace']}/events", body=doc, timeout=5.0)


class TokenBucket:
    """At most ``burst`` at once, refilled at ``per_second``: bounds events that many pods can trigger together."""

    def __init__(self, burst: int, per_second: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.per_second, self.clock = burst, per_second, clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_second)
            self._at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True
