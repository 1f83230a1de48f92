"""The pods a policy selects that the pod webhook never saw, found by paged LISTs narrowed by the
policies' selectors.

The pod watch selects only the pods the webhook configured (``fiar.io/policy``, ``kinds.PODS``). A pod a
policy selects without that label (created before the policy, or while the webhook was unavailable) is
seen only here: for each Enforce policy, a LIST of the pods that carry no ``fiar.io/policy``, its pod
selector pushed to the API server, in the namespaces its namespace selector takes (each namespace's
collection, or the cluster's when it takes more than ``PER_NAMESPACE`` or every namespace). Policies
with the same selector share a LIST. Each found pod is attributed as the webhook would have
(``rules.unconfigured_by``: the highest-priority policy, Enforce only, a container it selects).

A scan is bounded in work: pages of ``PAGE`` pods, at most ``BUDGET`` pods read per scan across all
policies, and ``PAUSE`` seconds between pages. A policy whose selectors take every pod of every
namespace is read page by page within that budget, never in one unbounded request; a scan cut short
is ``complete=False`` and its caller keeps what earlier scans found where this one did not reach.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import fiar_contract as contract
from fiar_operator.core.errors import ApiError
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.pods import pod_record
from fiar_operator.core.policy import Policy
from fiar_operator.core.selectors import LabelSelector
from fiar_operator.reconcile import rules
from fiar_operator.state import kube

log = logging.getLogger(__name__)

PAGE: Final = 500
"""Pods per page of a scan's LIST."""
BUDGET: Final = 200_000
"""Pods read per scan at most, over every policy's LISTs."""
PAUSE: Final = 0.02
"""Seconds between two pages: a scan reads at most 25,000 pods a second."""
PER_NAMESPACE: Final = 16
"""A policy whose namespace selector takes more namespaces than this is listed cluster-wide, and
the pods of the other namespaces are dropped here."""
UNLABELLED: Final = f"!{contract.LABEL_POD_POLICY}"
"""What every scan's selector requires: a pod the webhook never labelled."""

Key = tuple[str, str]

_KEY: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,315}[A-Za-z0-9])?")
_VALUE: Final = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")


def selector_query(selector: LabelSelector) -> str | None:
    """``selector`` as the API server's ``labelSelector`` parameter, ``!fiar.io/policy`` added; None
    when a key or value could not be written there (no pod label can hold it): the LIST then takes
    only ``!fiar.io/policy`` and the selector is applied here."""
    terms = [UNLABELLED]
    for key, value in selector.match_labels:
        if not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
            return None
        terms.append(f"{key}={value}")
    for req in selector.expressions:
        if not _KEY.fullmatch(req.key) or not all(_VALUE.fullmatch(v) for v in req.values):
            return None
        if req.operator == "Exists":
            terms.append(req.key)
        elif req.operator == "DoesNotExist":
            terms.append(f"!{req.key}")
        elif req.operator in ("In", "NotIn"):
            terms.append(f"{req.key} {req.operator.lower()} ({','.join(sorted(req.members))})")
        else:
            return None
    return ",".join(terms)


@dataclass(frozen=True)
class Query:
    path: str
    """The pods collection: the cluster's, or one namespace's."""
    selector: str
    """The labelSelector parameter."""
    namespaces: frozenset[str] | None
    """The namespaces whose pods count (None: every namespace the path lists)."""


def plan(
    policies: Iterable[Policy],
    namespaces: Mapping[str, Mapping[str, str]],
    excluded: Callable[[str], bool],
) -> list[Query]:
    """The LISTs a scan makes for ``policies`` (Enforce ones only: the webhook changes nothing under an
    Audit policy), one per distinct collection and selector."""
    queries: dict[tuple[str, str], Query] = {}
    for policy in sorted(policies, key=lambda p: p.name):
        if policy.mode != "Enforce":
            continue
        selector = selector_query(policy.pod_selector) or UNLABELLED
        taken = frozenset(
            name
            for name, labels in namespaces.items()
            if not excluded(name)
            and contract.NAMESPACE_IGNORE_LABEL not in labels
            and policy.namespace_selector.matches(labels)
        )
        if not taken:
            continue
        if policy.namespace_selector.empty or len(taken) > PER_NAMESPACE:
            key = (kube.PODS, selector)
            old = queries.get(key)
            wide = None if policy.namespace_selector.empty else taken
            if old is not None and old.namespaces is not None and wide is not None:
                wide = old.namespaces | wide
            elif old is not None:
                wide = None
            queries[key] = Query(kube.PODS, selector, wide)
            continue
        for name in sorted(taken):
            path = f"{kube.NAMESPACES}/{kube.segment(name)}/pods"
            queries.setdefault((path, selector), Query(path, selector, None))
    return list(queries.values())


