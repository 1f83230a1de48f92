"""The own-Node watch never reconnects in a tight loop: an ERROR event or a stream that closes at
once waits for the backoff, as a failed connection does; events still reach the agent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from node_agent.publish import Backoff, NodePublisher, NodeState


class Streams:
    """Stands in for the HTTP transport: each ``stream`` call answers the next scripted events."""

    def __init__(self, *scripts: list[dict[str, Any]]) -> None:
        self.scripts = list(scripts)
        self.calls = 0

    def stream(self, path: str, read_timeout_s: float) -> Iterator[dict[str, Any]]:
        self.calls += 1
        yield from self.scripts[min(self.calls - 1, len(self.scripts) - 1)]


class ScriptedPublisher(NodePublisher):
    def __init__(self, streams: Streams) -> None:
        super().__init__(client_config=None, node_name="gpu-0")
        self.streams = streams

    def _transport(self) -> Any:
        return self.streams


def watch_for(publisher: NodePublisher, seconds: float) -> list[NodeState]:
    seen: list[NodeState] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=publisher.watch, args=(seen.append, stop), kwargs={"backoff": Backoff(initial=0.2, cap=0.2)}
    )
    thread.start()
    stop.wait(seconds)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    return seen


def node(reprobe: str | None = None) -> dict[str, Any]:
    notes = {"fiar.io/reprobe": reprobe} if reprobe else {}
    return {"metadata": {"name": "gpu-0", "labels": {}, "annotations": notes, "resourceVersion": "1"}}


def test_error_events_wait_for_the_backoff() -> None:
    streams = Streams([{"type": "ERROR", "object": {"kind": "Status", "code": 500}}])
    watch_for(ScriptedPublisher(streams), 1.0)
    assert streams.calls <= 7, f"{streams.calls} reconnects in 1 s"


def test_a_stream_that_closes_at_once_waits_for_the_backoff() -> None:
    streams = Streams([])
    watch_for(ScriptedPublisher(streams), 1.0)
    assert streams.calls <= 7, f"{streams.calls} reconnects in 1 s"


def test_events_still_reach_the_agent() -> None:
    streams = Streams([{"type": "ADDED", "object": node()}, {"type": "MODIFIED", "object": node("now")}], [])
    seen = watch_for(ScriptedPublisher(streams), 0.5)
    assert [s.reprobe for s in seen[:2]] == [None, "now"]
