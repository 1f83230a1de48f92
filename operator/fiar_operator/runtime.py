"""One running operator, wired: the indexes and their informers, the webhook server, the reconciler.

The webhooks and informers run on every replica. The reconciler (re-annotating pods, events,
policy status) runs on the replica that leads by kopf's peering (``leadership``), in one thread fed
by the informers' changes: each kind is watched once per replica, and each change decided once.
This module only builds the parts and starts and stops them; each part owns its own state.
"""

from __future__ import annotations

import logging
import threading

from fiar_operator.admission.review import Admission
from fiar_operator.admission.server import Server
from fiar_operator.core.liveness import Heartbeats
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.settings import Settings
from fiar_operator.reconcile.leadership import Leadership
from fiar_operator.reconcile.reconciler import Reconciler
from fiar_operator.state import informers, kinds
from fiar_operator.state.kube import Kube, configuration
from fiar_operator.state.store import Store

log = logging.getLogger(__name__)


class Runtime:
    def __init__(self, settings: Settings, kube: Kube | None = None, identity: str = "fiar-operator") -> None:
        self.settings = settings
        self.kube = kube if kube is not None else Kube(configuration(settings.kubeconfig))
        self.store = Store()
        self.metrics = Metrics(self.store.sizes, self.store.index_bytes)
        self.heartbeats = Heartbeats()
        self.admission = Admission(self.store, self.metrics, on_policy=lambda p: self.reconciler.admit_policy(p))
        self.server = Server(
            self.admission, self.metrics, settings, self.kube, lambda: self.store.synced, heartbeats=self.heartbeats
        )
        self._stop = threading.Event()
        self.reconciler = Reconciler(
            settings, self.kube, self.store, self.metrics, self.heartbeats, self._stop, identity
        )
        self.leadership = Leadership(
            self.kube, settings.peering, identity, settings.priority, self.reconciler.lead, self._stop
        )

    def start(self) -> None:
        if not self.settings.standalone:
            self.leadership.start()
        self.server.start()
        informers.start_all(
            self.kube,
            self.store,
            self._stop,
            notify=self.reconciler.notify,
            selectors={kinds.NODES.name: self.settings.node_selector},
        )
        self.reconciler.start()
        log.info("webhooks on port %s, metrics on port %s", self.server.port, self.server.metrics_port)

    def stop(self) -> None:
        self._stop.set()
        self.reconciler.stop()
        self.server.stop()
