"""The operator's in-memory indexes: nodes, namespaces, policies, pods, and the admission memo.

They hold what the watches select (``kinds.WATCHED``): GPU nodes, every namespace and policy, and
only the pods the pod webhook configured, so they grow with what fiar manages, not with the cluster.

Informer threads write (and the reconciler, the pods it patched); the webhooks only read. Writers hold one lock; readers
take single dict lookups (atomic in CPython) or copies made under the lock, so a webhook never
waits on a writer for long and never calls the API server for an object the indexes know.

An object can arrive twice (its watch event, and the answer to the reconciler's own PATCH); an
update whose resourceVersion is older than the stored one is ignored.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from fiar_operator.core import policy as policies
from fiar_operator.core.errors import PolicyError
from fiar_operator.core.pods import GENERATED_BASE_MAX, PodRecord, generated_base, pod_record
from fiar_operator.core.strings import shared_strings

log = logging.getLogger(__name__)

MEMO_BYTES: Final = 16 * 1024 * 1024
"""Estimated bytes the admission memo holds at most (oldest entries dropped first)."""
MEMO_ENTRY_BYTES: Final = 16 * 1024
"""An entry estimated larger than this is not kept (its binding reads the pod instead)."""
MEMO_TTL: Final = 120.0
"""Seconds an admission-memo entry is trusted. It only bridges a pod's CREATE and its first watch
event (usually milliseconds apart); after that the pod index answers."""
ENTRY_OVERHEAD: Final = 600
"""Estimated bytes of an entry beyond its strings (objects, dict slots, the key)."""


SAMPLE: Final = 200
"""Records whose deep size estimates an index's bytes (``Store.index_bytes``)."""
BYTES_TTL: Final = 30.0
"""Seconds an estimate of the indexes' bytes is kept."""


def _deep_size(obj: object, seen: set[int]) -> int:
    """Bytes of ``obj`` and what it holds (containers, dataclass fields), each object once."""
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, str | bytes | int | float | bool) or obj is None:
        return size
    if isinstance(obj, Mapping):
        return size + sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    if isinstance(obj, tuple | list | set | frozenset):
        return size + sum(_deep_size(item, seen) for item in obj)
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields is not None:
        return size + sum(_deep_size(getattr(obj, name, None), seen) for name in fields)
    return size


def _estimate(sample: list[tuple[Any, Any]], count: int) -> int:
    if not sample:
        return 0
    total = sum(_deep_size(item, set()) for item in sample)
    return total * count // len(sample)


def _newer(new: str, old: str) -> bool:
    """Whether resourceVersion ``new`` is not older than ``old`` (opaque strings; integers in practice)."""
    if not old or not new:
        return True
    try:
        return int(new) >= int(old)
    except ValueError:
        return True


