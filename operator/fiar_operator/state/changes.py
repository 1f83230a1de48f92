"""Changes the informers report to the reconciler: one pending entry per object, the latest wins.

The informer threads only record which object changed; the reconciler's one thread takes the
entries in arrival order and reads the object's current state from the indexes. A pod that changes
five times before the reconciler gets to it is decided once, and the queue never holds more
entries than there are objects (plus deletions, which keep the deleted object's uid).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fiar_contract as contract


@dataclass(frozen=True)
class Change:
    kind: str
    """nodes, namespaces, policies or pods."""
    namespace: str
    name: str
    uid: str = ""
    deleted: bool = False
    policy: str | None = None
    """Pods: the fiar.io/policy label of the deleted pod (its policy's status changes)."""


def change_of(kind: str, event_type: str, obj: Mapping[str, Any]) -> Change:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    policy = labels.get(contract.LABEL_POD_POLICY) if isinstance(labels, Mapping) else None
    return Change(
        kind=kind,
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        deleted=event_type == "DELETED",
        policy=str(policy) if policy else None,
    )


Key = tuple[str, str, str, str]


class Changes:
    """A coalescing queue: updates of one object share an entry; each deletion has its own."""

    def __init__(self) -> None:
        self._pending: OrderedDict[Key, Change] = OrderedDict()
        self._cond = threading.Condition()

    def put(self, change: Change) -> None:
        key = (change.kind, change.namespace, change.name, change.uid if change.deleted else "")
        with self._cond:
            self._pending[key] = change  # an update already waiting keeps its place in the line
            self._cond.notify()

    def take_all(self, timeout: float, limit: int, linger: float = 0.0) -> list[Change]:
        """Every pending change, oldest first, at most ``limit``; waits up to ``timeout`` for one, then
        ``linger`` seconds more (unless ``limit`` are pending) for the changes that follow it."""
        with self._cond:
            if not self._pending:
                self._cond.wait(timeout)
            if not self._pending:
                return []
            gather = linger > 0 and len(self._pending) < limit
        if gather:
            time.sleep(linger)  # no waiter meanwhile: a put wakes nobody
        with self._cond:
            return [self._pending.popitem(last=False)[1] for _ in range(min(limit, len(self._pending)))]

    def clear(self) -> None:
        with self._cond:
            self._pending.clear()

    def __len__(self) -> int:
        return len(self._pending)
