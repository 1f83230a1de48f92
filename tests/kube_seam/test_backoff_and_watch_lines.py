"""One backoff for both components, and watch streams split into bounded JSON events."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

import fiar_kube as kube

from .conftest import Answer, Loopback, Seen


def test_the_backoff_doubles_to_its_cap_and_starts_over_after_a_reset() -> None:
    backoff = kube.Backoff(initial=0.5, cap=30.0, jitter=(0.0, 0.0))
    assert [backoff.next_delay() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    backoff.reset()
    assert backoff.next_delay() == 0.5


def test_jitter_stays_within_its_bounds() -> None:
    delays = [kube.backoff_delay(3, initial=1.0, cap=60.0) for _ in range(2000)]
    assert 8 * 0.8 <= min(delays) < 8 * 0.85 and 8 * 1.15 < max(delays) <= 8 * 1.2
    low = [kube.backoff_delay(1, initial=10.0, cap=60.0, jitter=(-0.5, 0.0)) for _ in range(2000)]
    assert min(low) >= 10.0 and max(low) <= 20.0


def test_a_backoff_after_thousands_of_failures_still_answers_its_cap() -> None:
    """An outage of a day at a 60 s cap is about 1,500 attempts: 2.0**1024 leaves the floats."""
    backoff = kube.Backoff(cap=60.0, jitter=(0.0, 0.0))
    backoff.attempts = 5000
    assert backoff.next_delay() == 60.0


def event(kind: str, name: str) -> bytes:
    return json.dumps({"type": kind, "object": {"metadata": {"name": name}}}).encode() + b"\n"


def test_events_split_across_chunks_and_several_in_one_come_out_whole() -> None:
    lines = kube.WatchLines()
    stream = event("ADDED", "a") + b"\n" + event("MODIFIED", "b") + event("DELETED", "c")
    seen: list[dict[str, Any]] = []
    for i in range(0, len(stream), 7):
        seen += lines.feed(stream[i : i + 7])
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen] == [
        ("ADDED", "a"),
        ("MODIFIED", "b"),
        ("DELETED", "c"),
    ]
    both = kube.WatchLines().feed(event("ADDED", "x") + event("ADDED", "y"))
    assert len(both) == 2


def test_a_line_over_the_bound_is_refused_before_it_ends() -> None:
    lines = kube.WatchLines(limit=1000)
    lines.feed(b"{" + b" " * 900)
    with pytest.raises(kube.EventTooLarge):
        lines.feed(b" " * 200)  # no newline yet: the buffer itself is bounded
    with pytest.raises(kube.EventTooLarge):
        kube.WatchLines(limit=10).feed(b'{"type": "ADDED"}\n')


@pytest.mark.parametrize("line", [b"not json\n", b"[1, 2]\n", b'"text"\n'])
def test_a_line_that_is_not_a_json_object_is_a_value_error(line: bytes) -> None:
    with pytest.raises(ValueError):
        kube.WatchLines().feed(line)


def stream_of(chunks: list[bytes]) -> Callable[[Seen], Answer]:
    return lambda seen: Answer(200, chunks=chunks)


def test_a_real_watch_stream_yields_its_events_and_its_error_event(serve: Callable[..., Loopback]) -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
    chunks = [event("ADDED", "a")[:10], event("ADDED", "a")[10:] + event("MODIFIED", "a"), json.dumps(gone).encode()]
    server = serve(stream_of([*chunks, b"\n"]))
    api = kube.Client(client.Configuration(host=server.url), user_agent="t", environ={})
    events = list(api.stream("/api/v1/nodes", {"watch": "true", "resourceVersion": "7"}, read_timeout_s=5))
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "ERROR"]
    assert isinstance(kube.status_error(events[-1]["object"]), kube.Gone)
    assert server.seen[0].path == "/api/v1/nodes?watch=true&resourceVersion=7"


def test_a_real_stream_with_an_endless_line_is_abandoned(serve: Callable[..., Loopback]) -> None:
    server = serve(stream_of([b"x" * 4096] * 64))
    api = kube.Client(client.Configuration(host=server.url), user_agent="t", environ={})
    with pytest.raises(kube.EventTooLarge):
        list(api.stream("/api/v1/nodes", read_timeout_s=5, max_event_bytes=64 * 1024))


def test_a_refused_watch_raises_its_type(serve: Callable[..., Loopback]) -> None:
    server = serve(lambda seen: Answer(403, {"kind": "Status", "code": 403, "message": "nodes is forbidden"}))
    api = kube.Client(client.Configuration(host=server.url), user_agent="t", environ={})
    with pytest.raises(kube.Forbidden, match="nodes is forbidden"):
        list(api.stream("/api/v1/nodes", read_timeout_s=5))
