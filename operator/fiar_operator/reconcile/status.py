"""Policy status: what each policy's ``status`` says, written by the leader only when it changed.

The reconciler and the unconfigured-pod tracker mark the policies whose figures may have changed
(``Marks``); the writer's thread takes the marks every interval and writes what changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any, Final

from fiar_kube import backoff_delay
from fiar_operator.core.decide import utc_now
from fiar_operator.core.errors import ApiError, NotFound
from fiar_operator.core.pods import PodRecord
from fiar_operator.core.policy import Policy
from fiar_operator.reconcile import rules
from fiar_operator.state.kube import Kube
from fiar_operator.state.store import Store

log = logging.getLogger(__name__)

STATUS_BACKOFF_MAX: Final = 60.0
"""Seconds between attempts at most, for a policy whose status write keeps failing."""
NODE_COUNTS_REFRESH: Final = 60.0
"""Seconds a policy's status may show stale cluster-wide node counts (``status.nodes`` other than
``verified``): a node's verdict flip rewrites at once only the policies whose own figures changed."""


def only_node_counts_differ(previous: Mapping[str, Any] | None, status: Mapping[str, Any]) -> bool:
    """Whether ``status`` differs from ``previous`` only in the cluster-wide node counts (the same for
    every policy), not in the policy's own ``verified`` count, pods or conditions."""
    if previous is None or not isinstance(previous.get("nodes"), Mapping):
        return False
    old_nodes, new_nodes = previous["nodes"], status.get("nodes") or {}
    if old_nodes.get("verified") != new_nodes.get("verified"):
        return False
    return all(previous.get(k) == v for k, v in status.items() if k != "nodes")


class Marks:
    """The policies asked for a status write since the writer last took them. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: set[str] = set()
        self._nodes = False

    def mark(self, name: str | None = None) -> None:
        """Ask for a write of ``name``'s status; None: of every policy, after a node change."""
        with self._lock:
            if name is None:
                self._nodes = True
            else:
                self._names.add(name)

    def take(self) -> tuple[set[str], bool]:
        """The policies marked, and whether a node change marked every policy; both cleared."""
        with self._lock:
            names, self._names = self._names, set()
            nodes, self._nodes = self._nodes, False
        return names, nodes


Held = tuple[PodRecord, Policy, Mapping[str, str], tuple[str, ...] | None]
"""A pod's record, the policy and namespace labels it was counted against, and its outcome (None: the
policy does not select it)."""


class Outcomes:
    """Which of a policy's labelled pods it selects, and each one's ``rules.pod_outcome``, kept with the
    record, the policy and the namespace labels they were read from (all three replaced, never
    changed, by the index): a pass counts again only the pods that changed since the last, not all of
    a policy's pods every ``interval`` while any of them changes (about 100 bytes held per pod: the
    outcomes are shared and the key is the record's)."""

    def __init__(self) -> None:
        self._held: dict[str, dict[tuple[str, str], Held]] = {}

    def counted(self, store: Store, name: str, policy: Policy) -> list[tuple[str, ...]]:
        """The outcome of each pod labelled ``name`` that ``policy`` selects (``Store.pods_of_policy``);
        afterwards only the pods of this pass are held."""
        held, kept = self._held.get(name, {}), {}
        found = []
        for pod in store.labelled(name):
            key, labels = pod.key, store.namespace_labels(pod.namespace)
            entry = held.get(key)
            if entry is None or entry[0] is not pod or entry[1] is not policy or entry[2] is not labels:
                selected = policy.matches(labels, pod.labels)
                entry = (pod, policy, labels, rules.pod_outcome(pod, policy) if selected else None)
            kept[key] = entry
            if entry[3] is not None:
                found.append(entry[3])
        self._held[name] = kept
        return found

    def forget(self, keep: Container[str]) -> None:
        """Drop what is held for the policies not in ``keep``."""
        self._held = {n: held for n, held in self._held.items() if n in keep}

    def drop(self, name: str) -> None:
        self._held.pop(name, None)

    def held(self, name: str) -> int:
        """Pods held for ``name``."""
        return len(self._held.get(name, {}))


