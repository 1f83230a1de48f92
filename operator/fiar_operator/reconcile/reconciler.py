"""The reconciler: the leader's one thread, which keeps every managed pod's annotations on what
its node verified.

The informers tell it of each change after the index has it (``notify``); on the replica that
leads by kopf's peering (``lead``), it takes the changes in batches (``step``), reviews the pods they
concern against the indexes, re-annotates those that need it (``PATCHERS`` at a time), posts the
events, and marks the policies whose status may have changed. It owns what it remembers: the
changes pending, the fiar labels and policies it last acted on, and the one-off warnings sent.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import fiar_contract as contract
from fiar_operator.core import liveness
from fiar_operator.core.decide import utc_now
from fiar_operator.core.errors import ApiError
from fiar_operator.core.liveness import Heartbeats
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.pods import PodRecord, group_plan
from fiar_operator.core.policy import Policy
from fiar_operator.core.settings import Settings
from fiar_operator.reconcile import rules
from fiar_operator.reconcile.events import Event, Poster, pod_ref
from fiar_operator.reconcile.recreate import Recreator
from fiar_operator.reconcile.scan import Scanner
from fiar_operator.reconcile.status import Marks, StatusWriter
from fiar_operator.reconcile.unconfigured import Unconfigured
from fiar_operator.reconcile.webhooksync import WebhookSync
from fiar_operator.state import informers, kinds
from fiar_operator.state.changes import Change, Changes, change_of
from fiar_operator.state.kube import Kube
from fiar_operator.state.store import Store

log = logging.getLogger(__name__)

PATCHERS: Final = 8
"""Pods re-annotated at once when a change concerns many (a node's pods, a policy's, a full pass):
100 pods on a relabelled node take 100 PATCH round trips, which one thread would make in turn."""

BATCH: Final = 1000
"""Changes the reconciler takes at once. The pods they concern are reviewed together (PATCHERS at a
time): a node's verdict restored while its pods' own changes, from the PATCHes that took the verdict
away, still wait in the queue would otherwise re-annotate those pods one PATCH after another."""

LINGER: Final = 0.02
"""Seconds the reconciler lets changes gather once one came. Pods created at 200 a second make about
1,000 watch events a second; woken by each, the reconciler made a pass (take, review, housekeeping,
post) per event, and a pod's ADDED and MODIFIED were reviewed apart. Gathered, it makes at most 50
passes a second, each reviewing a pod once. The changes of 20 ms take a pass under 1 ms (about
36 µs a change in BENCHMARKS.md's run), well inside the interpreter's 5 ms switch interval, so a
pass holds up a review no longer than any other thread may. No admission waits for the reconciler."""


def fiar_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: str(v) for k, v in labels.items() if k.startswith(contract.PREFIX)}


class Reconciler:
    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        store: Store,
        metrics: Metrics,
        heartbeats: Heartbeats,
        stop: threading.Event,
        identity: str = "fiar-operator",
    ) -> None:
        self.settings, self.kube, self.store, self.metrics = settings, kube, store, metrics
        self.heartbeats, self._stop = heartbeats, stop
        self.changes = Changes()
        marks = Marks()
        self.unconfigured = Unconfigured(store, self.excluded, marks.mark, poke=lambda: self.scanner.poke())
        self.scanner = Scanner(
            kube,
            lambda: list(self.store.policies.values()),
            lambda: dict(self.store.namespaces),
            self.excluded,
            self.unconfigured.scanned,
            settings.unconfigured_interval,
            stop,
            ready=lambda: self._leading and kinds.all_listed(self.store.synced),
            metrics=metrics,
        )
        self.recreator = Recreator(kube, self.unconfigured, marks.mark) if settings.recreate_unconfigured else None
        self.status = StatusWriter(
            store,
            kube,
            settings.status_interval,
            unconfigured=self.unconfigured.pods,
            marks=marks,
            recreated=self.recreator.recreated if self.recreator is not None else lambda _name: 0,
        )
        self.webhooks = WebhookSync(kube, settings.webhook_config)
        self.events = Poster(kube, identity, stop, waiting=lambda: self.heartbeats.beat(liveness.RECONCILER))
        self._warned: set[tuple[str, str]] = set()
        """(uid, reason) of the one-off Warning events already asked for."""
        self._policies_seen: dict[str, Policy | str] = {}
        """Each policy as the reconciler last acted on it (parsed, or why it is invalid)."""
        self._node_labels: dict[str, dict[str, str]] = {}
        """fiar.io labels of each node (those that have any) as last reconciled: the store's copy
        is already updated when the reconciler learns of the change."""
        self._leading = settings.standalone
        self._resync = True
        self._thread = threading.Thread(target=self._work, name="reconciler", daemon=True)
        self._patchers = ThreadPoolExecutor(PATCHERS, thread_name_prefix="reannotate")
        self.handlers: Mapping[str, Callable[[Change], tuple[list[Event], list[PodRecord]]]] = {
            kinds.PODS.name: self._pod,
            kinds.NODES.name: self._node,
            kinds.NAMESPACES.name: self._namespace,
            kinds.POLICIES.name: self._policy,
        }
        """What a change of each watched kind asks for: its events, and the pods to review."""

    def start(self) -> None:
        self.status.start()
        self._thread.start()
        self.scanner.start()

    def stop(self) -> None:
        self.status.stop()
        self._patchers.shutdown(wait=False, cancel_futures=True)
        self.events.shutdown()

    # -- the reconciler's thread -----------------------------------------------------------------
    def lead(self, leading: bool) -> None:
        """Leadership changed: on gaining it, reconcile everything once; changes seen before are
        covered by that pass."""
        self.changes.clear()
        self._resync = True
        self._leading = leading

    def notify(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """From an informer thread, after the index applied the change."""
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
            if not self._leading or not kinds.all_listed(self.store.synced):
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
        changes = self.changes.take_all(timeout, BATCH, LINGER)
        if self._leading:
            self.post(self.apply_all(changes) + self.housekeeping())

    def post(self, events: Sequence[Event]) -> None:
        """Hand ``events`` to the posting threads and go on (``Poster``)."""
        self.events.post(events)

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

    # -- reconciliation (active peer only) -------------------------------------------------------
    def excluded(self, namespace: str) -> bool:
        """Whether the webhooks never see ``namespace``: its pods are never re-annotated or sent events."""
        if namespace in self.settings.excluded_namespaces:
            return True
        labels = self.store.namespaces.get(namespace)
        return labels is not None and contract.NAMESPACE_IGNORE_LABEL in labels

    def _review(self, record: PodRecord) -> tuple[PodRecord, Policy, rules.Reannotation | None] | None:
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
        return record, policy, rules.review_pod(record, policy, self.store.nodes, members, utc_now())

    def _patch(self, action: rules.Reannotation) -> PodRecord | None:
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
        warning = rules.multi_node_warning(record, policy)
        if warning and (record.uid, "MultiNodeFallback") not in self._warned:
            self._warned.add((record.uid, "MultiNodeFallback"))
            events.append(Event(pod_ref(record), "Warning", "MultiNodeFallback", warning))
        paths = rules.not_turned_off(record)
        if paths and (record.uid, "FlashInferNotTurnedOff") not in self._warned:
            self._warned.add((record.uid, "FlashInferNotTurnedOff"))
            message = rules.not_turned_off_message(record, paths)
            events.append(Event(pod_ref(record), "Warning", "FlashInferNotTurnedOff", message))
        release = rules.release_not_qualified(record)
        if release and (policy.name, f"release {release}") not in self._warned:
            self._warned.add((policy.name, f"release {release}"))  # once per policy and release
            message = rules.release_not_qualified_message(policy.name, release)
            events.append(Event(pod_ref(record), "Warning", "ReleaseNotQualified", message))
        left_out = rules.not_applied(record)
        if left_out and (record.uid, "ValueNotApplied") not in self._warned:
            self._warned.add((record.uid, "ValueNotApplied"))
            events.append(
                Event(pod_ref(record), "Warning", "ValueNotApplied", rules.not_applied_message(record, left_out))
            )
        uncontrolled = rules.uncontrolled_containers(record, policy)
        if uncontrolled and (record.uid, "FusionNotControlled") not in self._warned:
            self._warned.add((record.uid, "FusionNotControlled"))
            message = rules.uncontrolled_message(record, uncontrolled)
            events.append(Event(pod_ref(record), "Warning", "FusionNotControlled", message))
        return events

    def housekeeping(self) -> list[Event]:
        """After every change (the leader only), and at least every 0.5 s: re-check the unconfigured
        pods now and then, the NotConfigured events the rate limit held back and now allows, and
        (``--recreate-unconfigured``) the evictions it allows."""
        self.unconfigured.refresh()
        if self.webhooks.due():
            self._sync_webhooks()
        events = self.unconfigured.drain()
        if self.recreator is not None:
            events += self.recreator.step()
        return events

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
        handler = self.handlers.get(change.kind)
        return handler(change) if handler is not None else ([], [])

    def _pod(self, change: Change) -> tuple[list[Event], list[PodRecord]]:
        key = (change.namespace, change.name)
        if change.deleted:
            self._warned.discard((change.uid, "MultiNodeFallback"))
            self._warned.discard((change.uid, "FusionNotControlled"))
            self._warned.discard((change.uid, "FlashInferNotTurnedOff"))
            self._warned.discard((change.uid, "ValueNotApplied"))
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

    def _node(self, change: Change) -> tuple[list[Event], list[PodRecord]]:
        name = change.name
        labels = self.store.nodes.get(name)
        if change.deleted or labels is None:
            self._node_labels.pop(name, None)
            self.status.mark()
            return [], []
        ours = fiar_labels(labels)
        if self._node_labels.get(name, {}) == ours:
            return [], []  # a heartbeat or another component's change: nothing for fiar to do
        if ours:
            self._node_labels[name] = ours
        else:
            self._node_labels.pop(name, None)
        self.status.mark()
        return [], self._with_group_members(self.store.pods_on_node(name))

    def _namespace(self, _change: Change) -> tuple[list[Event], list[PodRecord]]:
        return self.unconfigured.sweep(), []

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

    def _managed_namespaces(self) -> set[str]:
        return {namespace for keys in list(self.store.by_policy.values()) for namespace, _ in list(keys)}

    def admit_policy(self, policy: Policy) -> None:
        """From the policy webhook (a review thread), before ``policy`` is stored: the webhooks'
        conditions cover it now (``WebhookSync.admit``), not once the leader's watch brings it."""
        done = self.webhooks.admit(
            policy, list(self.store.policies.values()), self._managed_namespaces(), self._leading
        )
        log.info("policy %s admitted: webhook conditions %s", policy.name, done)

    def _sync_webhooks(self) -> None:
        self.webhooks.sync(list(self.store.policies.values()), self._managed_namespaces())
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
