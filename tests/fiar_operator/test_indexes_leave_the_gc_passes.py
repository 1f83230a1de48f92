"""Once every index is first listed, the objects they hold leave the cyclic garbage collector's full
passes (``gc.freeze``): a pass walks every object the process holds and answers no review meanwhile,
about 50 ms with the indexes of 10,000 nodes and 20,000 pods. Done once only: an object frozen that
later becomes cyclic garbage is never freed."""

from __future__ import annotations

import gc

from fiar_operator import informers, kube
from fiar_operator.runtime import Runtime
from fiar_operator.server import READY_KINDS
from fiar_operator.settings import Settings


class Offline(kube.Kube):
    """No API server: the test only feeds the indexes."""

    def __init__(self) -> None:
        pass


class Held:
    """Objects that must survive the collection the operator makes (they are referenced here)."""

    def __init__(self) -> None:
        self.items = [{"n": i} for i in range(1000)]


def test_the_indexes_leave_the_full_passes_once_all_are_listed_and_only_then() -> None:
    runtime = Runtime(Settings(metrics_port=None, standalone=True), Offline())
    held = Held()
    before = gc.get_freeze_count()
    for kind in READY_KINDS[:-1]:
        runtime.store.replace_all(kind, [])
        runtime.notify(kind, informers.LISTED, {})
    assert gc.get_freeze_count() == before, "not all listed yet: nothing frozen"

    runtime.store.replace_all(READY_KINDS[-1], [])
    runtime.notify(READY_KINDS[-1], informers.LISTED, {})
    assert gc.get_freeze_count() > before + len(held.items)

    frozen = gc.get_freeze_count()
    more = Held()
    runtime.notify(READY_KINDS[-1], informers.LISTED, {})  # a re-list later
    assert gc.get_freeze_count() == frozen, "froze again"
    assert len(more.items) == 1000
