"""Pods a policy selects that the pod webhook never configured, per policy, and the Warnings about them.

Such a pod has no ``fiar.io/policy`` label: it was created before the policy, or while the webhook
was unavailable (it fails open). Its environment can no longer change, so it is reported until it
is recreated: counted in its policy's status (with a few examples in the condition message) and
given one Warning event ``NotConfigured``. The events are rate limited so that a new policy over
thousands of existing pods, or an operator restart, does not flood the API server: a pod refused
by the limit waits in a queue that later handler calls drain (``drain``). The status always counts
every pod.

The pod watch never sees such a pod (it selects the labelled ones): the scanner's paged LISTs find
them (``scan``, on a period and at once when a policy or a namespace changes) and hand each result
in (``scanned``). The reconciler's calls keep the entries current between scans: a configured pod
of the same name (``pod_changed``) replaces an entry, and ``refresh``, at most every
``REFRESH_INTERVAL``, checks them against the pod index. The eviction remedy (``--recreate-unconfigured``)
reads the entries' controllers (``evictable``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from fiar_operator.core.pods import PodRecord
from fiar_operator.core.policy import Policy
from fiar_operator.reconcile import rules as reconcile
from fiar_operator.reconcile.events import Event, TokenBucket
from fiar_operator.reconcile.scan import Found, Pod
from fiar_operator.state.store import Store

EVENT_BURST: Final = 20
EVENTS_PER_SECOND: Final = 0.5
"""NotConfigured events: 20 at once, then one every 2 s across all pods."""
REFRESH_INTERVAL: Final = 30.0
"""Seconds between checks of the entries against the pod index."""

Key = tuple[str, str]


def _event(key: Key, uid: str, policy: Policy) -> Event:
    target = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": key[1], "namespace": key[0], "uid": uid}}
    return Event(target, "Warning", "NotConfigured", reconcile.unconfigured_message(policy))


class Unconfigured:
    def __init__(
        self,
        store: Store,
        excluded: Callable[[str], bool],
        mark: Callable[[str], None],
        limit: TokenBucket | None = None,
        clock: Callable[[], float] = time.monotonic,
        poke: Callable[[], None] = lambda: None,
    ) -> None:
        self.store, self.excluded, self.mark, self.clock, self.poke = store, excluded, mark, clock, poke
        self.limit = limit if limit is not None else TokenBucket(EVENT_BURST, EVENTS_PER_SECOND)
        self._lock = threading.RLock()
        """The reconciler and the scanner change, the status writer reads, each from its own thread."""
        self._pods: dict[str, dict[Key, Pod]] = {}
        """Policy name -> unconfigured pods it selects."""
        self._warned: set[str] = set()
        """Uids of pods that got their NotConfigured event."""
        self._waiting: dict[str, tuple[Key, str]] = {}
        """Uid -> (pod key, policy name) of pods whose event the rate limit held back, oldest first."""
        self._swept_policies: object = None
        """The policies (name, uid, generation) at the last sweep."""
        self._swept_namespaces: dict[str, dict[str, str]] = {}
        """Namespace labels at the last sweep."""
        self._refreshed = clock()
        self.scanned_at: float | None = None
        """When the last scan's result came (None: none yet)."""

    # -- reading (status writer, eviction remedy) ------------------------------------------------
    def pods(self, policy: str) -> list[str]:
        """``namespace/name`` of the unconfigured pods ``policy`` selects, sorted; stale entries dropped."""
        with self._lock:
            self._check(policy)
            return sorted(f"{ns}/{name}" for ns, name in self._pods.get(policy, {}))

    def count(self) -> int:
        with self._lock:
            return sum(len(entries) for entries in self._pods.values())

    def evictable(self) -> list[tuple[str, Key, Pod]]:
        """(policy, key, pod) of the entries whose pod has a controller to recreate it, oldest policy first."""
        with self._lock:
            return [
                (name, key, pod)
                for name, entries in sorted(self._pods.items())
                for key, pod in sorted(entries.items())
                if pod.owner is not None
            ]

    def _check(self, policy: str) -> bool:
        """Drop the entries of ``policy`` whose name a configured pod now has (the pod index holds only
        those); whether any was dropped."""
        entries = self._pods.get(policy, {})
        dropped = False
        for key, pod in list(entries.items()):
            record = self.store.pods.get(key)
            if record is not None and (record.uid == pod.uid or record.managed):
                del entries[key]
                self._waiting.pop(pod.uid, None)
                dropped = True
        return dropped

    def refresh(self) -> None:
        """At most every REFRESH_INTERVAL: check every entry against the pod index and mark the
        policies whose count fell."""
        with self._lock:
            if self.clock() - self._refreshed < REFRESH_INTERVAL:
                return
            self._refreshed = self.clock()
            for name in list(self._pods):
                if self._check(name):
                    self.mark(name)

    # -- pod events (the pods the webhook configured) --------------------------------------------
    def pod_changed(self, record: PodRecord) -> list[Event]:
        """A configured pod's event: an entry of its name is a pod that is gone (names are unique)."""
        with self._lock:
            if record.managed:
                self._drop(record.key, "")
            return []

    def pod_deleted(self, key: Key, uid: str) -> None:
        with self._lock:
            self._drop(key, uid)
            self._warned.discard(uid)
            self._waiting.pop(uid, None)

    def _drop(self, key: Key, uid: str) -> None:
        """Remove the pod at ``key`` (this uid, or any when ``uid`` is empty) from every policy."""
        for name, entries in self._pods.items():
            if key in entries and (not uid or entries[key].uid == uid):
                del entries[key]
                self.mark(name)

    def _warn(self, key: Key, pod: Pod, policy: str) -> None:
        """Queue the pod's Warning (``drain`` posts it, rate limited, first come first served)."""
        if pod.uid not in self._warned:
            self._waiting.setdefault(pod.uid, (key, policy))

    def drain(self) -> list[Event]:
        """The held-back Warnings the rate limit allows now, oldest first (pods still unconfigured only)."""
        events: list[Event] = []
        with self._lock:
            while self._waiting:
                uid, (key, name) = next(iter(self._waiting.items()))
                policy, held = self.store.policies.get(name), self._pods.get(name, {}).get(key)
                if policy is None or held is None or held.uid != uid:
                    del self._waiting[uid]
                    continue
                if not self.limit.take():
                    break
                del self._waiting[uid]
                self._warned.add(uid)
                events.append(_event(key, uid, policy))
        return events

    # -- scans -----------------------------------------------------------------------------------
    def scanned(self, found: Found) -> None:
        """A scan's result: the entries of every policy replaced (merged, when the scan was cut short:
        what it did not reach stays as the last scan found it), the new pods' Warnings queued."""
        with self._lock:
            policies = self.store.policies
            for name in set(self._pods) | set(found.pods):
                fresh = dict(found.pods.get(name, {}))
                if not found.complete:
                    fresh = {**self._pods.get(name, {}), **fresh}
                fresh = {k: p for k, p in fresh.items() if not self._configured(k, p)}
                if {k: p.uid for k, p in self._pods.get(name, {}).items()} != {k: p.uid for k, p in fresh.items()}:
                    self.mark(name)
                if name in policies and fresh:
                    self._pods[name] = fresh
                else:
                    self._pods.pop(name, None)
            if found.complete:
                alive = {p.uid for entries in self._pods.values() for p in entries.values()}
                self._warned &= alive  # forget pods that are gone
            for name, entries in sorted(self._pods.items()):
                for key, pod in sorted(entries.items()):
                    self._warn(key, pod, name)
            self.scanned_at = self.clock()

    def _configured(self, key: Key, pod: Pod) -> bool:
        record = self.store.pods.get(key)
        return record is not None and (record.uid == pod.uid or record.managed)

    # -- policy and namespace changes ------------------------------------------------------------
    def forget_sweep(self) -> None:
        """Make the next ``sweep`` scan even when no policy or namespace changed."""
        with self._lock:
            self._swept_policies = None

    def sweep(self) -> list[Event]:
        """After a policy was created, changed or deleted, or namespaces' labels changed: the entries of
        policies that are gone dropped at once, and a scan asked for; nothing on status writes or other
        events that change neither."""
        with self._lock:
            policies = dict(self.store.policies)
            namespaces = {name: dict(labels) for name, labels in list(self.store.namespaces.items())}
            objects = list(self.store.policy_objects.items())
            uids = {name: str((obj.get("metadata") or {}).get("uid") or "") for name, obj in objects}
            signature = sorted((n, uids.get(n, ""), p.generation) for n, p in policies.items())
            if signature == self._swept_policies and namespaces == self._swept_namespaces:
                return []
            self._swept_policies, self._swept_namespaces = signature, namespaces
            for name in list(self._pods):
                if name not in policies:
                    del self._pods[name]
                    self.mark(name)
        self.poke()
        return []
