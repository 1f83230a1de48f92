"""Pods a policy selects that the pod webhook never configured, per policy, and the Warnings about them.

Such a pod has no ``fiar.io/policy`` label: it was created before the policy, or while the webhook
was unavailable (it fails open). Its environment can no longer change, so it is reported until it
is recreated: counted in its policy's status (with a few examples in the condition message) and
given one Warning event ``NotConfigured``. The events are rate limited: a new policy over thousands
of existing pods, or an operator restart, must not flood the API server; the status always counts
every pod.

The reconciler feeds every pod event (``pod_changed``, ``pod_deleted``) and recomputes from the pod
index when a policy or namespace changes (``sweep``). A re-list after a watch gap sends no deletions,
so entries are checked against the pod index whenever they are read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from fiar_operator import reconcile
from fiar_operator.events import Event, TokenBucket, pod_ref
from fiar_operator.pods import PodRecord
from fiar_operator.policy import Policy
from fiar_operator.store import Store

EVENT_BURST: Final = 20
EVENTS_PER_SECOND: Final = 0.5
"""NotConfigured events: 20 at once, then one every 2 s across all pods."""

Key = tuple[str, str]


class Unconfigured:
    def __init__(
        self,
        store: Store,
        excluded: Callable[[str], bool],
        mark: Callable[[str], None],
        limit: TokenBucket | None = None,
    ) -> None:
        self.store, self.excluded, self.mark = store, excluded, mark
        self.limit = limit if limit is not None else TokenBucket(EVENT_BURST, EVENTS_PER_SECOND)
        self._lock = threading.RLock()
        """kopf runs handlers in a thread pool; the status writer reads from its own thread."""
        self._pods: dict[str, dict[Key, str]] = {}
        """Policy name -> unconfigured pods it selects (key -> uid)."""
        self._warned: set[str] = set()
        """Uids of pods that got their NotConfigured event."""
        self._swept: tuple[object, ...] | None = None
        self._sweeping = threading.Lock()
        """One sweep at a time (they compare against the last one's inputs)."""

    # -- reading (status writer) -----------------------------------------------------------------
    def pods(self, policy: str) -> list[str]:
        """``namespace/name`` of the unconfigured pods ``policy`` selects, sorted; stale entries dropped."""
        with self._lock:
            entries = self._pods.get(policy, {})
            for key, uid in list(entries.items()):
                record = self.store.pods.get(key)
                if record is None or record.uid != uid or record.managed or not record.active:
                    del entries[key]
            return sorted(f"{ns}/{name}" for ns, name in entries)

    # -- pod events ------------------------------------------------------------------------------
    def pod_changed(self, record: PodRecord) -> list[Event]:
        """Track a pod after its event; the Warning for a newly found one (rate limited)."""
        policy = None
        if not record.managed and not self.excluded(record.namespace):
            policies = list(self.store.policies.values())
            policy = reconcile.unconfigured_by(record, policies, self.store.namespaces.get(record.namespace))
        with self._lock:
            self._drop(record.key, record.uid, keep=policy.name if policy else None)
            if policy is None:
                return []
            entries = self._pods.setdefault(policy.name, {})
            if entries.get(record.key) != record.uid:
                entries[record.key] = record.uid
                self.mark(policy.name)
            return self._warn(record, policy)

    def pod_deleted(self, key: Key, uid: str) -> None:
        with self._lock:
            self._drop(key, uid, keep=None)
            self._warned.discard(uid)

    def _drop(self, key: Key, uid: str, keep: str | None) -> None:
        """Remove the pod at ``key`` (this uid, or any when ``uid`` is empty) from every policy but ``keep``."""
        for name, entries in self._pods.items():
            if name != keep and key in entries and (not uid or entries[key] == uid):
                del entries[key]
                self.mark(name)

    def _warn(self, record: PodRecord, policy: Policy) -> list[Event]:
        if record.uid in self._warned or not self.limit.take():
            return []
        self._warned.add(record.uid)
        return [Event(pod_ref(record), "Warning", "NotConfigured", reconcile.unconfigured_message(policy))]

    # -- recomputation ---------------------------------------------------------------------------
    def sweep(self) -> list[Event]:
        """Recompute every policy's unconfigured pods from the pod index, when a policy was created,
        changed or deleted, or a namespace's labels changed since the last sweep (not on status writes).

        The pass over the index runs outside the lock that pod events take; a pod event that lands
        meanwhile is applied again by that pod's next event at the latest."""
        with self._sweeping:
            policies = dict(self.store.policies)
            namespaces = {name: dict(labels) for name, labels in list(self.store.namespaces.items())}
            objects = list(self.store.policy_objects.items())
            uids = {name: str((obj.get("metadata") or {}).get("uid") or "") for name, obj in objects}
            key = (sorted((n, uids.get(n, ""), p.generation) for n, p in policies.items()), namespaces)
            if key == self._swept:
                return []
            self._swept = key
            pods = self.store.all_pods()
            found = reconcile.unconfigured_pods(pods, policies.values(), namespaces, self.excluded)
            alive = {p.uid for p in pods}
            with self._lock:
                for name in set(self._pods) | set(found):
                    fresh = {p.key: p.uid for p in found.get(name, [])}
                    if self._pods.get(name) != fresh:
                        self.mark(name)
                    if name in policies:
                        self._pods[name] = fresh
                    else:
                        self._pods.pop(name, None)
                self._warned &= alive  # forget pods that are gone
                events: list[Event] = []
                for name, records in sorted(found.items()):
                    for record in records:
                        events += self._warn(record, policies[name])
                return events
