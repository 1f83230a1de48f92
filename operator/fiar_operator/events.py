"""Kubernetes Events the reconciler asks for (the kopf handlers post them), and a rate limit for them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fiar_operator.pods import PodRecord


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event the caller posts (kopf does, in handlers)."""

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