class StatusWriter:
    """Writes policy statuses for the policies marked since the last pass (batched, only on change).

    A failed write is retried with exponential backoff (``interval`` doubling up to
    ``STATUS_BACKOFF_MAX``, with jitter). Node changes mark every policy, but a policy whose status
    would change only in the cluster-wide node counts is written at most every
    ``NODE_COUNTS_REFRESH``: one node flip rewrites only the policies whose own figures changed.
    """

    def __init__(
        self,
        store: Store,
        kube: Kube,
        interval: float,
        clock: Callable[[], str] = utc_now,
        unconfigured: Callable[[str], Sequence[str]] = lambda _name: (),
        monotonic: Callable[[], float] = time.monotonic,
        marks: Marks | None = None,
        recreated: Callable[[str], int] = lambda _name: 0,
    ) -> None:
        self.store, self.kube, self.interval, self.clock = store, kube, interval, clock
        self.unconfigured = unconfigured
        self.recreated = recreated
        self.monotonic = monotonic
        self.marks = marks if marks is not None else Marks()
        self._due: dict[str, float] = {}
        """Policy -> when its next write is due (a retry after a failure, or a deferred refresh)."""
        self._failures: dict[str, int] = {}
        self._written: dict[str, float] = {}
        """Policy -> when its status was last written."""
        self._node_counts: dict[str, tuple[Policy, int, dict[str, int]]] = {}
        """Policy -> (the policy, ``Store.node_changes``, its node counts then): one pass over every
        node per node change, not per write (a write is due every interval while pods change)."""
        self.outcomes = Outcomes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-writer", daemon=True)

    def mark(self, name: str | None = None) -> None:
        """Ask for a write of ``name``'s status; None: of every policy, after a node change."""
        self.marks.mark(name)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def failures(self, name: str) -> int:
        """Failed writes of ``name``'s status since its last success."""
        return self._failures.get(name, 0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception:  # a bug or an answer nobody foresaw must not end the status writes
                log.exception("policy status pass failed")

    def flush(self) -> int:
        """One pass: write every marked or due status that changed; how many were written."""
        now = self.monotonic()
        names, nodes = self.marks.take()
        due = {n for n, when in self._due.items() if when <= now}
        for name in due:
            del self._due[name]
        everything = set(self.store.policy_objects) if nodes else set()
        if len(self._written) > 2 * len(self.store.policy_objects) + 100:  # forget deleted policies
            self._written = {n: t for n, t in self._written.items() if n in self.store.policy_objects}
            self._node_counts = {n: c for n, c in self._node_counts.items() if n in self.store.policy_objects}
            self.outcomes.forget(self.store.policy_objects)
        written = 0
        for name in sorted(names | due | everything):
            deferrable = name not in names
            try:
                result = self.write(name, deferrable=deferrable)
            except NotFound:
                self._failures.pop(name, None)
                continue
            except ApiError as exc:
                failures = self._failures[name] = self._failures.get(name, 0) + 1
                delay = backoff_delay(failures, initial=self.interval, cap=STATUS_BACKOFF_MAX, jitter=(-0.5, 0.0))
                self._due[name] = min(self._due.get(name, now + delay), now + delay)
                log.warning(
                    "status of policy %s not written (attempt %d, next in %.1f s): %s", name, failures, delay, exc
                )
                continue
            self._failures.pop(name, None)
            if result == "written":
                written += 1
                self._written[name] = now
            elif result == "deferred":
                self._due.setdefault(name, self._written.get(name, now) + NODE_COUNTS_REFRESH)
        return written

    def write(self, name: str, deferrable: bool = False) -> str:
        """Write one policy's status if it changed: ``written``, ``unchanged``, or ``deferred`` (only
        the node counts changed, ``deferrable``, and it was written less than NODE_COUNTS_REFRESH ago)."""
        obj = self.store.policy_objects.get(name)
        if obj is None:
            self.outcomes.drop(name)
            return "unchanged"
        previous = obj.get("status")
        policy = self.store.policies.get(name)
        now = self.clock()
        if policy is not None:
            changes = self.store.node_changes  # read first: a node changed meanwhile counts again next time
            cached = self._node_counts.get(name)
            if cached is not None and cached[0] == policy and cached[1] == changes:
                counts = cached[2]
            else:
                counts = rules.node_counts(policy, dict(self.store.nodes))
                self._node_counts[name] = (policy, changes, counts)
            status = rules.status_of(
                policy,
                self.outcomes.counted(self.store, name, policy),
                previous,
                now,
                self.unconfigured(name),
                counts,
                self.recreated(name),
            )
        else:
            self.outcomes.drop(name)
            generation = int((obj.get("metadata") or {}).get("generation") or 0)
            status = rules.invalid_status(generation, self.store.policy_errors.get(name, "invalid spec"), previous, now)
        if rules.same_status(previous, status):
            return "unchanged"
        last = self._written.get(name)
        if (
            deferrable
            and last is not None
            and self.monotonic() - last < NODE_COUNTS_REFRESH
            and only_node_counts_differ(previous, status)
        ):
            return "deferred"
        self.store.put_policy(self.kube.patch_policy_status(name, status))
        return "written"
