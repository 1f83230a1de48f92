"""The opt-in remedy for pods a policy selects that the pod webhook never configured
(``--recreate-unconfigured``): such a pod, when a controller owns it, is evicted so that the controller
creates it again, through the webhook.

Only through the Eviction API: the pod's PodDisruptionBudgets decide (a refusal, 429, is tried again
after ``RETRY`` seconds). Only pods whose controller recreates them (``RECREATING``: never a bare pod,
never a Job's, whose eviction counts as a failure). Rate limited (``BURST`` at once, then one every
``1 / PER_SECOND`` seconds across all pods), each pod once per uid. Each eviction gets a Normal event
``RecreatedForPolicy`` on the pod and counts in its policy's status (``pods.recreated``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from fiar_operator.core.errors import ApiError, NotFound, Unavailable
from fiar_operator.reconcile.events import Event, TokenBucket
from fiar_operator.reconcile.unconfigured import Unconfigured
from fiar_operator.state.kube import Kube

log = logging.getLogger(__name__)

RECREATING: Final = frozenset({"ReplicaSet", "StatefulSet", "DaemonSet", "LeaderWorkerSet"})
"""Controller kinds that create an evicted pod again."""
BURST: Final = 5
PER_SECOND: Final = 0.5
"""Evictions: 5 at once, then one every 2 s across all pods."""
RETRY: Final = 30.0
"""Seconds before a pod whose eviction a PodDisruptionBudget (or a failure) refused is tried again."""


class Recreator:
    def __init__(
        self,
        kube: Kube,
        unconfigured: Unconfigured,
        mark: Callable[[str], None],
        limit: TokenBucket | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.unconfigured, self.mark, self.clock = kube, unconfigured, mark, clock
        self.limit = limit if limit is not None else TokenBucket(BURST, PER_SECOND, clock=clock)
        self._done: set[str] = set()
        """Uids evicted (or gone)."""
        self._later: dict[str, float] = {}
        """Uid -> when an eviction refused may be tried again."""
        self._counts: dict[str, int] = {}
        """Policy -> pods evicted for it since this replica started leading."""

    def recreated(self, policy: str) -> int:
        return self._counts.get(policy, 0)

    def step(self) -> list[Event]:
        """Evict what the rate limit allows now; the events of the evictions made."""
        events: list[Event] = []
        now = self.clock()
        for policy, (namespace, name), pod in self.unconfigured.evictable():
            if pod.uid in self._done or self._later.get(pod.uid, 0.0) > now:
                continue
            if pod.owner is None or pod.owner[0] not in RECREATING:
                continue
            if not self.limit.take():
                break
            try:
                self.kube.evict_pod(namespace, name, pod.uid)
            except NotFound:
                self._done.add(pod.uid)
                continue
            except (Unavailable, ApiError) as exc:
                self._later[pod.uid] = now + RETRY
                log.info("pod %s/%s not evicted (tried again in %.0f s): %s", namespace, name, RETRY, exc)
                continue
            self._done.add(pod.uid)
            self._later.pop(pod.uid, None)
            self._counts[policy] = self._counts.get(policy, 0) + 1
            self.mark(policy)
            kind, owner = pod.owner
            target = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "uid": pod.uid},
            }
            message = (
                f"policy {policy} selects this pod, but the fiar pod webhook never configured it: evicted so that "
                f"its {kind} {owner} creates it again through the webhook"
            )
            events.append(Event(target, "Normal", "RecreatedForPolicy", message))
        return events