@dataclass(frozen=True)
class Pod:
    """What the reconciler keeps of an unconfigured pod."""

    uid: str
    owner: tuple[str, str] | None = None
    """(kind, name) of the pod's controller (None: a bare pod, which nothing would recreate)."""


@dataclass
class Found:
    pods: dict[str, dict[Key, Pod]] = field(default_factory=dict)
    """Policy name -> the unconfigured pods it selects."""
    complete: bool = True
    """Whether every LIST was read to its end within the budget."""
    read: int = 0
    """Pods the LISTs returned."""
    requests: int = 0
    """Pages requested."""


def controller(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the owner reference marked ``controller`` of an object, if any."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("kind") or ""), str(ref.get("name") or "")
    return None


Lister = Callable[[str, str, int], Iterable[Mapping[str, Any]]]
"""(path, label selector, page size) -> the objects of a paged LIST, read page by page."""


def scan(
    lister: Lister,
    policies: Sequence[Policy],
    namespaces: Mapping[str, Mapping[str, str]],
    excluded: Callable[[str], bool],
    budget: int = BUDGET,
    pause: Callable[[], bool] = lambda: False,
    page: int = PAGE,
) -> Found:
    """Make ``plan``'s LISTs and attribute each pod found (``pause`` between pages; True: stop now)."""
    found = Found()
    for query in plan(policies, namespaces, excluded):
        if found.read >= budget:
            found.complete = False
            break
        found.requests += 1
        try:
            for obj in lister(query.path, query.selector, page):
                found.read += 1
                if found.read % page == 0:
                    found.requests += 1
                    if pause():
                        found.complete = False
                        return found
                _attribute(found, obj, query, policies, namespaces, excluded)
                if found.read >= budget:
                    found.complete = False
                    log.warning("unconfigured scan: %d pods read, the budget; the rest waits for the next scan", budget)
                    break
        except (ApiError, OSError, ValueError) as exc:
            found.complete = False
            log.warning("unconfigured scan: LIST %s ?labelSelector=%s failed: %s", query.path, query.selector, exc)
    return found


def _attribute(
    found: Found,
    obj: Mapping[str, Any],
    query: Query,
    policies: Sequence[Policy],
    namespaces: Mapping[str, Mapping[str, str]],
    excluded: Callable[[str], bool],
) -> None:
    record = pod_record(obj, commands=False)
    if record.managed or (query.namespaces is not None and record.namespace not in query.namespaces):
        return
    if excluded(record.namespace):
        return
    policy = rules.unconfigured_by(record, policies, namespaces.get(record.namespace))
    if policy is not None:
        found.pods.setdefault(policy.name, {})[record.key] = Pod(record.uid, controller(obj))


class Scanner:
    """One thread: a scan every ``interval`` seconds, and at once when poked (a policy or a namespace
    changed), while this replica leads; each result goes to ``deliver``."""

    def __init__(
        self,
        client: kube.Kube,
        policies: Callable[[], Sequence[Policy]],
        namespaces: Callable[[], Mapping[str, Mapping[str, str]]],
        excluded: Callable[[str], bool],
        deliver: Callable[[Found], object],
        interval: float,
        stop: threading.Event,
        ready: Callable[[], bool] = lambda: True,
        metrics: Metrics | None = None,
    ) -> None:
        self.client, self.policies, self.namespaces, self.excluded = client, policies, namespaces, excluded
        self.deliver, self.interval, self.stop, self.ready = deliver, interval, stop, ready
        self.metrics = metrics
        self._wake = threading.Event()
        self.scans = 0
        self.last_seconds = 0.0
        self.thread = threading.Thread(target=self._run, name="unconfigured-scan", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def poke(self) -> None:
        """Scan at once (or right after the scan under way)."""
        self._wake.set()

    def _run(self) -> None:
        while not self.stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self.stop.is_set():
                return
            if not self.ready():
                continue
            try:
                self.once()
            except Exception:
                log.exception("unconfigured scan failed")

    def once(self) -> Found:
        started = time.monotonic()
        policies = list(self.policies())
        found = scan(
            lambda path, selector, page: self.client.list(path, selector, page),
            policies,
            dict(self.namespaces()),
            self.excluded,
            pause=lambda: self.stop.wait(PAUSE),
        )
        self.deliver(found)
        if self.metrics is not None:
            self.metrics.scans.labels("true" if found.complete else "false").inc()
            self.metrics.scan_pods.inc(found.read)
        self.scans += 1
        self.last_seconds = time.monotonic() - started
        return found
