"""kopf handlers: thin wrappers that feed the Runtime and post the Events it asks for.

Event handlers run only on the active peer (kopf pauses the others); the webhooks and their
indexes live in the Runtime, which the command line starts before kopf and stops after it, and
which keeps serving on every replica.
"""

from __future__ import annotations

import logging
from typing import Any, Final, cast

import kopf

import fiar_contract as contract
from fiar_operator.events import Event
from fiar_operator.kube import PAGE
from fiar_operator.runtime import Runtime

log = logging.getLogger(__name__)

SYNC_TIMEOUT: Final = 120.0
"""Seconds kopf's start waits for the indexes' first lists, so no handler acts on a partial view."""


def _post(events: list[Event]) -> None:
    for event in events:
        body = kopf.Body(cast("kopf.RawBody", dict(event.target)))
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _runtime(memo: kopf.Memo) -> Runtime:
    runtime: Runtime = memo["runtime"]
    return runtime


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf uses the same credentials as the operator's own client (--kubeconfig or in-cluster)."""
    cfg = _runtime(memo).kube.configuration
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization") or ""
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
    settings.watching.server_timeout = 300
    settings.watching.chunk_size = PAGE  # kopf lists every pod: one page at a time, as the informers do
    settings.peering.name = _runtime(memo).settings.peering
    settings.peering.priority = _runtime(memo).settings.priority
    if not _runtime(memo).wait_synced(SYNC_TIMEOUT):
        log.warning("indexes not listed after %ss; reconciling from a partial view", SYNC_TIMEOUT)


@kopf.on.probe(id="indexes")
def indexes(memo: kopf.Memo, **_: Any) -> dict[str, int]:
    return _runtime(memo).store.sizes()


@kopf.on.event("", "v1", "nodes")
def node_event(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
    _post(_runtime(memo).on_node(body, deleted=type == "DELETED"))


@kopf.on.event("", "v1", "pods")
def pod_event(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
    _post(_runtime(memo).on_pod(body, deleted=type == "DELETED"))


@kopf.on.event("", "v1", "namespaces")
def namespace_event(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
    _post(_runtime(memo).on_namespace(body, deleted=type == "DELETED"))


@kopf.on.event(contract.GROUP, contract.VERSION, contract.PLURAL)
def policy_event(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
    _post(_runtime(memo).on_policy(body, deleted=type == "DELETED"))
