"""Write the verdict to the agent's own Node, and only there.

The publisher is bound to one Node name (``NODE_NAME``, from the downward API) at construction and
has no method that takes another. It owns exactly the label keys in
``fiar_contract.AGENT_LABELS``: a key it owns but no longer writes (say ``fiar.io/clique`` after a
fabric change) is removed; any other label, ``fiar.io/`` or not, is never touched. Writes are
strategic-merge patches of ``metadata.labels`` and the ``fiar.io/probe-report`` annotation, so a
concurrent writer of other keys loses nothing. ``fiar.io/reprobe`` is cleared with a JSON patch
that first tests the value, so a request made while the agent was probing is not lost.

API errors are mapped onto ``node_agent.errors`` (transient ones are ``ApiUnavailable``); the
daemon retries with ``Backoff``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import fiar_contract as contract
from node_agent.errors import ApiUnavailable, ConfigError, NodeNotFound, PublishError, PublishRejected

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/strategic-merge-patch+json"


def _pointer(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def translate(exc: BaseException) -> PublishError:
    """The agent's error for a kubernetes-client or urllib3 exception."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, PublishError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = f"HTTP {status} {exc.reason or ''}".strip()
        if status == 404:
            return NodeNotFound(message)
        if status == 0 or status == 429 or status >= 500:
            return ApiUnavailable(message)
        return PublishRejected(f"{message}: {(exc.body or '')[:300]}")
    return ApiUnavailable(f"{type(exc).__name__}: {str(exc)[:300]}")


def load_client_config(kubeconfig: str | None) -> Any:
    """A kubernetes ``Configuration`` from a kubeconfig file, else the in-cluster service account."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
    except Exception as exc:  # ConfigException, FileNotFoundError, yaml errors
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster configuration (no --kubeconfig)"
        raise ConfigError(f"cannot load {where}: {exc}") from exc
    cfg.retries = 0  # the agent's own backoff decides; urllib3 retries would only add latency
    return cfg


@dataclass
class Backoff:
    """Exponential backoff with jitter: ``initial * factor**n`` capped at ``cap`` seconds."""

    initial: float = 1.0
    cap: float = 60.0
    factor: float = 2.0
    jitter: float = 0.2
    attempts: int = field(default=0, init=False)

    def next_delay(self) -> float:
        delay = min(self.cap, self.initial * self.factor**self.attempts)
        self.attempts += 1
        return delay * (1.0 + random.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self.attempts = 0


@dataclass(frozen=True)
class NodeState:
    labels: dict[str, str]
    annotations: dict[str, str]
    resource_version: str | None = None

    @property
    def reprobe(self) -> str | None:
        return self.annotations.get(contract.ANNOTATION_REPROBE)


def _state(node: Any) -> NodeState:
    meta = node.metadata
    return NodeState(dict(meta.labels or {}), dict(meta.annotations or {}), meta.resource_version)


class NodePublisher:
    """Reads and patches one Node through its own API client (one per thread)."""

    def __init__(self, client_config: Any, node_name: str, request_timeout_s: float = 10.0) -> None:
        if not node_name:
            raise ConfigError("no node name: set NODE_NAME (downward API spec.nodeName) or --node-name")
        self.node_name = node_name
        self._config = client_config
        self._timeout = request_timeout_s
        self._local = threading.local()

    def _core(self) -> Any:
        api = getattr(self._local, "api", None)
        if api is None:
            from kubernetes import client

            api = client.CoreV1Api(client.ApiClient(self._config))
            self._local.api = api
        return api

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        try:
            return fn(self._core())
        except Exception as exc:
            raise translate(exc) from exc

    def read(self) -> NodeState:
        return _state(self._call(lambda api: api.read_node(self.node_name, _request_timeout=self._timeout)))

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
        """Write ``labels`` and the report to the own Node; returns the label changes made."""
        current = self.read()
        patch = self.label_patch(current.labels, labels)
        body = {"metadata": {"labels": patch, "annotations": {contract.ANNOTATION_PROBE_REPORT: report_text}}}
        self._call(
            lambda api: api.patch_node(self.node_name, body, _content_type=MERGE_PATCH, _request_timeout=self._timeout)
        )
        return patch

    def clear_reprobe(self, value: str) -> bool:
        """Remove ``fiar.io/reprobe`` if it still holds ``value``; False if it changed meanwhile."""
        from kubernetes.client.exceptions import ApiException

        ops = [
            {"op": "test", "path": _pointer(contract.ANNOTATION_REPROBE), "value": value},
            {"op": "remove", "path": _pointer(contract.ANNOTATION_REPROBE)},
        ]
        try:
            self._core().patch_node(self.node_name, ops, _content_type=JSON_PATCH, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 422:  # the test op failed: absent or a newer request
                return False
            raise translate(exc) from exc
        except Exception as exc:
            raise translate(exc) from exc
        return True

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
        from kubernetes import watch

        backoff = backoff or Backoff()
        while not stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    self._core().list_node,
                    field_selector=f"metadata.name={self.node_name}",
                    timeout_seconds=window_s,
                    _request_timeout=(5, window_s + 10),
                ):
                    backoff.reset()
                    if stop.is_set():
                        w.stop()
                        break
                    obj = event.get("object")
                    if event.get("type") in ("ADDED", "MODIFIED") and getattr(obj, "metadata", None) is not None:
                        on_state(_state(obj))
            except Exception as exc:
                if on_error is not None:
                    on_error(translate(exc))
                self._local.api = None
                stop.wait(backoff.next_delay())
