"""What kopf does for the operator: credentials, peering, liveness probes. It watches nothing else.

The informers (one watch per kind and replica) feed the webhooks' indexes and, on the replica that
leads by kopf's peering, the reconciler; both live in the Runtime, which the command line starts
before kopf and stops after it. kopf's own resource handlers would watch every pod, node and
namespace a second time, keep a copy of each and log a line per object (docs/operator.md).
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
from typing import Any

import kopf
from multidict import CIMultiDict

import fiar_kube
from fiar_operator.runtime import Runtime

log = logging.getLogger(__name__)


def _runtime(memo: kopf.Memo) -> Runtime:
    runtime: Runtime = memo["runtime"]
    return runtime


@dataclasses.dataclass(frozen=True, kw_only=True)
class SeamConnection(kopf.ConnectionInfo):
    """kopf's connection with the seam's own TLS context (``fiar_kube.tls_context``: a CA and client
    certificate from files or held in memory, never written out) and its Impersonate-* fields."""

    configuration: Any = dataclasses.field(default=None, compare=False, hash=False)

    def as_ssl_context(self) -> ssl.SSLContext:
        return fiar_kube.tls_context(self.configuration)

    def as_http_headers(self) -> CIMultiDict[str]:  # type: ignore[override]  # Impersonate-Group repeats
        headers = CIMultiDict(super().as_http_headers())
        for name, value in fiar_kube.impersonation(self.configuration):
            headers.add(name, value)
        return headers


def connection(cfg: Any) -> kopf.ConnectionInfo:
    """kopf's connection of the operator's own credentials (--kubeconfig or in-cluster)."""
    header = fiar_kube.authorization(cfg) or ""
    scheme, _sep, token = header.partition(" ") if " " in header else ("", "", header)
    return SeamConnection(
        server=cfg.host,
        insecure=not cfg.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        configuration=cfg,
    )


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf uses the same credentials as the operator's own client (--kubeconfig or in-cluster)."""
    return connection(_runtime(memo).kube.configuration)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.peering.name = _runtime(memo).settings.peering
    settings.peering.priority = _runtime(memo).settings.priority


@kopf.on.probe(id="indexes")
def indexes(memo: kopf.Memo, **_: Any) -> dict[str, int]:
    return _runtime(memo).store.sizes()
