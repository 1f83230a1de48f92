"""What kopf does for the operator: credentials, peering, liveness probes. It watches nothing else.

The informers (one watch per kind and replica) feed the webhooks' indexes and, on the replica that
leads by kopf's peering, the reconciler; both live in the Runtime, which the command line starts
before kopf and stops after it. kopf's own resource handlers would watch every pod, node and
namespace a second time, keep a copy of each and log a line per object (docs/operator.md).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

import fiar_kube
from fiar_operator.runtime import Runtime

log = logging.getLogger(__name__)


def _runtime(memo: kopf.Memo) -> Runtime:
    runtime: Runtime = memo["runtime"]
    return runtime


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf uses the same credentials as the operator's own client (--kubeconfig or in-cluster)."""
    cfg = _runtime(memo).kube.configuration
    header = fiar_kube.authorization(cfg) or ""
    scheme, _sep, token = header.partition(" ") if " " in header else ("", "", header)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.peering.name = _runtime(memo).settings.peering
    settings.peering.priority = _runtime(memo).settings.priority


@kopf.on.probe(id="indexes")
def indexes(memo: kopf.Memo, **_: Any) -> dict[str, int]:
    return _runtime(memo).store.sizes()
