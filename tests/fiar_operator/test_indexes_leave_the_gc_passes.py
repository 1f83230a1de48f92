"""Once every index is first listed, the objects they hold leave the cyclic garbage collector's full
passes (``gc.freeze``): a pass walks every object the process holds and answers no review meanwhile,
25-51 ms at 80,000-90,000 objects (BENCHMARKS.md). Done once only: an object frozen that
later becomes cyclic garbage is never freed."""

from __future__ import annotations

import gc

from fiar_operator.admission.server import READY_KINDS
from fiar_operator.core.settings import Settings
from fiar_operator.runtime import Runtime
from fiar_operator.state import informers, kube


class Offline(kube.Kube):
    """No API server: the test only feeds the indexes."""

    def __init__(self) -> None:
        pass


class Held:
    """An object the collector tracks (and that this test keeps alive)."""


def tracked(obj: object) -> bool:
    """Whether the collector's passes walk ``obj`` (frozen objects are not among them)."""
    return any(o is obj for o in gc.get_objects())


def test_the_indexes_leave_the_full_passes_once_all_are_listed_and_only_then() -> None:
    try:
        runs_once_all_are_listed()
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual


def runs_once_all_are_listed() -> None:
    runtime = Runtime(Settings(metrics_port=None, standalone=True), Offline())
    held = Held()
    for kind in READY_KINDS[:-1]:
        runtime.store.replace_all(kind, [])
        runtime.notify(kind, informers.LISTED, {})
    assert tracked(held), "not all listed yet: nothing frozen"

    runtime.store.replace_all(READY_KINDS[-1], [])
    runtime.notify(READY_KINDS[-1], informers.LISTED, {})
    assert not tracked(held), "alive when every index was listed: frozen"

    more = Held()
    runtime.notify(READY_KINDS[-1], informers.LISTED, {})  # a re-list later
    assert tracked(more), "froze again"
