"""One running operator: indexes, informers, the webhook server, and the reconciler.

The webhooks and informers run on every replica. The reconciler (re-annotating pods, events,
policy status) runs on the replica that leads by kopf's peering (``leadership``), in one thread fed
by the informers' changes: each kind is watched once per replica, and each change decided once.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import fiar_contract as contract
from fiar_kube import backoff_delay
from fiar_operator.admission.review import Admission, utc_now
from fiar_operator.admission.server import READY_KINDS, Server
from fiar_operator.core import liveness
from fiar_operator.core.errors import ApiError, Conflict, NotFound
from fiar_operator.core.liveness import Heartbeats
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.pods import PodRecord, group_plan
from fiar_operator.core.policy import Policy
from fiar_operator.core.settings import Settings
from fiar_operator.reconcile import events as posting
from fiar_operator.reconcile import rules as reconcile
from fiar_operator.reconcile.events import Event, pod_ref
from fiar_operator.reconcile.leadership import Leadership
from fiar_operator.reconcile.unconfigured import Unconfigured
from fiar_operator.reconcile.webhooksync import WebhookSync
from fiar_operator.state import informers
from fiar_operator.state.changes import Change, Changes, change_of
from fiar_operator.state.kube import Kube, configuration
from fiar_operator.state.store import Store

log = logging.getLogger(__name__)

PATCHERS: Final = 8
"""Pods re-annotated at once when a change concerns many (a node's pods, a policy's, a full pass):
100 pods on a relabelled node take 100 PATCH round trips, which one thread would make in turn."""

EVENT_POSTERS: Final = 4
"""Threads that post the reconciler's events, so that it never waits for them."""
MAX_PENDING_EVENTS: Final = 10_000
"""Events waiting to be posted at most (about 1 KiB each)."""
BATCH: Final = 1000
"""Changes the reconciler takes at once. The pods they concern are reviewed together (PATCHERS at a
time): a node's verdict restored while its pods' own changes, from the PATCHes that took the verdict
away, still wait in the queue would otherwise re-annotate those pods one PATCH after another."""

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


def settle_indexes() -> None:
    """Once every index is first listed: collect what the start left behind, then keep every object
    alive now out of the cyclic garbage collector's full passes (``gc.freeze``).

    A full pass walks every object the process holds and answers no review meanwhile: 25-51 ms here
    at 80,000-90,000 objects, with only 2,000 pods indexed, and they came again and again while pods
    were created (pod CREATEs stalled for up to 82 ms at 200 pods/s, BENCHMARKS.md). The listed
    objects live until they are replaced and hold no cycles, so reference counting still frees them;
    the passes walk only what came since. Done once: an object frozen that later becomes cyclic
    garbage is never freed, so freezing again and again would leak."""
    gc.collect()
    gc.freeze()


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
        self._node_counts: dict[str, tuple[Policy, int, dict[str, int]]] = {}
        """Policy -> (the policy, ``Store.node_changes``, its node counts then): one pass over every
        node per node change, not per write (a write is due every interval while pods change)."""
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
            try:
                self.flush()
            except Exception:  # a bug or an answer nobody foresaw must not end the status writes
                log.exception("policy status pass failed")

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
            self._node_counts = {n: c for n, c in self._node_counts.items() if n in self.store.policy_objects}
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
                counts = reconcile.node_counts(policy, dict(self.store.nodes))
                self._node_counts[name] = (policy, changes, counts)
            status = reconcile.policy_status(
                policy, {}, self.store.pods_of_policy(name), previous, now, self.unconfigured(name), counts
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


def fiar_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: str(v) for k, v in labels.items() if k.startswith(contract.PREFIX)}


