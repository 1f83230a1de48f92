"""Which replica reconciles: kopf's peering rule, read from kopf's ClusterKopfPeering object.

kopf's peering keeps each replica's entry (priority, last seen, lifetime) in the status of one
ClusterKopfPeering object and pauses every replica that sees a live peer of a higher or equal
priority (kopf 1.45, ``process_peering_event``). kopf watches no pods, nodes, namespaces or
policies here (the informers do, once per replica), so kopf has nothing to pause: the reconciler
asks ``leads`` instead, which applies the same rule to the same object.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Final

from fiar_operator.core.errors import ApiError, Conflict, NotFound
from fiar_operator.state.kube import Kube

log = logging.getLogger(__name__)

PEERINGS: Final = "/apis/kopf.dev/v1/clusterkopfpeerings"
POLL_INTERVAL: Final = 1.0
"""Seconds between reads of the peering object (one small object per replica)."""
DEFAULT_LIFETIME: Final = 60


def _parse_time(text: Any) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)


def leads(status: Any, identity: str, priority: int, now: datetime) -> bool:
    """Whether this replica reconciles: no other live peer has a priority >= ours (kopf's rule:
    a higher one wins, an equal one pauses both). An entry that cannot be read counts as live with
    priority 0, as kopf reads it."""
    if not isinstance(status, Mapping):
        return True
    for peer, info in status.items():
        if str(peer) == identity or not isinstance(info, Mapping):
            continue
        try:
            other = int(info.get("priority", 0))
            lifetime = int(info.get("lifetime", DEFAULT_LIFETIME))
        except (TypeError, ValueError):
            other, lifetime = 0, DEFAULT_LIFETIME
        seen = _parse_time(info.get("lastseen")) if info.get("lastseen") is not None else now
        if seen is not None and seen + timedelta(seconds=lifetime) <= now:
            continue  # dead: kopf cleans it up
        if other >= priority:
            return False
    return True


class Leadership:
    """Polls the peering object and tells ``on_change`` when this replica starts or stops leading."""

    def __init__(
        self,
        kube: Kube,
        name: str,
        identity: str,
        priority: int,
        on_change: Callable[[bool], None],
        stop: threading.Event,
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.kube, self.name, self.identity, self.priority = kube, name, identity, priority
        self.on_change, self.stop, self.interval = on_change, stop, interval
        self.leading = False
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)

    def start(self) -> None:
        """Create the peering object if none exists yet, then poll it."""
        self.ensure_peering()
        self._thread.start()

    def ensure_peering(self) -> None:
        """Create the ClusterKopfPeering object the replicas share (kopf only patches an existing one)."""
        body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": self.name}}
        try:
            self.kube.call("POST", PEERINGS, body=body)
        except NotFound:
            log.warning("kopf's ClusterKopfPeering CRD is not installed: every replica reconciles")
        except Conflict:
            pass  # another replica created it

    def check(self) -> bool:
        try:
            body = self.kube.call("GET", f"{PEERINGS}/{self.name}", timeout=5.0)
        except NotFound:
            return True  # no peering object or CRD: every replica reconciles (as kopf does then)
        except ApiError as exc:
            log.warning("peering %s not read: %s", self.name, exc)
            return self.leading
        return leads((body or {}).get("status"), self.identity, self.priority, datetime.now(timezone.utc))

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                leading = self.check()
            except Exception:  # an unforeseen answer: keep the current state, check again next time
                log.exception("peering %s not checked", self.name)
                leading = self.leading
            if leading != self.leading:
                self.leading = leading
                log.info("this replica %s reconciling (peering %s)", "starts" if leading else "stops", self.name)
                self.on_change(leading)
            self.stop.wait(self.interval)
