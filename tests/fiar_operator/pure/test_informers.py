"""Informers and paged lists, against a fake API seam: ``Kube.call`` and ``Kube.watch`` replaced.

The real paging code (``Kube.list``) and the real informer threads run; only the HTTP requests are
answered from memory, so a hostile object or an unexpected failure can be served on demand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import fiar_contract as contract
from fiar_operator.state import informers, kinds, kube
from fiar_operator.state.store import Store

HOSTILE = "[" * 50_000
"""A fiar.io/decision annotation that ``json.loads`` cannot parse without a RecursionError."""


def pod(name: str, rv: str = "1", **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {contract.LABEL_POD_POLICY: "p"},
            "annotations": annotations,
        },
        "spec": {"nodeName": "gpu-1"},
    }


class FakeKube(kube.Kube):
    """Serves collections page by page (with continue tokens) and one scripted watch per collection."""

    def __init__(self, collections: dict[str, list[dict[str, Any]]], page: int = 2) -> None:
        self.collections = collections
        self.page = page
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.failures: dict[str, list[BaseException]] = {}
        self.lists: dict[str, int] = {}
        self.done = threading.Event()

    def call(
        self,
        method: str,
        path: str,
        query: Any = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: Any = 10.0,
    ) -> Any:
        assert method == "GET"
        query = dict(query or {})
        self.calls.append((path, query))
        if not query.get("continue"):
            self.lists[path] = self.lists.get(path, 0) + 1
            pending = self.failures.get(path)
            if pending:
                raise pending.pop(0)
        items = self.collections.get(path, [])
        start = int(query.get("continue") or 0)
        end = start + int(query.get("limit") or self.page)
        meta: dict[str, Any] = {"resourceVersion": "100"}
        if end < len(items):
            meta["continue"] = str(end)
        return {"metadata": meta, "items": [dict(i) for i in items[start:end]]}

    def list(self, path: str, label_selector: str | None = None, page: int = 500) -> kube.Listing:
        return super().list(path, label_selector, page=self.page)

    def watch(
        self, path: str, resource_version: str, label_selector: str | None = None, timeout_seconds: int = 300
    ) -> Iterator[dict[str, Any]]:
        events = self.events.pop(path, [])
        yield from events
        if path == kube.PODS and not events:
            self.done.set()
        time.sleep(0.05)  # a watch that times out with nothing to say


def run_informers(client: FakeKube, store: Store) -> tuple[list[informers.Informer], threading.Event]:
    stop = threading.Event()
    return informers.start_all(client, store, stop), stop


def wait(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_list_pages_yield_every_item_and_the_final_resource_version() -> None:
    items = [{"metadata": {"name": f"n{i}"}} for i in range(7)]
    client = FakeKube({kube.NODES: items}, page=3)
    listing = client.list(kube.NODES)
    stream = iter(listing)
    assert next(stream)["metadata"]["name"] == "n0"
    assert len(client.calls) == 1, "later pages are read only when the first one is used up"
    assert [i["metadata"]["name"] for i in stream] == [f"n{i}" for i in range(1, 7)]
    assert [q.get("continue") for _, q in client.calls] == [None, "3", "6"]
    assert all(q["limit"] == 3 for _, q in client.calls)
    assert listing.resource_version == "100"


def test_hostile_decision_annotation_neither_kills_the_pods_informer_nor_blocks_readiness() -> None:
    client = FakeKube({kube.PODS: [pod("a"), pod("hostile", **{contract.ANNOTATION_POD_DECISION: HOSTILE}), pod("b")]})
    client.events[kube.PODS] = [
        {"type": "MODIFIED", "object": pod("a", "2", **{contract.ANNOTATION_POD_DECISION: HOSTILE})},
        {"type": "ADDED", "object": {"metadata": ["not", "a", "map"], "spec": {}}},
        {"type": "ADDED", "object": pod("c", "3")},
    ]
    store = Store()
    running, stop = run_informers(client, store)
    try:
        assert client.done.wait(10), "the pods watch never got past its events"
        assert kinds.not_listed(store.synced) == []
        assert sorted(name for _, name in store.pods) == ["a", "b", "c", "hostile"]
        assert store.pods[("ml", "hostile")].decision is None
        assert store.pods[("ml", "a")].resource_version == "2"
        assert all(i.thread.is_alive() for i in running)
        assert client.lists[kube.PODS] == 1, "no failure, so no relist"
    finally:
        stop.set()
    for informer in running:
        informer.thread.join(5)


def test_object_that_cannot_be_indexed_is_left_out_of_the_list_not_the_whole_list() -> None:
    client = FakeKube({kube.PODS: [pod("a"), {"metadata": ["not", "a", "map"]}, pod("b")]})
    store = Store()
    store.replace_all(kinds.PODS, client.list(kube.PODS))
    assert sorted(name for _, name in store.pods) == ["a", "b"] and store.synced["pods"]


def test_informer_lists_again_after_an_unexpected_error() -> None:
    client = FakeKube({kube.PODS: [pod("a")]})
    client.failures[kube.PODS] = [RuntimeError("a bug in a page"), RecursionError("deep")]
    store = Store()
    running, stop = run_informers(client, store)
    try:
        wait(lambda: store.synced.get("pods"))
        assert client.lists[kube.PODS] == 3
        assert list(store.pods) == [("ml", "a")]
        assert all(i.thread.is_alive() for i in running)
    finally:
        stop.set()
    for informer in running:
        informer.thread.join(5)
