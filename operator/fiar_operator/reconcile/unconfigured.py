"""Pods a policy selects that the pod webhook never configured, per policy, and the Warnings about them.

Such a pod has no ``fiar.io/policy`` label: it was created before the policy, or while the webhook
was unavailable (it fails open). Its environment can no longer change, so it is reported until it
is recreated: counted in its policy's status (with a few examples in the condition message) and
given one Warning event ``NotConfigured``. The events are rate limited so that a new policy over
thousands of existing pods, or an operator restart, does not flood the API server: a pod refused
by the limit waits in a queue that later handler calls drain (``drain``). The status always counts
every pod.

Only the reconciler (its one thread, on the leading replica) calls in: every pod event (``pod_changed``,
``pod_deleted``), a recomputation from the pod index when a policy or a namespace changes
(``sweep``), and ``refresh`` on any event, which at most every ``REFRESH_INTERVAL`` checks the
entries against the pod index: a re-list after a watch gap sends no deletions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from fiar_operator.core.pods import PodRecord
from fiar_operator.core.policy import Policy
from fiar_operator.reconcile import rules as reconcile
from fiar_operator.reconcile.events import Event, TokenBucket, pod_ref
from fiar_operator.state.store import Store

EVENT_BURST: Final = 20
EVENTS_PER_SECOND: Final = 0.5
"""NotConfigured events: 20 at once, then one every 2 s across all pods."""
REFRESH_INTERVAL: Final = 30.0
"""Seconds between checks of the entries against the pod index."""

Key = tuple[str, str]


def _event(record: PodRecord, policy: Policy) -> Event:
    return Event(pod_ref(record), "Warning", "NotConfigured", reconcile.unconfigured_message(policy))


class Unconfigured:
    def __init__(
        self,
        store: Store,
        excluded: Callable[[str], bool],
        mark: Callable[[str], None],
        limit: TokenBucket | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.excluded, self.mark, self.clock = store, excluded, mark, clock
        self.limit = limit if limit is not None else TokenBucket(EVENT_BURST, EVENTS_PER_SECOND)
        self._lock = threading.RLock()
        """The reconciler changes, the status writer reads from its own thread. Every change below
        happens under it, a sweep included, so no pod event interleaves with one."""
        self._pods: dict[str, dict[Key, str]] = {}
        """Policy name -> unconfigured pods it selects (key -> uid)."""
        self._warned: set[str] = set()
        """Uids of pods that got their NotConfigured event."""
        self._waiting: dict[str, tuple[Key, str]] = {}
        """Uid -> (pod key, policy name) of pods whose event the rate limit held back, oldest first."""
        self._swept_policies: object = None
        """The policies (name, uid, generation) at the last sweep."""
        self._swept_namespaces: dict[str, dict[str, str]] = {}
        """Namespace labels at the last sweep."""
        self._refreshed = clock()

    # -- reading (status writer) -----------------------------------------------------------------
    def pods(self, policy: str) -> list[str]:
        """``namespace/name`` of the unconfigured pods ``policy`` selects, sorted; stale entries dropped."""
        with self._lock:
            self._check(policy)
            return sorted(f"{ns}/{name}" for ns, name in self._pods.get(policy, {}))

    def _check(self, policy: str) -> bool:
        """Drop the entries of ``policy`` the pod index no longer backs; whether any was dropped."""
        entries = self._pods.get(policy, {})
        dropped = False
        for key, uid in list(entries.items()):
            record = self.store.pods.get(key)
            if record is None or record.uid != uid or record.managed or not record.active:
                del entries[key]
                self._waiting.pop(uid, None)
                dropped = True
        return dropped

    def refresh(self) -> None:
        """At most every REFRESH_INTERVAL: check every entry against the pod index and mark the
        policies whose count fell (pods that vanished during a watch gap)."""
        with self._lock:
            if self.clock() - self._refreshed < REFRESH_INTERVAL:
                return
            self._refreshed = self.clock()
            for name in list(self._pods):
                if self._check(name):
                    self.mark(name)

    # -- pod events ------------------------------------------------------------------------------
    def pod_changed(self, record: PodRecord) -> list[Event]:
        """Track a pod after its event; the Warning for a newly found one (rate limited)."""
        with self._lock:
            policy = None
            if not record.managed and not self.excluded(record.namespace):
                policies = list(self.store.policies.values())
                policy = reconcile.unconfigured_by(record, policies, self.store.namespaces.get(record.namespace))
            self._drop(record.key, record.uid, keep=policy.name if policy else None)
            if policy is None:
                self._waiting.pop(record.uid, None)
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
            self._waiting.pop(uid, None)

    def _drop(self, key: Key, uid: str, keep: str | None) -> None:
        """Remove the pod at ``key`` (this uid, or any when ``uid`` is empty) from every policy but ``keep``."""
        for name, entries in self._pods.items():
            if name != keep and key in entries and (not uid or entries[key] == uid):
                del entries[key]
                self.mark(name)

    def _warn(self, record: PodRecord, policy: Policy) -> list[Event]:
        if record.uid in self._warned:
            return []
        if self._waiting or not self.limit.take():  # first come, first served
            self._waiting.setdefault(record.uid, (record.key, policy.name))
            return []
        self._warned.add(record.uid)
        return [_event(record, policy)]

    def drain(self) -> list[Event]:
        """The held-back Warnings the rate limit allows now, oldest first (pods still unconfigured only)."""
        events: list[Event] = []
        with self._lock:
            while self._waiting:
                uid, (key, name) = next(iter(self._waiting.items()))
                record, policy = self.store.pods.get(key), self.store.policies.get(name)
                if record is None or policy is None or record.uid != uid or self._pods.get(name, {}).get(key) != uid:
                    del self._waiting[uid]
                    continue
                if not self.limit.take():
                    break
                del self._waiting[uid]
                self._warned.add(uid)
                events.append(_event(record, policy))
        return events

    # -- recomputation ---------------------------------------------------------------------------
    def forget_sweep(self) -> None:
        """Make the next ``sweep`` recompute even when no policy or namespace changed (a full pass)."""
        with self._lock:
            self._swept_policies = None

    def sweep(self) -> list[Event]:
        """Recompute the unconfigured pods after a policy was created, changed or deleted (every pod),
        or after namespaces' labels changed (only the pods of those namespaces); nothing on status
        writes or other events that change neither."""
        with self._lock:
            policies = dict(self.store.policies)
            namespaces = {name: dict(labels) for name, labels in list(self.store.namespaces.items())}
            objects = list(self.store.policy_objects.items())
            uids = {name: str((obj.get("metadata") or {}).get("uid") or "") for name, obj in objects}
            signature = sorted((n, uids.get(n, ""), p.generation) for n, p in policies.items())
            if signature != self._swept_policies:
                changed: set[str] | None = None  # every namespace
            else:
                old = self._swept_namespaces
                changed = {n for n in old.keys() | namespaces.keys() if old.get(n) != namespaces.get(n)}
                if not changed:
                    return []
            self._swept_policies, self._swept_namespaces = signature, namespaces
            pods = self.store.all_pods()
            if changed is not None:
                pods = [p for p in pods if p.namespace in changed]
            found = reconcile.unconfigured_pods(pods, policies.values(), namespaces, self.excluded)
            for name in set(self._pods) | set(found):
                fresh = {p.key: p.uid for p in found.get(name, [])}
                if changed is not None:  # keep the entries of the namespaces that did not change
                    kept = self._pods.get(name, {})
                    fresh = {k: u for k, u in kept.items() if k[0] not in changed} | fresh
                if self._pods.get(name) != fresh:
                    self.mark(name)
                if name in policies:
                    self._pods[name] = fresh
                else:
                    self._pods.pop(name, None)
            if changed is None:
                alive = {p.uid for p in pods}
                self._warned &= alive  # forget pods that are gone
            events: list[Event] = []
            for name, records in sorted(found.items()):
                for record in records:
                    events += self._warn(record, policies[name])
            return events
