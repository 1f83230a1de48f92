"""Once every index is first listed, the objects they hold leave the cyclic garbage collector's full
passes (``gc.freeze``): a pass walks every object the process holds and answers no review meanwhile,
25-51 ms at 80,000-90,000 objects (BENCHMARKS.md). Done once only: an object frozen that
later becomes cyclic garbage is never freed."""

from __future__ import annotations

import gc

from fiar_operator.state import informers, kinds
from fiar_operator.state.store import Store


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
    store = Store()
    settle = informers.Settle(store)  # what every informer calls after its list
    held = Held()
    for kind in kinds.WATCHED[:-1]:
        store.replace_all(kind, [])
        settle.listed()
    assert tracked(held), "not all listed yet: nothing frozen"

    store.replace_all(kinds.WATCHED[-1], [])
    settle.listed()
    assert not tracked(held), "alive when every index was listed: frozen"

    more = Held()
    settle.listed()  # a re-list later
    assert tracked(more), "froze again"
