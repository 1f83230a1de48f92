"""Write the verdict to the agent's own Node, and only there.

The publisher is bound to one Node name (``NODE_NAME``, from the downward API) at construction and
has no method that takes another. It owns exactly the label keys in
``fiar_contract.AGENT_LABELS``: a key it owns but no longer writes (say ``fiar.io/clique`` after a
fabric change) is removed; any other label, ``fiar.io/`` or not, is never touched. Writes are
strategic-merge patches of ``metadata.labels`` and the ``fiar.io/probe-report`` annotation, so a
concurrent writer of other keys loses nothing. ``fiar.io/reprobe`` is cleared only if it still
holds the value the probe answered: the agent reads the Node, compares the decoded value itself, and
removes it with a patch whose ``resourceVersion`` is a precondition (409 Conflict if the Node changed
in between), so a request made while the agent was probing is not lost. (A JSON-patch ``test``
would compare encoded bytes, and Python and Go encode ``ü``, ``&`` or ``<`` differently.)

API errors come typed from ``fiar_kube`` (the seam the operator shares) and are mapped onto
``node_agent.errors`` by ``publish_error`` (transient ones are ``ApiUnavailable``); the daemon
retries with ``Backoff``. ``fiar_kube`` loads the kubeconfig or in-cluster credentials without the
kubernetes package (its client would add 17.7 MiB of resident memory; only a kubeconfig user of an
``exec`` plugin or an auth provider is loaded by it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import fiar_contract as contract
import fiar_kube as kube
from fiar_kube import Backoff as Backoff  # the daemon's retries use the same backoff
from node_agent import __version__
from node_agent import condition as condition_mod
from node_agent.errors import ApiUnavailable, ConfigError, PublishError, publish_error

log = logging.getLogger("fiar-agent")
MERGE_PATCH = kube.STRATEGIC_MERGE_PATCH
POOL_SIZE: Final = 2
"""Connections per thread's client: the agent makes one call at a time on each."""


def load_client_config(kubeconfig: str | None) -> Any:
    """Credentials from a kubeconfig file, else the in-cluster service account (``fiar_kube.load_config``)."""
    try:
        return kube.load_config(kubeconfig)
    except kube.ConfigError as exc:
        raise ConfigError(str(exc)) from exc


MIN_WATCH_S: Final = 1.0
"""A watch stream that ends sooner than this counts as failing: backoff before reconnecting."""


@dataclass(frozen=True)
class NodeState:
    labels: dict[str, str]
    annotations: dict[str, str]
    resource_version: str | None = None
    verified_condition: Mapping[str, Any] | None = None
    """The Node's ``FiarAllreduceVerified`` condition (``node_agent.condition``), if it has one."""

    @property
    def reprobe(self) -> str | None:
        return self.annotations.get(contract.ANNOTATION_REPROBE)


def _state(node: Mapping[str, Any]) -> NodeState:
    meta = node.get("metadata") or {}
    raw_status = node.get("status")
    status: Mapping[str, Any] = raw_status if isinstance(raw_status, dict) else {}
    return NodeState(
        dict(meta.get("labels") or {}),
        dict(meta.get("annotations") or {}),
        meta.get("resourceVersion"),
        condition_mod.current(status.get("conditions")),
    )


