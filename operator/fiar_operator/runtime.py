"""One running operator: indexes, informers, the webhook server, and the reconciler's actions.

The webhooks and informers run on every replica. The reconciler's actions (re-annotating pods,
events, policy status) are called from kopf handlers, which run on the active peer only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import fiar_contract as contract
from fiar_operator import informers, reconcile
from fiar_operator.admission import Admission, utc_now
from fiar_operator.errors import ApiError
from fiar_operator.kube import Kube, configuration
from fiar_operator.metrics import Metrics
from fiar_operator.pods import PodRecord
from fiar_operator.server import READY_KINDS, Server
from fiar_operator.settings import Settings
from fiar_operator.store import Store

log = logging.getLogger(__name__)

PEERINGS = "/apis/kopf.dev/v1/clusterkopfpeerings"


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


class StatusWriter:
    """Writes policy statuses for the policies marked since the last pass (batched, only on change)."""

    def __init__(
        self,
        store: Store,
        kube: Kube,
        interval: float,
        clock: Callable[[], str] = utc_now,
        unconfigured: Callable[[str], int] = lambda _name: 0,
    ) -> None:
        self.store, self.kube, self.interval, self.clock = store, kube, interval, clock
        self.unconfigured = unconfigured
        self._marked: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-writer", daemon=True)

    def mark(self, name: str | None = None) -> None:
        with self._lock:
            if name is None:
                self._marked.update(self.store.policy_objects)
            else:
                self._marked.add(name)

    def start(self) -> None:
        self._thread.start()

    def wait_synced(self, timeout: float) -> bool:
        """Wait until every index has been listed once (the reconciler should not act on a partial view)."""
        deadline = time.monotonic() + timeout
        while not all(self.store.synced.get(kind) for kind in READY_KINDS):
            if self._stop.wait(0.1) or time.monotonic() > deadline:
                return False
        return True

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                names, self._marked = self._marked, set()
            for name in sorted(names):
                try:
                    self.write(name)
                except ApiError as exc:
                    log.warning("status of policy %s not written: %s", name, exc)
                    if exc.status != 404:
                        self.mark(name)

    def write(self, name: str) -> bool:
        """Write one policy's status if it changed; whether it was written."""
        obj = self.store.policy_objects.get(name)
        if obj is None:
            return False
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
            return False
        self.store.put_policy(self.kube.patch_policy_status(name, status))
        return True


