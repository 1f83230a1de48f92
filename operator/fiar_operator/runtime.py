"""One running operator: indexes, informers, the webhook server, and the reconciler's actions.

The webhooks and informers run on every replica. The reconciler's actions (re-annotating pods,
events, policy status) are called from kopf handlers, which run on the active peer only.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import fiar_contract as contract
from fiar_operator import informers, reconcile
from fiar_operator.admission import Admission, utc_now
from fiar_operator.errors import ApiError
from fiar_operator.events import Event, pod_ref
from fiar_operator.kube import Kube, configuration
from fiar_operator.metrics import Metrics
from fiar_operator.pods import PodRecord
from fiar_operator.server import READY_KINDS, Server
from fiar_operator.settings import Settings
from fiar_operator.store import Store
from fiar_operator.unconfigured import Unconfigured

log = logging.getLogger(__name__)

PEERINGS = "/apis/kopf.dev/v1/clusterkopfpeerings"


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
    ) -> None:
        self.store, self.kube, self.interval, self.clock = store, kube, interval, clock
        self.unconfigured = unconfigured
        self.monotonic = monotonic
        self._marked: set[str] = set()
        self._nodes_marked = False
        self._due: dict[str, float] = {}
        """Policy -> when its next write is due (a retry after a failure, or a deferred refresh)."""
        self._failures: dict[str, int] = {}
        self._written: dict[str, float] = {}
        """Policy -> when its status was last written."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-writer", daemon=True)

    def mark(self, name: str | None = None) -> None:
        """Ask for a write of ``name``'s status; None: of every policy, after a node change."""
        with self._lock:
            if name is None:
                self._nodes_marked = True
            else:
                self._marked.add(name)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def failures(self, name: str) -> int:
        """Failed writes of ``name``'s status since its last success."""
        return self._failures.get(name, 0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def flush(self) -> int:
        """One pass: write every marked or due status that changed; how many were written."""
        now = self.monotonic()
        with self._lock:
            names, self._marked = self._marked, set()
            nodes, self._nodes_marked = self._nodes_marked, False
        due = {n for n, when in self._due.items() if when <= now}
        for name in due:
            del self._due[name]
        everything = set(self.store.policy_objects) if nodes else set()
        if len(self._written) > 2 * len(self.store.policy_objects) + 100:  # forget deleted policies
            self._written = {n: t for n, t in self._written.items() if n in self.store.policy_objects}
        written = 0
        for name in sorted(names | due | everything):
            deferrable = name not in names
            try:
                result = self.write(name, deferrable=deferrable)
            except ApiError as exc:
                if exc.status == 404:
                    self._failures.pop(name, None)
                    continue
                failures = self._failures[name] = self._failures.get(name, 0) + 1
                delay = min(self.interval * 2**failures, STATUS_BACKOFF_MAX) * random.uniform(0.5, 1.0)
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
            return "unchanged"
        previous = obj.get("status")
        policy = self.store.policies.get(name)
        now = self.clock()
        if policy is not None:
            status = reconcile.policy_status(
                policy, dict(self.store.nodes), self.store.pods_of_policy(name), previous, now, self.unconfigured(name)
            )
        else:
            generation = int((obj.get("metadata") or {}).get("generation") or 0)
            status = reconcile.invalid_status(
                generation, self.store.policy_errors.get(name, "invalid spec"), previous, now
            )
        if reconcile.same_status(previous, status):
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


class Runtime:
    def __init__(self, settings: Settings, kube: Kube | None = None) -> None:
        self.settings = settings
        self.kube = kube if kube is not None else Kube(configuration(settings.kubeconfig))
        self.store = Store()
        self.metrics = Metrics(self.store.sizes)
        self.admission = Admission(self.store, self.metrics)
        self.server = Server(self.admission, self.metrics, settings, self.kube, lambda: self.store.synced)
        self.status = StatusWriter(self.store, self.kube, settings.status_interval)
        self.unconfigured = Unconfigured(self.store, self.excluded, self.status.mark)
        self.status.unconfigured = self.unconfigured.pods
        self._stop = threading.Event()
        self._warned: set[tuple[str, str]] = set()
        """(uid, reason) of the one-off Warning events already asked for."""
        self._node_labels: dict[str, dict[str, str]] = {}
        """fiar.io labels of each node as last reconciled (not the store's copy, which the informer
        may update before kopf delivers the same change)."""

    def start(self) -> None:
        if not self.settings.standalone:
            self._ensure_peering()
        self.server.start()
        informers.start_all(self.kube, self.store, self._stop)
        self.status.start()
        log.info("webhooks on port %s, metrics on port %s", self.server.port, self.server.metrics_port)

    def _ensure_peering(self) -> None:
        """Create the ClusterKopfPeering object the replicas share (kopf only patches an existing one)."""
        body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": self.settings.peering}}
        try:
            self.kube.call("POST", PEERINGS, body=body)
        except ApiError as exc:
            if exc.status == 404:
                log.warning("kopf's ClusterKopfPeering CRD is not installed: every replica reconciles")
            elif exc.status != 409:
                raise

    def wait_synced(self, timeout: float) -> bool:
        """Wait until every index has been listed once, so the reconciler never acts on a partial view.
        False only when ``timeout`` passed first (a stopping runtime stops waiting and answers True)."""
        deadline = time.monotonic() + timeout
        while not all(self.store.synced.get(kind) for kind in READY_KINDS):
            if self._stop.wait(0.1):
                return True
            if time.monotonic() > deadline:
                return False
        return True

    def stop(self) -> None:
        self._stop.set()
        self.status.stop()
        self.server.stop()

    # -- reconciliation (active peer only) -------------------------------------------------------
    def excluded(self, namespace: str) -> bool:
        """Whether the webhooks never see ``namespace``: its pods are never re-annotated or sent events."""
        if namespace in self.settings.excluded_namespaces:
            return True
        labels = self.store.namespaces.get(namespace)
        return labels is not None and contract.NAMESPACE_IGNORE_LABEL in labels

    def _reannotate(self, record: PodRecord) -> list[Event]:
        policy = self.store.policies.get(record.policy or "")
        if policy is None or self.excluded(record.namespace):
            return []
        members: list[PodRecord] = []
        key = record.labels.get(policy.group_key_label)
        if key:
            members = self.store.group_members(record.namespace, policy.name, policy.group_key_label, key)
        action = reconcile.review_pod(record, policy, self.store.nodes, members, utc_now())
        events: list[Event] = []
        if action is not None:
            try:
                patched = self.kube.annotate_pod(
                    record.namespace,
                    record.name,
                    record.uid,
                    action.decision.annotations(),
                )
            except ApiError as exc:
                log.warning("pod %s/%s not re-annotated: %s", record.namespace, record.name, exc)
                return []
            record = self.store.put_pod(patched)
            self.metrics.reconciled.labels(action.event_reason).inc()
            self.metrics.decision(action.decision)
            events.append(Event(pod_ref(record), action.event_type, action.event_reason, action.message))
        warning = reconcile.multi_node_warning(record, policy)
        if warning and (record.uid, "MultiNodeFallback") not in self._warned:
            self._warned.add((record.uid, "MultiNodeFallback"))
            events.append(Event(pod_ref(record), "Warning", "MultiNodeFallback", warning))
        uncontrolled = reconcile.uncontrolled_containers(record, policy)
        if uncontrolled and (record.uid, "FusionNotControlled") not in self._warned:
            self._warned.add((record.uid, "FusionNotControlled"))
            message = reconcile.uncontrolled_message(record, uncontrolled)
            events.append(Event(pod_ref(record), "Warning", "FusionNotControlled", message))
        return events

    def _housekeeping(self) -> list[Event]:
        """On every handler call (the active replica only): re-check the unconfigured pods now and
        then, and the NotConfigured events the rate limit held back and now allows."""
        self.unconfigured.refresh()
        return self.unconfigured.drain()

    def on_pod(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
        return self._pod(body, deleted) + self._housekeeping()

    def _pod(self, body: Mapping[str, Any], deleted: bool) -> list[Event]:
        meta = body.get("metadata") or {}
        if deleted:
            key, uid = (str(meta.get("namespace")), str(meta.get("name"))), str(meta.get("uid") or "")
            self.store.delete_pod(*key, uid)
            self._warned.discard((uid, "MultiNodeFallback"))
            self._warned.discard((uid, "FusionNotControlled"))
            if (meta.get("labels") or {}).get(contract.LABEL_POD_POLICY):
                self.status.mark(str(meta["labels"][contract.LABEL_POD_POLICY]))
            self.unconfigured.pod_deleted(key, uid)
            return []
        record = self.store.put_pod(body)
        events = self.unconfigured.pod_changed(record)
        if not record.managed:
            return events
        self.status.mark(record.policy)
        return events + self._reannotate(record)

    def on_namespace(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
        return self._namespace(body, deleted) + self._housekeeping()

    def _namespace(self, body: Mapping[str, Any], deleted: bool) -> list[Event]:
        name = str((body.get("metadata") or {}).get("name") or "")
        if deleted:
            self.store.delete_namespace(name)
        else:
            self.store.put_namespace(body)
        return self.unconfigured.sweep()

    def on_node(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
        return self._node(body, deleted) + self._housekeeping()

    def _node(self, body: Mapping[str, Any], deleted: bool) -> list[Event]:
        meta = body.get("metadata") or {}
        name = str(meta.get("name") or "")
        if deleted:
            self.store.delete_node(name)
            self._node_labels.pop(name, None)
            self.status.mark()
            return []
        self.store.put_node(body)
        ours = {k: str(v) for k, v in (meta.get("labels") or {}).items() if k.startswith(contract.PREFIX)}
        if self._node_labels.get(name) == ours:
            return []  # a heartbeat or another component's change: nothing for fiar to do
        self._node_labels[name] = ours
        self.status.mark()
        events: list[Event] = []
        for record in self.store.pods_on_node(name):
            events += self._reannotate(record)
        return events

    def on_policy(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
        return self._policy(body, deleted) + self._housekeeping()

    def _policy(self, body: Mapping[str, Any], deleted: bool) -> list[Event]:
        name = str((body.get("metadata") or {}).get("name") or "")
        if deleted:
            self.store.delete_policy(name, str((body.get("metadata") or {}).get("uid") or ""))
            return self.unconfigured.sweep()
        self.store.put_policy(body)
        self.status.mark(name)
        events = self.unconfigured.sweep()
        for record in self.store.pods_of_policy(name):
            events += self._reannotate(record)
        return events