class NodePublisher:
    """Reads, patches and watches one Node (one transport per thread)."""

    def __init__(self, client_config: Any, node_name: str, request_timeout_s: float = 10.0) -> None:
        if not node_name:
            raise ConfigError("no node name: set NODE_NAME (downward API spec.nodeName) or --node-name")
        self.node_name = node_name
        self._config = client_config
        self._timeout = request_timeout_s
        self._local = threading.local()
        self._path = f"/api/v1/nodes/{kube.segment(node_name)}"

    def _transport(self) -> kube.Client:
        transport = getattr(self._local, "transport", None)
        if transport is None:
            transport = kube.Client(self._config, user_agent=f"fiar-agent/{__version__}", maxsize=POOL_SIZE)
            self._local.transport = transport
        return transport

    def _request(self, method: str, body: Any = None, content_type: str | None = None, sub: str = "") -> Any:
        timeout = (min(5.0, self._timeout), self._timeout)
        return self._transport().request(
            method, self._path + sub, body=body, content_type=content_type, timeout=timeout
        )

    def _call(self, method: str, *, body: Any = None, content_type: str | None = None, sub: str = "") -> Any:
        try:
            return self._request(method, body, content_type, sub)
        except Exception as exc:
            raise publish_error(exc) from exc

    def read(self) -> NodeState:
        return _state(self._call("GET"))

    def label_patch(self, current: Mapping[str, str], labels: Mapping[str, str]) -> dict[str, str | None]:
        """Only owned keys: set what changed, remove owned keys no longer written."""
        unknown = [k for k in labels if k not in contract.AGENT_LABELS]
        if unknown:
            raise ValueError(f"not labels the agent owns: {unknown}")
        patch: dict[str, str | None] = {k: v for k, v in labels.items() if current.get(k) != v}
        for key in contract.AGENT_LABELS:
            if key not in labels and key in current:
                patch[key] = None
        return patch

    def publish(self, labels: Mapping[str, str], report_text: str) -> dict[str, str | None]:
        """Write ``labels`` and the report to the own Node, then the condition that mirrors them on its
        status; returns the label changes made."""
        current = self.read()
        patch = self.label_patch(current.labels, labels)
        body = {"metadata": {"labels": patch, "annotations": {contract.ANNOTATION_PROBE_REPORT: report_text}}}
        self._call("PATCH", body=body, content_type=MERGE_PATCH)
        self.write_condition(condition_mod.condition(labels, report_text, time.time(), current.verified_condition))
        return patch

    def write_condition(self, cond: Mapping[str, str]) -> bool:
        """Set the ``FiarAllreduceVerified`` condition on the own Node's status (a strategic merge by
        ``type``: the kubelet's conditions stay). A refusal (a chart without ``nodes/status`` in the
        agent's role) is logged and leaves the labels, which are written already; False then."""
        try:
            self._request("PATCH", {"status": {"conditions": [dict(cond)]}}, MERGE_PATCH, "/status")
        except kube.Rejected as exc:
            log.warning("node %s: condition %s not written: %s", self.node_name, contract.CONDITION_VERIFIED, exc)
            return False
        except Exception as exc:
            raise publish_error(exc) from exc
        return True

    def clear_reprobe(self, value: str, attempts: int = 5) -> bool:
        """Remove ``fiar.io/reprobe`` if it still holds ``value``; False if it changed meanwhile.

        The removal carries the ``resourceVersion`` of the read that saw ``value``: a Node changed
        in between (say by its kubelet) is read again, up to ``attempts`` times."""
        for _ in range(attempts):
            state = self.read()
            if state.reprobe != value:
                return False
            body = {
                "metadata": {
                    "resourceVersion": state.resource_version,
                    "annotations": {contract.ANNOTATION_REPROBE: None},
                }
            }
            try:
                self._request("PATCH", body, MERGE_PATCH)
            except kube.Conflict:  # the Node changed since the read
                continue
            except Exception as exc:
                raise publish_error(exc) from exc
            return True
        raise ApiUnavailable(f"node {self.node_name} changed on every one of {attempts} attempts to clear the reprobe")

    def watch(
        self,
        on_state: Callable[[NodeState], None],
        stop: threading.Event,
        *,
        on_error: Callable[[PublishError], None] | None = None,
        backoff: Backoff | None = None,
        window_s: int = 60,
    ) -> None:
        """Call ``on_state`` for every change of the own Node until ``stop``; reconnects with backoff."""
        backoff = backoff or Backoff()
        query = {"watch": "true", "fieldSelector": f"metadata.name={self.node_name}", "timeoutSeconds": window_s}
        path = kube.url("", "/api/v1/nodes", query)
        while not stop.is_set():
            opened, healthy = time.monotonic(), True
            try:
                for event in self._transport().stream(path, read_timeout_s=window_s + 15):
                    if stop.is_set():
                        return
                    if event.get("type") == "ERROR":
                        healthy = False
                        break
                    backoff.reset()
                    obj = event.get("object")
                    if event.get("type") in ("ADDED", "MODIFIED") and isinstance(obj, dict):
                        on_state(_state(obj))
            except Exception as exc:
                if on_error is not None:
                    on_error(publish_error(exc))
                self._local.transport = None
                stop.wait(backoff.next_delay())
                continue
            if not healthy or time.monotonic() - opened < MIN_WATCH_S:
                # an ERROR event, or a stream that closed at once: never reconnect in a tight loop
                stop.wait(backoff.next_delay())