class Runtime:
    def __init__(self, settings: Settings, kube: Kube | None = None) -> None:
        self.settings = settings
        self.kube = kube if kube is not None else Kube(configuration(settings.kubeconfig))
        self.store = Store()
        self.metrics = Metrics(self.store.sizes)
        self.admission = Admission(self.store, self.metrics)
        self.server = Server(self.admission, self.metrics, settings, self.kube, lambda: self.store.synced)
        self._unconfigured: dict[str, dict[tuple[str, str], str]] = {}
        """Policy name -> pods it selects that the pod webhook never configured (key -> uid)."""
        self.status = StatusWriter(
            self.store,
            self.kube,
            settings.status_interval,
            unconfigured=self.unconfigured,
        )
        self._stop = threading.Event()
        self._lock = threading.RLock()
        """kopf runs handlers in a thread pool: guards the reconciler's own bookkeeping below."""
        self._swept: dict[str, int] = {}
        """Policy name -> the generation whose unconfigured pods were last computed."""
        self._warned: set[str] = set()
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
        """Wait until every index has been listed once (the reconciler should not act on a partial view)."""
        deadline = time.monotonic() + timeout
        while not all(self.store.synced.get(kind) for kind in READY_KINDS):
            if self._stop.wait(0.1) or time.monotonic() > deadline:
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
                    {
                        contract.ANNOTATION_POD_BACKEND: action.decision.backend,
                        contract.ANNOTATION_POD_DECISION: action.decision.to_json(),
                    },
                )
            except ApiError as exc:
                log.warning("pod %s/%s not re-annotated: %s", record.namespace, record.name, exc)
                return []
            record = self.store.put_pod(patched)
            self.metrics.reconciled.labels(action.event_reason).inc()
            self.metrics.decision(action.decision)
            events.append(Event(pod_ref(record), action.event_type, action.event_reason, action.message))
        warning = reconcile.multi_node_warning(record)
        if warning and record.uid not in self._warned:
            self._warned.add(record.uid)
            events.append(Event(pod_ref(record), "Warning", "MultiNodeFallback", warning))
        return events

    # -- pods the pod webhook never configured ----------------------------------------------------
    def unconfigured(self, policy: str) -> int:
        """How many pods ``policy`` selects that the pod webhook never configured."""
        with self._lock:
            return len(self._unconfigured.get(policy, {}))

    def _track_unconfigured(self, key: tuple[str, str], record: PodRecord | None) -> list[Event]:
        """Update which policy (if any) reports the pod at ``key`` as unconfigured; the event for a new one."""
        with self._lock:
            return self._track_unconfigured_locked(key, record)

    def _track_unconfigured_locked(self, key: tuple[str, str], record: PodRecord | None) -> list[Event]:
        policy = None
        if record is not None and not self.excluded(record.namespace):
            policy = reconcile.unconfigured_by(
                record, self.store.policies.values(), self.store.namespaces.get(record.namespace)
            )
        for name, pods in list(self._unconfigured.items()):
            if key in pods and (policy is None or policy.name != name):
                del pods[key]
                self.status.mark(name)
        if policy is None or record is None:
            return []
        pods = self._unconfigured.setdefault(policy.name, {})
        if key not in pods:
            pods[key] = record.uid
            self.status.mark(policy.name)
        if record.uid in self._warned:
            return []
        self._warned.add(record.uid)
        return [Event(pod_ref(record), "Warning", "NotConfigured", reconcile.unconfigured_message(policy))]

    def sweep_unconfigured(self) -> list[Event]:
        """Recompute the unconfigured pods of every policy from the pod index, when a policy was added,
        deleted or its spec changed (not on its own status writes)."""
        with self._lock:
            policies = dict(self.store.policies)
            generations = {name: p.generation for name, p in policies.items()}
            if generations == self._swept:
                return []
            self._swept = generations
            found = reconcile.unconfigured_pods(
                self.store.all_pods(), policies.values(), self.store.namespaces, self.excluded
            )
            events: list[Event] = []
            for name in set(self._unconfigured) | set(found):
                fresh = {p.key: p.uid for p in found.get(name, [])}
                if self._unconfigured.get(name) != fresh:
                    self.status.mark(name)
                if name in policies:
                    self._unconfigured[name] = fresh
                else:
                    self._unconfigured.pop(name, None)
            for name, records in found.items():
                message = reconcile.unconfigured_message(policies[name])
                for record in records:
                    if record.uid not in self._warned:
                        self._warned.add(record.uid)
                        events.append(Event(pod_ref(record), "Warning", "NotConfigured", message))
            return events

    def on_pod(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
        meta = body.get("metadata") or {}
        if deleted:
            key = (str(meta.get("namespace")), str(meta.get("name")))
            self.store.delete_pod(*key, str(meta.get("uid") or ""))
            self._warned.discard(str(meta.get("uid") or ""))
            if (meta.get("labels") or {}).get(contract.LABEL_POD_POLICY):
                self.status.mark(str(meta["labels"][contract.LABEL_POD_POLICY]))
            self._track_unconfigured(key, None)
            return []
        record = self.store.put_pod(body)
        if not record.managed:
            return self._track_unconfigured(record.key, record)
        self._track_unconfigured(record.key, None)
        self.status.mark(record.policy)
        return self._reannotate(record)

    def on_node(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
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
        name = str((body.get("metadata") or {}).get("name") or "")
        if deleted:
            self.store.delete_policy(name)
            return self.sweep_unconfigured()
        self.store.put_policy(body)
        self.status.mark(name)
        events = self.sweep_unconfigured()
        for record in self.store.pods_of_policy(name):
            events += self._reannotate(record)
        return events
