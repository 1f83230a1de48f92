"""List-and-watch threads that keep the Store current on every replica, one per watched kind.

These are the operator's only watches (``kinds.WATCHED``), each narrowed to its row's label selector
(the nodes' may be set otherwise, ``--node-selector``): the webhooks run on every replica and
need the indexes there, and on the replica that leads, the reconciler is told of each change
(``notify``) after the index has it, so one watch feeds both.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import fiar_kube
from fiar_operator.core.errors import ApiError, Gone
from fiar_operator.state import kube
from fiar_operator.state.kinds import WATCHED, WatchedKind, all_listed
from fiar_operator.state.store import Store, describe

log = logging.getLogger(__name__)

MIN_BACKOFF: Final = 0.5
MAX_BACKOFF: Final = 30.0
"""A failed list or watch is listed again after MIN_BACKOFF seconds, doubling up to MAX_BACKOFF."""


Notify = Callable[[str, str, Mapping[str, Any]], None]
"""(kind, event type, object) after the index applied a watch event; ("LISTED", {}) after a (re-)list."""
LISTED: Final = "LISTED"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def settle_indexes() -> None:
    """Once every index is first listed: collect what the start left behind, then keep every object
    alive now out of the cyclic garbage collector's full passes (``gc.freeze``).

    A full pass walks every object the process holds and answers no review meanwhile: 25-51 ms here
    at 80,000-90,000 objects, with only 2,000 pods indexed, and they came again and again while pods
    were created (pod CREATEs stalled for up to 82 ms at 200 pods/s, BENCHMARKS.md). The listed
    objects live until they are replaced and hold no cycles, so reference counting still frees them;
    the passes walk only what came since. Done once: an object frozen that later becomes cyclic
    garbage is never freed, so freezing again and again would leak."""
    gc.collect()
    gc.freeze()


class Settle:
    """``settle_indexes`` once, when every watched kind has been listed (informers finish their
    lists on threads of their own)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.settled = False
        self._lock = threading.Lock()

    def listed(self) -> None:
        if self.settled or not all_listed(self.store.synced):
            return
        with self._lock:
            if not self.settled:
                self.settled = True
                settle_indexes()


class Informer:
    """One thread: list a collection into the store, then apply its watch events, forever."""

    def __init__(
        self,
        client: kube.Kube,
        store: Store,
        kind: WatchedKind,
        stop: threading.Event,
        watch_timeout: int = 300,
        notify: Notify | None = None,
        settle: Settle | None = None,
        selector: str | None = None,
    ) -> None:
        self.client, self.store, self.kind, self.stop = client, store, kind, stop
        self.selector = (kind.selector if selector is None else selector) or None
        """The label selector of the list and the watch (None: every object)."""
        self.notify = notify
        self.settle = settle if settle is not None else Settle(store)
        self.watch_timeout = watch_timeout
        self.thread = threading.Thread(target=self._run, name=f"informer-{kind.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        """List, then watch; on any failure list again (after a backoff). The thread never ends early."""
        backoff = fiar_kube.Backoff(initial=MIN_BACKOFF, cap=MAX_BACKOFF, jitter=(0.0, 0.0))
        while not self.stop.is_set():
            try:
                listing = self.client.list(self.kind.path, self.selector)
                self.store.replace_all(self.kind, listing)
                version = listing.resource_version
                self.settle.listed()
                self._notify(LISTED, {})
                backoff.reset()
                while not self.stop.is_set():
                    version = self._watch(version)
            except Gone:  # the watch's resourceVersion is too old: list again at once
                continue
            except (ApiError, OSError, ValueError) as exc:
                delay = backoff.next_delay()
                log.warning("informer %s: %s; retrying in %.1fs", self.kind.name, exc, delay)
                self.stop.wait(delay)
            except Exception:
                delay = backoff.next_delay()
                log.exception("informer %s failed; listing again in %.1fs", self.kind.name, delay)
                self.stop.wait(delay)

    def _watch(self, version: str) -> str:
        for event in self.client.watch(
            self.kind.path, version, label_selector=self.selector, timeout_seconds=self.watch_timeout
        ):
            event_type, obj = event.get("type"), event.get("object") or {}
            if event_type == "ERROR":
                raise fiar_kube.status_error(obj, f"watch {self.kind.path}")
            version = str(_meta(obj).get("resourceVersion") or version)
            if event_type in ("ADDED", "MODIFIED"):
                try:
                    self.kind.put(self.store, obj)
                except Exception:
                    log.exception("informer %s: %s left out of the index", self.kind.name, describe(obj))
                    continue
            elif event_type == "DELETED":
                self.kind.delete(self.store, obj)
            else:
                continue
            self._notify(str(event_type), obj)
            if self.stop.is_set():
                break
        return version

    def _notify(self, event_type: str, obj: Mapping[str, Any]) -> None:
        if self.notify is not None:
            try:
                self.notify(self.kind.name, event_type, obj)
            except Exception:
                log.exception("informer %s: the reconciler was not told of %s", self.kind.name, describe(obj))


def start_all(
    client: kube.Kube,
    store: Store,
    stop: threading.Event,
    notify: Notify | None = None,
    selectors: Mapping[str, str] | None = None,
) -> list[Informer]:
    """An informer per watched kind; ``selectors``: a label selector by kind name in place of its row's."""
    settle = Settle(store)
    chosen = selectors or {}
    informers = [
        Informer(client, store, kind, stop, notify=notify, settle=settle, selector=chosen.get(kind.name))
        for kind in WATCHED
    ]
    for informer in informers:
        informer.start()
    return informers
