"""The kinds the operator watches, one row each, and what each selects.

Every part that names a watched kind reads it here: the informers list and watch ``path``, narrowed
to ``selector`` (a label selector the API server applies: the operator never receives, parses or
holds an object it does not select), and index each event with ``put`` and ``delete``; the store
swaps a re-list's ``indexes`` in at once;
readiness and the reconciler wait until every kind of ``WATCHED`` has been listed
(``all_listed``); the reconciler's changes carry the row's ``name``. A kind watched anew is one
row here, with its index in the store and what the reconciler does with its changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import fiar_contract as contract
from fiar_operator.core.settings import DEFAULT_NODE_SELECTOR
from fiar_operator.state import kube
from fiar_operator.state.store import Store


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name"))


def _uid(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("uid") or "")


@dataclass(frozen=True)
class WatchedKind:
    name: str
    """The kind's key: ``Store.synced``, ``Change.kind``, the informer's thread."""
    path: str
    """The collection listed and watched."""
    put: Callable[[Store, Mapping[str, Any]], object]
    """Index an added or modified object."""
    delete: Callable[[Store, Mapping[str, Any]], object]
    """Forget a deleted object (only the one with its uid, where the index keeps uids)."""
    indexes: tuple[str, ...]
    """The store's attributes a re-list builds anew and swaps in together."""
    relisted: Callable[[Store], object] = lambda _store: None
    """What else a re-list changes in the store."""
    selector: str = ""
    """The label selector of the list and watch ("": every object). An object that stops matching
    leaves the watch with a DELETED event, as if it were deleted."""
    selects: str = "every object"
    """What the selector takes, in words (docs/operator.md, "What the operator watches")."""


NODES: Final = WatchedKind(
    "nodes",
    kube.NODES,
    Store.put_node,
    lambda s, o: s.delete_node(_name(o)),
    ("nodes", "_node_versions"),
    relisted=Store.count_node_change,
    selector=DEFAULT_NODE_SELECTOR,
    selects="GPU nodes: the agent's node selector (--node-selector; fiar's verdict labels live only there)",
)
NAMESPACES: Final = WatchedKind(
    "namespaces",
    kube.NAMESPACES,
    Store.put_namespace,
    lambda s, o: s.delete_namespace(_name(o)),
    ("namespaces", "_namespace_versions"),
    selects="every namespace (policies select them by label)",
)
POLICIES: Final = WatchedKind(
    "policies",
    kube.POLICIES,
    Store.put_policy,
    lambda s, o: s.delete_policy(_name(o), _uid(o)),
    ("policies", "policy_objects", "policy_errors"),
    selects="every FiAllreducePolicy",
)
PODS: Final = WatchedKind(
    "pods",
    kube.PODS,
    Store.put_pod,
    lambda s, o: s.delete_pod(str(_meta(o).get("namespace")), _name(o), _uid(o)),
    ("pods", "by_node", "by_policy"),
    selector=contract.LABEL_POD_POLICY,
    selects=(
        f"pods the pod webhook configured ({contract.LABEL_POD_POLICY}, set at CREATE); pods a policy selects "
        "that it never saw are found by the unconfigured scan's paged LISTs (reconcile/scan.py)"
    ),
)

WATCHED: Final = (NODES, NAMESPACES, POLICIES, PODS)
BY_NAME: Final = {kind.name: kind for kind in WATCHED}


def not_listed(synced: Mapping[str, bool]) -> list[str]:
    """The watched kinds not listed yet, in the table's order."""
    return [kind.name for kind in WATCHED if not synced.get(kind.name)]


def all_listed(synced: Mapping[str, bool]) -> bool:
    return not not_listed(synced)