class Runtime:
    def __init__(self, settings: Settings, kube: Kube | None = None, identity: str = "fiar-operator") -> None:
        self.settings = settings
        self.kube = kube if kube is not None else Kube(configuration(settings.kubeconfig))
        self.store = Store()
        self.metrics = Metrics(self.store.sizes)
        self.admission = Admission(self.store, self.metrics)
        self.heartbeats = Heartbeats()
        self.server = Server(
            self.admission, self.metrics, settings, self.kube, lambda: self.store.synced, heartbeats=self.heartbeats
        )
        self.status = StatusWriter(self.store, self.kube, settings.status_interval)
        self.unconfigured = Unconfigured(self.store, self.excluded, self.status.mark)
        self.status.unconfigured = self.unconfigured.pods
        self._stop = threading.Event()
        self._warned: set[tuple[str, str]] = set()
        """(uid, reason) of the one-off Warning events already asked for."""
        self._policies_seen: dict[str, Policy | str] = {}
        """Each policy as the reconciler last acted on it (parsed, or why it is invalid)."""
        self._node_labels: dict[str, dict[str, str]] = {}
        """fiar.io labels of each node (those that have any) as last reconciled: the store's copy
        is already updated when the reconciler learns of the change."""
        self.identity = identity
        self.changes = Changes()
        self._leading = settings.standalone
        self._resync = True
        self._settled = False
        self._settling = threading.Lock()
        self.leadership = Leadership(self.kube, settings.peering, identity, settings.priority, self._lead, self._stop)
        self._worker = threading.Thread(target=self._work, name="reconciler", daemon=True)
        self._patchers = ThreadPoolExecutor(PATCHERS, thread_name_prefix="reannotate")
        self._posters = ThreadPoolExecutor(EVENT_POSTERS, thread_name_prefix="events")
        self._pending_events = threading.BoundedSemaphore(MAX_PENDING_EVENTS)
        self.webhooks = WebhookSync(self.kube, settings.webhook_config)

    def start(self) -> None:
        if not self.settings.standalone:
            self._ensure_peering()
            self.leadership.start()
        self.server.start()
        informers.start_all(self.kube, self.store, self._stop, notify=self.notify)
        self.status.start()
        self._worker.start()
        log.info("webhooks on port %s, metrics on port %s", self.server.port, self.server.metrics_port)

    # -- the reconciler's thread -----------------------------------------------------------------
    def _lead(self, leading: bool) -> None:
        """Leadership changed: on gaining it, reconcile everything once; changes seen before are
        covered by that pass."""
        self.changes.clear()
        self._resync = True
        self._leading = leading

    def notify(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """From an informer thread, after the index applied the change."""
        if event_type == informers.LISTED and all(self.store.synced.get(k) for k in READY_KINDS):
            with self._settling:  # informers finish their lists on threads of their own
                if not self._settled:
                    self._settled = True
                    settle_indexes()
        if not self._leading:
            return
        if event_type == informers.LISTED:
            self._resync = True  # a (re-)list sends no per-object events: reconcile everything
        else:
            self.changes.put(change_of(kind, event_type, obj))

    def _work(self) -> None:
        self.heartbeats.expect(liveness.RECONCILER, liveness.RECONCILER_SILENCE)
        while not self._stop.is_set():
            self.heartbeats.beat(liveness.RECONCILER)
            if not self._leading or not all(self.store.synced.get(kind) for kind in READY_KINDS):
                self._stop.wait(0.1)
                continue
            try:
                self.step(0.5)
            except Exception:
                log.exception("reconciler: a change was not handled")

    def step(self, timeout: float) -> None:
        """One pass of the reconciler: a full pass when one is due, then every change pending (waiting
        up to ``timeout`` for one), and the housekeeping."""
        if self._resync:
            self._resync = False
            self.post(self.resync())
        changes = self.changes.take_all(timeout, BATCH)
        if self._leading:
            self.post(self.apply_all(changes) + self._housekeeping())

    def post(self, events: Sequence[Event]) -> None:
        """Hand ``events`` to the posting threads and go on: 100 pods re-annotated make 100 events,
        whose POSTs, made in turn here, held up the next change for 1-2 s (a verdict restored right
        after its removal waited for the removal's events). At most MAX_PENDING_EVENTS wait; beyond
        that the reconciler waits for room."""
        for event in events:
            while not self._pending_events.acquire(timeout=1.0):
                if self._stop.is_set():  # the posters are shut down: no room will come
                    return
                self.heartbeats.beat(liveness.RECONCILER)  # waiting for room is progress, not a hang
            try:
                self._posters.submit(self._post_one, event)
            except RuntimeError:  # shut down: the operator stops
                self._pending_events.release()
                return

    def _post_one(self, event: Event) -> None:
        try:
            posting.post(self.kube, event, self.identity)
        except ApiError as exc:
            log.warning("event %s on %s not posted: %s", event.reason, event.target.get("metadata"), exc)
        finally:
            self._pending_events.release()

    def resync(self) -> list[Event]:
        """Reconcile everything from the indexes: at the start, on gaining leadership, after a re-list.
        Each managed pod is reviewed once (late decisions and drift); unconfigured pods are swept."""
        # The policies as this pass finds them, before anything reads them: a spec stored while the
        # pass runs then differs from what is recorded here, and its own change is acted on.
        self._policies_seen = {
            name: seen for name in list(self.store.policy_objects) if (seen := self._policy_as_parsed(name)) is not None
        }
        self._node_labels = {n: ours for n, labels in list(self.store.nodes.items()) if (ours := fiar_labels(labels))}
        self.status.mark()
        self.webhooks.forget()
        self._sync_webhooks()
        self.unconfigured.forget_sweep()
        events = self.unconfigured.sweep()
        for name in sorted(self.store.policies):
            events += self._reannotate_all(self.store.pods_of_policy(name))
        return events

    def _ensure_peering(self) -> None:
        """Create the ClusterKopfPeering object the replicas share (kopf only patches an existing one)."""
        body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": self.settings.peering}}
        try:
            self.kube.call("POST", PEERINGS, body=body)
        except NotFound:
            log.warning("kopf's ClusterKopfPeering CRD is not installed: every replica reconciles")
        except Conflict:
            pass  # another replica created it

    def stop(self) -> None:
        self._stop.set()
        self.status.stop()
        self.server.stop()
        self._patchers.shutdown(wait=False, cancel_futures=True)
        self._posters.shutdown(wait=False, cancel_futures=True)

    # -- reconciliation (active peer only) -------------------------------------------------------
    def excluded(self, namespace: str) -> bool:
        """Whether the webhooks never see ``namespace``: its pods are never re-annotated or sent events."""
        if namespace in self.settings.excluded_namespaces:
            return True
        labels = self.store.namespaces.get(namespace)
        return labels is not None and contract.NAMESPACE_IGNORE_LABEL in labels

    def _review(self, record: PodRecord) -> tuple[PodRecord, Policy, reconcile.Reannotation | None] | None:
        """The pod's policy and the re-annotation it needs (None: nothing), from the indexes alone;
        None when no policy of the webhooks' reach takes it."""
        self.heartbeats.beat(liveness.RECONCILER)
        policy = self.store.policy_of(record)
        if policy is None or self.excluded(record.namespace):
            return None
        members: list[PodRecord] = []
        key = record.labels.get(policy.group_key_label)
        if key:
            members = self.store.group_members(record.namespace, policy.name, policy.group_key_label, key)
        return record, policy, reconcile.review_pod(record, policy, self.store.nodes, members, utc_now())

    def _patch(self, action: reconcile.Reannotation) -> PodRecord | None:
        """The PATCH of one re-annotation; the pod as stored after it, None when it failed."""
        self.heartbeats.beat(liveness.RECONCILER)  # 100s of PATCHes take a while: each is progress
        record = action.pod
        try:
            patched = self.kube.annotate_pod(record.namespace, record.name, record.uid, action.decision.annotations())
        except ApiError as exc:
            log.warning("pod %s/%s not re-annotated: %s", record.namespace, record.name, exc)
            return None
        return self.store.put_pod(patched)

    def _reannotate_all(self, records: Sequence[PodRecord]) -> list[Event]:
        """Review each pod once, here (in memory: most reviews change nothing); the PATCHes of those
        that need one go out PATCHERS at a time."""
        reviewed = [found for record in records if (found := self._review(record)) is not None]
        actions = [action for _, _, action in reviewed if action is not None]
        if len(actions) < 2:
            done = [self._patch(action) for action in actions]
        else:
            done = list(self._patchers.map(self._patch, actions))
        results = iter(done)  # in the order of ``actions``
        events: list[Event] = []
        for record, policy, action in reviewed:
            if action is not None:
                patched = next(results)
                if patched is None:
                    continue
                record = patched
                self.metrics.reconciled.labels(action.event_reason).inc()
                self.metrics.decision(action.decision)
                events.append(Event(pod_ref(record), action.event_type, action.event_reason, action.message))
            events += self._warnings(record, policy)
        return events

    def _warnings(self, record: PodRecord, policy: Policy) -> list[Event]:
        """The one-off Warning events of a managed pod: a multi-node fallback, fusion not controlled."""
        events: list[Event] = []
        warning = reconcile.multi_node_warning(record, policy)
        if warning and (record.uid, "MultiNodeFallback") not in self._warned:
            self._warned.add((record.uid, "MultiNodeFallback"))
            events.append(Event(pod_ref(record), "Warning", "MultiNodeFallback", warning))
        paths = reconcile.not_turned_off(record)
        if paths and (record.uid, "FlashInferNotTurnedOff") not in self._warned:
            self._warned.add((record.uid, "FlashInferNotTurnedOff"))
            message = reconcile.not_turned_off_message(record, paths)
            events.append(Event(pod_ref(record), "Warning", "FlashInferNotTurnedOff", message))
        uncontrolled = reconcile.uncontrolled_containers(record, policy)
        if uncontrolled and (record.uid, "FusionNotControlled") not in self._warned:
            self._warned.add((record.uid, "FusionNotControlled"))
            message = reconcile.uncontrolled_message(record, uncontrolled)
            events.append(Event(pod_ref(record), "Warning", "FusionNotControlled", message))
        return events

    def _housekeeping(self) -> list[Event]:
        """After every change (the leader only), and at least every 0.5 s: re-check the unconfigured
        pods now and then, and the NotConfigured events the rate limit held back and now allows."""
        self.unconfigured.refresh()
        if self.webhooks.due():
            self._sync_webhooks()
        return self.unconfigured.drain()

    # Index an object and reconcile it: the informers index first and call ``apply`` through the
    # queue; these entry points do both at once (tests, and tools that feed objects by hand).
    def on_pod(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
        meta = body.get("metadata") or {}
        if deleted:
            self.store.delete_pod(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid") or ""))
        else:
            self.store.put_pod(body)
        return self.apply(change_of("pods", "DELETED" if deleted else "MODIFIED", body)) + self._housekeeping()

    def on_namespace(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
        name = str((body.get("metadata") or {}).get("name") or "")
        if deleted:
            self.store.delete_namespace(name)
        else:
            self.store.put_namespace(body)
        return self.apply(change_of("namespaces", "DELETED" if deleted else "MODIFIED", body)) + self._housekeeping()

    def on_node(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
        name = str((body.get("metadata") or {}).get("name") or "")
        if deleted:
            self.store.delete_node(name)
        else:
            self.store.put_node(body)
        return self.apply(change_of("nodes", "DELETED" if deleted else "MODIFIED", body)) + self._housekeeping()

    def on_policy(self, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
        meta = body.get("metadata") or {}
        if deleted:
            self.store.delete_policy(str(meta.get("name") or ""), str(meta.get("uid") or ""))
        else:
            self.store.put_policy(body)
        return self.apply(change_of("policies", "DELETED" if deleted else "MODIFIED", body)) + self._housekeeping()

    def apply(self, change: Change) -> list[Event]:
        """Reconcile one changed object, already indexed (or removed from the index)."""
        return self.apply_all([change])

    def apply_all(self, changes: Sequence[Change]) -> list[Event]:
        """Reconcile changed objects, already indexed, in order; each pod they concern is reviewed
        once, against the indexes as they are after all of them, the PATCHes PATCHERS at a time."""
        events: list[Event] = []
        review: dict[tuple[str, str], str] = {}
        """Pod key -> uid of the pods to review, in the order the changes named them."""
        for change in changes:
            more, records = self._changed(change)
            events += more
            for named in records:
                review.setdefault((named.namespace, named.name), named.uid)
        current = [found for key, uid in review.items() if (found := self.store.pods.get(key)) and found.uid == uid]
        return events + self._reannotate_all(current)

    def _changed(self, change: Change) -> tuple[list[Event], list[PodRecord]]:
        """The events of one change, and the pods it asks to review."""
        if change.kind == "pods":
            return self._pod(change)
        if change.kind == "nodes":
            return [], self._node(change)
        if change.kind == "namespaces":
            return self.unconfigured.sweep(), []
        if change.kind == "policies":
            return self._policy(change)
        return [], []

    def _pod(self, change: Change) -> tuple[list[Event], list[PodRecord]]:
        key = (change.namespace, change.name)
        if change.deleted:
            self._warned.discard((change.uid, "MultiNodeFallback"))
            self._warned.discard((change.uid, "FusionNotControlled"))
            self._warned.discard((change.uid, "FlashInferNotTurnedOff"))
            if change.policy:
                self.status.mark(change.policy)
            self.unconfigured.pod_deleted(key, change.uid)
            return [], []
        record = self.store.pods.get(key)
        if record is None or (change.uid and record.uid != change.uid):
            return [], []  # gone or replaced since: its own change follows
        events = self.unconfigured.pod_changed(record)
        if not record.managed:
            return events, []
        bound = self.webhooks.binding_namespaces
        if bound is not None and record.namespace not in bound:
            self._sync_webhooks()  # a managed pod where the binding condition names no policy's namespace
        self.status.mark(record.policy)
        return events, [record]

    def _node(self, change: Change) -> list[PodRecord]:
        name = change.name
        labels = self.store.nodes.get(name)
        if change.deleted or labels is None:
            self._node_labels.pop(name, None)
            self.status.mark()
            return []
        ours = fiar_labels(labels)
        if self._node_labels.get(name, {}) == ours:
            return []  # a heartbeat or another component's change: nothing for fiar to do
        if ours:
            self._node_labels[name] = ours
        else:
            self._node_labels.pop(name, None)
        self.status.mark()
        return self._with_group_members(self.store.pods_on_node(name))

    def _with_group_members(self, records: Sequence[PodRecord]) -> list[PodRecord]:
        """``records`` and the members of their multi-pod groups on other nodes: a node that loses mnnvl
        breaks its whole group, and a member elsewhere may see no pod event of its own for a long time."""
        found = {(r.namespace, r.name): r for r in records}
        for record in records:
            policy = self.store.policy_of(record)
            key = record.labels.get(policy.group_key_label) if policy is not None else None
            if policy is None or not key or not group_plan(record, policy).multi:
                continue
            for member in self.store.group_members(record.namespace, policy.name, policy.group_key_label, key):
                found.setdefault((member.namespace, member.name), member)
        return list(found.values())

    def _sync_webhooks(self) -> None:
        managed = {namespace for keys in list(self.store.by_policy.values()) for namespace, _ in list(keys)}
        self.webhooks.sync(list(self.store.policies.values()), managed)
        self.metrics.conditions_follow_policies.set(0 if self.webhooks.fallback is not None else 1)
        target = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.webhooks.name},
        }
        self.post(
            [
                Event(
                    target,
                    "Warning",
                    "MatchConditionsFallback",
                    f"the webhooks fall back to their static conditions (every pod the chart's rules name "
                    f"reaches them; nothing is skipped): {fallback.reason}",
                )
                for fallback in self.webhooks.take_fallbacks()
            ]
        )

    def _policy_as_parsed(self, name: str) -> Policy | str | None:
        return self.store.policies.get(name) or self.store.policy_errors.get(name)

    def _policy(self, change: Change) -> tuple[list[Event], list[PodRecord]]:
        """A policy's spec changed, it came or went: its pods are reviewed, the unconfigured pods
        swept, the webhook configuration followed. A change the parsed policy does not show (its
        status, written here every half second while its pods change) concerns no pod: reviewing
        all of them for it made every status write cost work in proportion to the policy's pods."""
        seen = self._policy_as_parsed(change.name)
        if change.deleted:
            self._policies_seen.pop(change.name, None)
        elif seen is not None and self._policies_seen.get(change.name) == seen:
            self.status.mark(change.name)  # a status written by someone else is set right again
            return [], []
        elif seen is not None:
            self._policies_seen[change.name] = seen
        self._sync_webhooks()
        if change.deleted:
            return self.unconfigured.sweep(), []
        self.status.mark(change.name)
        return self.unconfigured.sweep(), self.store.pods_of_policy(change.name)
