"""A webhook server in this process whose answer to one review waits until the test lets it go."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from devcluster import pki
from fiar_operator.admission.review import Admission, Need, Review
from fiar_operator.admission.server import Bounds, Server
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.settings import Settings
from fiar_operator.state import kinds
from fiar_operator.state.store import Store


class HeldAdmission(Admission):
    """Admission whose answer to the review with uid ``held`` takes a planning step (so that it is
    answered on a review thread, not on the event loop) and waits until ``release`` is set."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        super().__init__(store, metrics)
        self.release = threading.Event()

    def pod_create(
        self, review: Review, fetched: Any = None, can_read: bool = True, budget: Any = None
    ) -> dict[str, Any] | Need:
        if review.uid == "held":
            if budget is not None:
                budget.spend(1)
            self.release.wait(10)
        return super().pod_create(review, fetched, can_read, budget)


def start_held_server(ca: pki.CertificateAuthority, workdir: Path, bounds: Bounds) -> tuple[Server, HeldAdmission]:
    """A webhook server on loopback ports over empty, listed indexes, serving ``ca``'s certificate
    (its CA in ``workdir/ca.crt``) with ``HeldAdmission``."""
    crt, key = ca.issue("first", hosts=("127.0.0.1",)).write(workdir, "serving")
    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    store = Store()
    for kind in kinds.WATCHED:
        store.replace_all(kind, [])
    metrics = Metrics(store.sizes)
    settings = Settings(
        webhook_host="127.0.0.1", webhook_port=0, tls_cert=crt, tls_key=key, metrics_host="127.0.0.1", metrics_port=0
    )
    admission = HeldAdmission(store, metrics)
    server = Server(admission, metrics, settings, None, lambda: store.synced, bounds)
    server.start()
    return server, admission
