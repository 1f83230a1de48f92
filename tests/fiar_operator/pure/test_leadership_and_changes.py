"""Which replica reconciles (kopf's peering rule, read from the peering object), and how the
informers' changes reach the reconciler: one pending entry per object, deletions kept apart."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import fiar_contract as contract
from fiar_operator.reconcile.leadership import leads
from fiar_operator.state.changes import Change, Changes, change_of

NOW = datetime(2026, 12, 1, 4, 0, tzinfo=timezone.utc)


def peer(priority: int, seconds_ago: float = 1, lifetime: int = 60) -> dict[str, object]:
    seen = (NOW - timedelta(seconds=seconds_ago)).isoformat()
    return {"priority": priority, "lastseen": seen, "lifetime": lifetime}


def test_the_highest_live_priority_leads() -> None:
    status = {"me": peer(100), "other": peer(200)}
    assert not leads(status, "me", 100, NOW)
    assert leads(status, "other", 200, NOW)


def test_a_peer_of_equal_priority_pauses_both_as_kopf_does() -> None:
    status = {"a": peer(5), "b": peer(5)}
    assert not leads(status, "a", 5, NOW) and not leads(status, "b", 5, NOW)


def test_a_dead_peer_does_not_hold_leadership() -> None:
    assert leads({"me": peer(1), "gone": peer(9, seconds_ago=61)}, "me", 1, NOW)


def test_no_peers_or_an_unreadable_status_means_leading() -> None:
    assert leads(None, "me", 0, NOW) and leads({}, "me", 0, NOW) and leads("junk", "me", 0, NOW)


def test_an_unreadable_peer_entry_counts_as_live_priority_zero() -> None:
    assert not leads({"odd": {"priority": "x"}}, "me", 0, NOW)
    assert leads({"odd": {"priority": "x"}}, "me", 1, NOW)


def pod(name: str, uid: str, policy: str | None = None) -> dict[str, object]:
    labels = {contract.LABEL_POD_POLICY: policy} if policy else {}
    return {"metadata": {"namespace": "ml", "name": name, "uid": uid, "labels": labels}}


def test_updates_of_one_object_are_decided_once_in_arrival_order() -> None:
    changes = Changes()
    for _ in range(5):
        changes.put(change_of("pods", "MODIFIED", pod("a", "1")))
    changes.put(change_of("pods", "ADDED", pod("b", "2")))
    changes.put(change_of("pods", "MODIFIED", pod("a", "1")))
    assert len(changes) == 2
    assert [c.name for c in changes.take_all(0, 2)] == ["a", "b"]
    assert changes.take_all(0, 1) == []


def test_a_deletion_is_kept_apart_from_the_successor_of_that_name() -> None:
    changes = Changes()
    changes.put(change_of("pods", "DELETED", pod("a", "old", policy="vllm")))
    changes.put(change_of("pods", "ADDED", pod("a", "new")))
    first, second = changes.take_all(0, 2)
    assert first == Change("pods", "ml", "a", "old", deleted=True, policy="vllm")
    assert second == Change("pods", "ml", "a", "new")


def test_changes_that_follow_the_first_within_the_linger_are_taken_with_it() -> None:
    changes = Changes()
    changes.put(change_of("pods", "ADDED", pod("a", "1")))
    later = threading.Timer(0.02, lambda: changes.put(change_of("pods", "MODIFIED", pod("b", "2"))))
    later.start()
    try:
        assert [c.name for c in changes.take_all(1.0, 10, linger=0.3)] == ["a", "b"]
    finally:
        later.join()


def test_no_linger_when_the_limit_is_already_pending() -> None:
    changes = Changes()
    for name in "ab":
        changes.put(change_of("pods", "ADDED", pod(name, name)))
    started = time.monotonic()
    assert [c.name for c in changes.take_all(1.0, 2, linger=5.0)] == ["a", "b"]
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    assert changes.take_all(0, 2, linger=5.0) == []  # nothing came: no linger either
    assert time.monotonic() - started < 1.0
