"""The watched kinds are one table (``state.kinds.WATCHED``): the informers, the store's re-list,
readiness and the reconciler all read it, so a kind watched anew is one row."""

from __future__ import annotations

import pytest

from fiar_operator.core.settings import Settings
from fiar_operator.runtime import Runtime
from fiar_operator.state import informers, kinds, kube
from fiar_operator.state.store import Store


class Offline(kube.Kube):
    """No API server: only the parts' wiring is read."""

    def __init__(self) -> None:
        pass


def test_the_reconciler_answers_a_change_of_every_watched_kind() -> None:
    runtime = Runtime(Settings(metrics_port=None, standalone=True), Offline())
    assert set(runtime.reconciler.handlers) == {kind.name for kind in kinds.WATCHED}


def test_an_informer_runs_for_every_watched_kind_and_readiness_waits_for_each() -> None:
    store = Store()
    assert kinds.not_listed(store.synced) == [kind.name for kind in kinds.WATCHED]
    for kind in kinds.WATCHED:
        assert not kinds.all_listed(store.synced)
        store.replace_all(kind, [])
    assert kinds.all_listed(store.synced)
    running = [informers.Informer(Offline(), store, kind, stop=None).kind for kind in kinds.WATCHED]  # type: ignore[arg-type]
    assert running == list(kinds.WATCHED)


@pytest.mark.parametrize("kind", kinds.WATCHED, ids=lambda k: k.name)
def test_a_relist_swaps_in_every_index_its_row_names(kind: kinds.WatchedKind) -> None:
    store = Store()
    for index in kind.indexes:
        assert hasattr(store, index), f"{kind.name}: the store has no index {index}"
    before = {index: getattr(store, index) for index in kind.indexes}
    store.replace_all(kind, [])
    assert all(getattr(store, index) is not before[index] for index in kind.indexes)
    assert store.synced == {kind.name: True}
