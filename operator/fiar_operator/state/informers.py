"""List-and-watch threads that keep the Store current on every replica.

These are the operator's only watches of pods, nodes, namespaces and policies: the webhooks run on
every replica and need the indexes there, and on the replica that leads, the reconciler is told of
each change (``notify``) after the index has it, so one watch feeds both.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import fiar_kube
from fiar_operator.core.errors import ApiError, Gone
from fiar_operator.state import kube
from fiar_operator.state.store import Store, describe

log = logging.getLogger(__name__)

MIN_BACKOFF: Final = 0.5
MAX_BACKOFF: Final = 30.0
"""A failed list or watch is listed again after MIN_BACKOFF seconds, doubling up to MAX_BACKOFF."""


Notify = Callable[[str, str, Mapping[str, Any]], None]
"""(kind, event type, object) after the index applied a watch event; ("LISTED", {}) after a (re-)list."""
LISTED: Final = "LISTED"


@dataclass(frozen=True)
class Source:
    kind: str
    path: str
    put: Callable[[Store, Mapping[str, Any]], Any]
    delete: Callable[[Store, Mapping[str, Any]], Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


SOURCES: Final = (
    Source("nodes", kube.NODES, Store.put_node, lambda s, o: s.delete_node(str(_meta(o).get("name")))),
    Source(
        "namespaces", kube.NAMESPACES, Store.put_namespace, lambda s, o: s.delete_namespace(str(_meta(o).get("name")))
    ),
    Source(
        "policies",
        kube.POLICIES,
        Store.put_policy,
        lambda s, o: s.delete_policy(str(_meta(o).get("name")), str(_meta(o).get("uid") or "")),
    ),
    Source(
        "pods",
        kube.PODS,
        Store.put_pod,
        lambda s, o: s.delete_pod(
            str(_meta(o).get("namespace")), str(_meta(o).get("name")), str(_meta(o).get("uid") or "")
        ),
    ),
)


class Informer:
    """One thread: list a collection into the store, then apply its watch events, forever."""

    def __init__(
        self,
        client: kube.Kube,
        store: Store,
        source: Source,
        stop: threading.Event,
        on_change: Callable[[str], None] | None = None,
        watch_timeout: int = 300,
        notify: Notify | None = None,
    ) -> None:
        self.client, self.store, self.source, self.stop = client, store, source, stop
        self.on_change, self.notify = on_change, notify
        self.watch_timeout = watch_timeout
        self.thread = threading.Thread(target=self._run, name=f"informer-{source.kind}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        """List, then watch; on any failure list again (after a backoff). The thread never ends early."""
        backoff = fiar_kube.Backoff(initial=MIN_BACKOFF, cap=MAX_BACKOFF, jitter=(0.0, 0.0))
        while not self.stop.is_set():
            try:
                listing = self.client.list(self.source.path)
                self.store.replace_all(self.source.kind, listing)
                version = listing.resource_version
                self._changed()
                self._notify(LISTED, {})
                backoff.reset()
                while not self.stop.is_set():
                    version = self._watch(version)
            except Gone:  # the watch's resourceVersion is too old: list again at once
                continue
            except (ApiError, OSError, ValueError) as exc:
                delay = backoff.next_delay()
                log.warning("informer %s: %s; retrying in %.1fs", self.source.kind, exc, delay)
                self.stop.wait(delay)
            except Exception:
                delay = backoff.next_delay()
                log.exception("informer %s failed; listing again in %.1fs", self.source.kind, delay)
                self.stop.wait(delay)

    def _watch(self, version: str) -> str:
        for event in self.client.watch(self.source.path, version, timeout_seconds=self.watch_timeout):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise fiar_kube.status_error(obj, f"watch {self.source.path}")
            version = str(_meta(obj).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED"):
                try:
                    self.source.put(self.store, obj)
                except Exception:
                    log.exception("informer %s: %s left out of the index", self.source.kind, describe(obj))
                    continue
            elif kind == "DELETED":
                self.source.delete(self.store, obj)
            else:
                continue
            self._changed()
            self._notify(str(kind), obj)
            if self.stop.is_set():
                break
        return version

    def _notify(self, kind: str, obj: Mapping[str, Any]) -> None:
        if self.notify is not None:
            try:
                self.notify(self.source.kind, kind, obj)
            except Exception:
                log.exception("informer %s: the reconciler was not told of %s", self.source.kind, describe(obj))

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.source.kind)


def start_all(
    client: kube.Kube,
    store: Store,
    stop: threading.Event,
    on_change: Callable[[str], None] | None = None,
    notify: Notify | None = None,
) -> list[Informer]:
    informers = [Informer(client, store, source, stop, on_change, notify=notify) for source in SOURCES]
    for informer in informers:
        informer.start()
    return informers
