"""Kubernetes Events the reconciler posts, the threads that post them, and a rate limit for them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

from fiar_operator.core.errors import ApiError
from fiar_operator.core.pods import PodRecord
from fiar_operator.state.kube import Kube

log = logging.getLogger(__name__)

COMPONENT: Final = "fiar-operator"
POSTERS: Final = 4
"""Threads that post the reconciler's events, so that it never waits for them."""
MAX_PENDING: Final = 10_000
"""Events waiting to be posted at most (about 1 KiB each)."""
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


class Poster:
    """Posts events on threads of its own (``POSTERS``), so that the reconciler goes on: 100 pods
    re-annotated make 100 events, whose POSTs, made in turn by the reconciler, held up the next
    change for 1-2 s (a verdict restored right after its removal waited for the removal's events).
    At most ``MAX_PENDING`` wait; beyond that ``post`` waits for room."""

    def __init__(
        self,
        kube: Kube,
        instance: str,
        stop: threading.Event,
        waiting: Callable[[], None] = lambda: None,
        posters: int = POSTERS,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.kube, self.instance, self.stop, self.waiting = kube, instance, stop, waiting
        self._posters = ThreadPoolExecutor(posters, thread_name_prefix="events")
        self._pending = threading.BoundedSemaphore(max_pending)

    def post(self, events: Sequence[Event]) -> None:
        """Hand ``events`` to the posting threads; ``waiting`` is called while no room is free."""
        for event in events:
            while not self._pending.acquire(timeout=1.0):
                if self.stop.is_set():  # the posters are shut down: no room will come
                    return
                self.waiting()  # waiting for room is progress, not a hang
            try:
                self._posters.submit(self._post_one, event)
            except RuntimeError:  # shut down: the operator stops
                self._pending.release()
                return

    def _post_one(self, event: Event) -> None:
        try:
            post(self.kube, event, self.instance)
        except ApiError as exc:
            log.warning("event %s on %s not posted: %s", event.reason, event.target.get("metadata"), exc)
        finally:
            self._pending.release()

    def shutdown(self) -> None:
        self._posters.shutdown(wait=False, cancel_futures=True)


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
