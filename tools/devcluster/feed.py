"""Feed objects to a running operator's parts by hand, as its informers and reconciler would.

In the operator, an informer indexes each watch event and the reconciler's thread takes the change
from its queue. Tests and benchmarks that hand objects to a ``Runtime`` (no API server watch) do
both at once here: ``feed`` indexes ``body`` with its watched kind's row and reconciles the change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fiar_operator.reconcile.events import Event
from fiar_operator.runtime import Runtime
from fiar_operator.state import kinds
from fiar_operator.state.changes import change_of


def feed(runtime: Runtime, kind: str, body: Mapping[str, Any], deleted: bool = False) -> list[Event]:
    """Index ``body`` (or forget it, ``deleted``) and reconcile it; the events the reconciler asks for."""
    row = kinds.BY_NAME[kind]
    if deleted:
        row.delete(runtime.store, body)
    else:
        row.put(runtime.store, body)
    reconciler = runtime.reconciler
    change = change_of(row.name, "DELETED" if deleted else "MODIFIED", body)
    return reconciler.apply(change) + reconciler.housekeeping()