def _version(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


def describe(obj: Any) -> str:
    """``namespace/name`` of an object for a log line, whatever shape it has."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return "an object without metadata"
    name = str(meta.get("name") or "?")
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


@dataclass(frozen=True)
class MemoEntry:
    record: PodRecord | None
    """What a binding needs of the pod; None: two different pods were admitted under this key
    within the TTL (a forged review, or a changed template), so the memo answers nothing for it."""
    expires: float
    size: int


def memo_record(record: PodRecord, group_label: str | None) -> PodRecord:
    """The part of an admitted pod's record a binding decision reads: its policy and, of its labels,
    only the policy's group key (policy, group, IMEX channel claims, node constraint)."""
    labels = {group_label: record.labels[group_label]} if group_label and group_label in record.labels else {}
    return PodRecord(
        namespace=record.namespace,
        name=record.name,
        generate_name=record.generate_name,
        policy=record.policy,
        labels=labels,
        lws_size=record.lws_size,
        constraint=record.constraint,
        pinned_backend=record.pinned_backend,
        clique_affinity=frozenset(p for p in record.clique_affinity if p[0] == group_label),
        imex_claims=record.imex_claims,
        releases=record.releases,
        options=record.options,
    )


def memo_size(record: PodRecord) -> int:
    """Estimated bytes a memo entry for ``record`` holds."""
    strings = [record.namespace, record.name, record.generate_name, record.policy or ""]
    strings += [*record.labels, *record.labels.values()]
    strings += [s for pair in record.constraint.node_selector for s in pair]
    for term in record.constraint.terms:
        for requirement in term:
            strings += [requirement.key, requirement.operator, *requirement.values]
    strings += [s for pair in record.clique_affinity for s in pair]
    strings += record.imex_claims
    strings += [s for pair in record.releases for s in pair]
    strings += [name for name, _ in record.options] + [u for _, read in record.options for u in read.unread]
    strings += [d for _, read in record.options for d in read.decode_backends]
    return ENTRY_OVERHEAD + sum(len(s) + 50 for s in strings)


class Relisted(Protocol):
    """What a re-list needs of its kind (a row of ``kinds.WATCHED``)."""

    @property
    def name(self) -> str: ...
    @property
    def indexes(self) -> tuple[str, ...]: ...
    def put(self, store: Store, obj: Mapping[str, Any], /) -> object: ...
    def relisted(self, store: Store, /) -> object: ...


class Store:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.RLock()
        self._clock = clock
        self.nodes: dict[str, dict[str, str]] = {}
        self._node_versions: dict[str, str] = {}
        self.node_changes = 0
        """Grows with every change to the nodes' labels: what a figure over all nodes is keyed by."""
        self.namespaces: dict[str, dict[str, str]] = {}
        self._namespace_versions: dict[str, str] = {}
        self.policies: dict[str, policies.Policy] = {}
        self.policy_objects: dict[str, Mapping[str, Any]] = {}
        self.policy_errors: dict[str, str] = {}
        self.pods: dict[tuple[str, str], PodRecord] = {}
        self.by_node: dict[str, dict[tuple[str, str], None]] = {}
        self.by_policy: dict[str, dict[tuple[str, str], None]] = {}
        """The keys of the pods on each node and of each policy's label (a dict, not a set: a set of
        20,000 keys takes 2 MiB, four slots a key, a dict 0.6 MiB)."""
        self._memo: OrderedDict[tuple[str, str, bool], MemoEntry] = OrderedDict()
        self._memo_bytes = 0
        self.synced: dict[str, bool] = {}
        self._bytes: tuple[float, dict[str, int]] | None = None

    # -- nodes -----------------------------------------------------------------------------------
    def put_node(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name, version = str(meta.get("name") or ""), _version(obj)
        if not name:
            return
        with self._lock:
            if not _newer(version, self._node_versions.get(name, "")):
                return
            labels = shared_strings(meta.get("labels") or {})
            if self.nodes.get(name) != labels:  # a status heartbeat changes no label
                self.node_changes += 1
            self.nodes[name] = labels
            self._node_versions[name] = version

    def count_node_change(self) -> None:
        """Mark the node labels changed (a re-list of the nodes)."""
        with self._lock:
            self.node_changes += 1

    def delete_node(self, name: str) -> None:
        with self._lock:
            if self.nodes.pop(name, None) is not None:
                self.node_changes += 1
            self._node_versions.pop(name, None)

    # -- namespaces ------------------------------------------------------------------------------
    def put_namespace(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name, version = str(meta.get("name") or ""), _version(obj)
        if not name:
            return
        with self._lock:
            if not _newer(version, self._namespace_versions.get(name, "")):
                return  # older than what is indexed
            self.namespaces[name] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
            self._namespace_versions[name] = version

    def delete_namespace(self, name: str) -> None:
        with self._lock:
            self.namespaces.pop(name, None)
            self._namespace_versions.pop(name, None)

    # -- policies --------------------------------------------------------------------------------
    def put_policy(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if not name:
            return
        with self._lock:
            old = self.policy_objects.get(name)
            if old is not None and not _newer(_version(obj), _version(old)):
                return  # older than what is indexed (a status the reconciler wrote, then its watch event)
            self.policy_objects[name] = obj
            try:
                self.policies[name] = policies.parse_policy(obj)
                self.policy_errors.pop(name, None)
            except PolicyError as exc:
                self.policies.pop(name, None)
                self.policy_errors[name] = str(exc)

    def delete_policy(self, name: str, uid: str = "") -> None:
        """Forget a policy (only the object with ``uid``, when given: not a re-created one of that name)."""
        with self._lock:
            old = self.policy_objects.get(name)
            if uid and old is not None and str((old.get("metadata") or {}).get("uid") or "") not in ("", uid):
                return
            self.policies.pop(name, None)
            self.policy_objects.pop(name, None)
            self.policy_errors.pop(name, None)

    # -- pods ------------------------------------------------------------------------------------
    def put_pod(self, obj: Mapping[str, Any]) -> PodRecord:
        """Index a pod the pod webhook configured (its ``fiar.io/policy`` label: what the pod watch
                selects); the record of any other pod is returned and not kept, since no watch event would
                ever remove it (a pod the binding webhook had to read); a newer version of an indexed pod that lost
        the label removes it, as its watch event will."""
        meta = obj.get("metadata") or {}
        held = self.pods.get((str(meta.get("namespace") or ""), str(meta.get("name") or ""))) if meta else None
        record = pod_record(obj, previous=held)  # ``held`` is a hint only: pod_record checks uid and generation
        key = record.key  # one tuple for the pod's entries in every index
        if not record.managed:
            with self._lock:  # a newer version of an indexed pod without the label: it left the selection
                old = self.pods.get(key)
                if old is not None and old.uid == record.uid and _newer(record.resource_version, old.resource_version):
                    del self.pods[key]
                    self._unindex(old)
            return record
        with self._lock:
            old = self.pods.get(key)
            if old is not None and old.uid == record.uid and not _newer(record.resource_version, old.resource_version):
                return old
            if old is not None:
                self._unindex(old)
            self.pods[key] = record
            if record.policy:
                self.by_policy.setdefault(record.policy, {})[key] = None
                if record.node:
                    self.by_node.setdefault(record.node, {})[key] = None
        return record

    def delete_pod(self, namespace: str, name: str, uid: str = "") -> None:
        with self._lock:
            old = self.pods.get((namespace, name))
            if old is None or (uid and old.uid and old.uid != uid):
                return
            del self.pods[(namespace, name)]
            self._unindex(old)

    def _unindex(self, record: PodRecord) -> None:
        for index, key in ((self.by_policy, record.policy), (self.by_node, record.node)):
            if key and key in index:
                index[key].pop(record.key, None)
                if not index[key]:
                    del index[key]

    def replace_all(self, kind: Relisted, objects: Iterable[Mapping[str, Any]]) -> None:
        """Replace every object of a kind after a (re-)list, then mark the kind synced.

        The new indexes are built aside and swapped in at once: a webhook never sees a half-filled one.
        ``objects`` is consumed once, so a paged list can be indexed page by page. An object that
        cannot be indexed is logged and left out; it never fails the whole list. An error raised by
        ``objects`` itself (the list failed) propagates and leaves the indexes as they were.
        """
        fresh = Store(self._clock)
        for obj in objects:
            try:
                kind.put(fresh, obj)
            except Exception:
                log.exception("%s: %s left out of the index", kind.name, describe(obj))
        with self._lock:
            for index in kind.indexes:
                setattr(self, index, getattr(fresh, index))
            kind.relisted(self)
            self.synced[kind.name] = True

    def all_pods(self) -> list[PodRecord]:
        with self._lock:
            return list(self.pods.values())

    def pods_on_node(self, node: str) -> list[PodRecord]:
        with self._lock:
            return [self.pods[k] for k in self.by_node.get(node, ()) if k in self.pods]

    def pods_of_policy(self, name: str) -> list[PodRecord]:
        """The pods labelled with policy ``name`` that it selects (see ``policy_of``)."""
        policy = self.policies.get(name)
        return [r for r in self.labelled(name) if policy is None or self.selects(policy, r)]

    def labelled(self, name: str) -> list[PodRecord]:
        """The pods labelled with policy ``name``, whether it selects them or not."""
        with self._lock:
            return [self.pods[k] for k in self.by_policy.get(name, ()) if k in self.pods]

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        """The labels of ``namespace`` as indexed (only its name while they are not): the object is
        replaced, never changed, when they change."""
        return self.namespaces.get(namespace) or {policies.NAMESPACE_NAME_LABEL: namespace}

    def group_members(self, namespace: str, policy: str, label: str, key: str) -> list[PodRecord]:
        return [p for p in self.pods_of_policy(policy) if p.namespace == namespace and p.labels.get(label) == key]

    def selects(self, policy: policies.Policy, record: PodRecord) -> bool:
        """Whether ``policy`` selects the pod of ``record`` (its namespace's labels as indexed, or only
        its name while they are not)."""
        return policy.matches(self.namespace_labels(record.namespace), record.labels)

    def policy_of(self, record: PodRecord) -> policies.Policy | None:
        """The policy the pod's ``fiar.io/policy`` label names, when that policy selects the pod: a tenant
        can write any label on its own pods, and a pod labelled with another team's policy is neither
        counted in that policy's status nor re-annotated under it."""
        policy = self.policies.get(record.policy or "")
        return policy if policy is not None and self.selects(policy, record) else None

    # -- admission memo --------------------------------------------------------------------------
    def remember(self, record: PodRecord) -> bool:
        """Remember what a binding needs of a pod admitted at CREATE (by name, or by generateName for
        generated names); whether it was kept. Expired entries are dropped on every insert, and the
        oldest ones while the memo is over ``MEMO_BYTES``. A key that gets a different record within
        the TTL answers nothing until it expires: a CREATE review is unauthenticated input, so the
        memo never lets a second one overrule the first (see docs/operator.md)."""
        if record.name:
            key = (record.namespace, record.name, False)
        elif record.generate_name:
            key = (record.namespace, record.generate_name[:GENERATED_BASE_MAX], True)
        else:
            return False
        policy = self.policies.get(record.policy or "")
        slim = memo_record(record, policy.group_key_label if policy is not None else None)
        size = memo_size(slim)
        if size > MEMO_ENTRY_BYTES:
            return False
        with self._lock:
            now = self._clock()
            self._expire(now)
            old = self._memo.pop(key, None)
            if old is not None:
                self._memo_bytes -= old.size
                if old.record != slim:
                    self._memo[key] = MemoEntry(None, now + MEMO_TTL, ENTRY_OVERHEAD)
                    self._memo_bytes += ENTRY_OVERHEAD
                    return False
            self._memo[key] = MemoEntry(slim, now + MEMO_TTL, size)
            self._memo_bytes += size
            while self._memo_bytes > MEMO_BYTES and self._memo:
                _, dropped = self._memo.popitem(last=False)
                self._memo_bytes -= dropped.size
        return True

    def _expire(self, now: float) -> None:
        """Drop the expired entries (every insert moves its key to the end: insertion order is expiry order)."""
        while self._memo:
            key, entry = next(iter(self._memo.items()))
            if entry.expires > now:
                return
            del self._memo[key]
            self._memo_bytes -= entry.size

    def recall(self, namespace: str, name: str) -> PodRecord | None:
        """The admission-memo entry for a bound pod's name, exact or by its generateName prefix."""
        now = self._clock()
        keys = [(namespace, name, False)]
        base = generated_base(name)
        if base:
            keys.append((namespace, base, True))
        for key in keys:
            entry = self._memo.get(key)
            if entry is not None and entry.expires > now:
                return entry.record
        return None

    def memo_bytes(self) -> int:
        """Estimated bytes the admission memo holds."""
        return self._memo_bytes

    def index_bytes(self) -> dict[str, int]:
        """Estimated bytes of the pod and node indexes: the deep size of up to ``SAMPLE`` records
        (strings shared between records counted once per record), times the records held, cached
        for ``BYTES_TTL`` seconds (a scrape never walks every record)."""
        now = self._clock()
        if self._bytes is not None and now - self._bytes[0] < BYTES_TTL:
            return self._bytes[1]
        with self._lock:
            pods, nodes = list(self.pods.items())[:SAMPLE], list(self.nodes.items())[:SAMPLE]
            counts = (len(self.pods), len(self.nodes))
        found = {
            "pods": _estimate(pods, counts[0]),
            "nodes": _estimate(nodes, counts[1]),
        }
        self._bytes = (now, found)
        return found

    def sizes(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes),
            "namespaces": len(self.namespaces),
            "policies": len(self.policies),
            "pods": len(self.pods),
            "managed_pods": sum(len(v) for v in list(self.by_policy.values())),
            "admission_memo": len(self._memo),
        }
