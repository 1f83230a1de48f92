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

API errors are mapped onto ``node_agent.errors`` (transient ones are ``ApiUnavailable``); the
daemon retries with ``Backoff``. The calls go through ``Transport``: the kubernetes package loads
the kubeconfig or in-cluster credentials and provides the TLS pool; the generated API classes are
not used (they would roughly double the resident memory).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

import fiar_contract as contract
from node_agent import __version__
from node_agent.errors import ApiUnavailable, ConfigError, NodeNotFound, PublishError, PublishRejected

MERGE_PATCH = "application/strategic-merge-patch+json"


class HttpError(Exception):
    """A non-2xx answer of the API server."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status
        self.reason = reason
        self.body = body


def translate(exc: BaseException) -> PublishError:
    """The agent's error for an API answer or a transport failure."""
    if isinstance(exc, PublishError):
        return exc
    if isinstance(exc, HttpError):
        if exc.status == 404:
            return NodeNotFound(str(exc))
        if exc.status == 429 or exc.status >= 500:
            return ApiUnavailable(str(exc))
        return PublishRejected(f"{exc}: {exc.body[:300]}")
    return ApiUnavailable(f"{type(exc).__name__}: {str(exc)[:200]}")


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
    return cfg


class Transport:
    """JSON over the kubernetes package's TLS-configured urllib3 pool, nothing more.

    The agent makes three kinds of call (get, patch, watch one Node). The generated ``CoreV1Api``
    would cost about 22 MB of resident memory for that; the pool manager (certificates, CA, proxy
    from the kubeconfig) and the configuration's bearer token (refreshed for in-cluster tokens)
    are all it needs. No urllib3 retries: the agent's own backoff decides.
    """

    def __init__(self, client_config: Any) -> None:
        from kubernetes.client import rest

        self._config = client_config
        self._pool = rest.RESTClientObject(client_config).pool_manager
        self._host = str(client_config.host).rstrip("/")

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": f"fiar-agent/{__version__}"}
        token = self._config.auth_settings().get("BearerToken")
        if token and token.get("value"):
            headers["Authorization"] = str(token["value"])
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def request(
        self, method: str, path: str, *, body: Any = None, content_type: str | None = None, timeout_s: float
    ) -> Any:
        import urllib3

        data = None if body is None else json.dumps(body).encode()
        resp = self._pool.request(
            method,
            self._host + path,
            body=data,
            headers=self._headers(content_type),
            timeout=urllib3.Timeout(connect=min(5.0, timeout_s), read=timeout_s),
            retries=False,
        )
        text = resp.data.decode(errors="replace")
        if not 200 <= resp.status < 300:
            raise HttpError(resp.status, resp.reason or "", text)
        return json.loads(text) if text else None

    def stream(self, path: str, *, read_timeout_s: float) -> Iterator[dict[str, Any]]:
        """JSON objects of a watch, one per line, until the server ends the window."""
        import urllib3

        resp = self._pool.request(
            "GET",
            self._host + path,
            headers=self._headers(None),
            timeout=urllib3.Timeout(connect=5.0, read=read_timeout_s),
            retries=False,
            preload_content=False,
        )
        try:
            if not 200 <= resp.status < 300:
                raise HttpError(resp.status, resp.reason or "", resp.read().decode(errors="replace"))
            buffer = b""
            for chunk in resp.stream(4096):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()


MIN_WATCH_S: Final = 1.0
"""A watch stream that ends sooner than this counts as failing: backoff before reconnecting."""


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


def _state(node: Mapping[str, Any]) -> NodeState:
    meta = node.get("metadata") or {}
    return NodeState(dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}), meta.get("resourceVersion"))


class NodePublisher:
    """Reads, patches and watches one Node (one transport per thread)."""

    def __init__(self, client_config: Any, node_name: str, request_timeout_s: float = 10.0) -> None:
        if not node_name:
            raise ConfigError("no node name: set NODE_NAME (downward API spec.nodeName) or --node-name")
        self.node_name = node_name
        self._config = client_config
        self._timeout = request_timeout_s
        self._local = threading.local()
        self._path = f"/api/v1/nodes/{quote(node_name, safe='')}"

    def _transport(self) -> Transport:
        transport = getattr(self._local, "transport", None)
        if transport is None:
            transport = Transport(self._config)
            self._local.transport = transport
        return transport

    def _call(self, method: str, *, body: Any = None, content_type: str | None = None) -> Any:
        try:
            return self._transport().request(
                method, self._path, body=body, content_type=content_type, timeout_s=self._timeout
            )
        except Exception as exc:
            raise translate(exc) from exc

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
        """Write ``labels`` and the report to the own Node; returns the label changes made."""
        current = self.read()
        patch = self.label_patch(current.labels, labels)
        body = {"metadata": {"labels": patch, "annotations": {contract.ANNOTATION_PROBE_REPORT: report_text}}}
        self._call("PATCH", body=body, content_type=MERGE_PATCH)
        return patch

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
                self._transport().request(
                    "PATCH", self._path, body=body, content_type=MERGE_PATCH, timeout_s=self._timeout
                )
            except HttpError as exc:
                if exc.status == 409:  # the Node changed since the read
                    continue
                raise translate(exc) from exc
            except Exception as exc:
                raise translate(exc) from exc
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
        selector = quote(f"metadata.name={self.node_name}", safe="")
        path = f"/api/v1/nodes?watch=true&fieldSelector={selector}&timeoutSeconds={window_s}"
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
                    on_error(translate(exc))
                self._local.transport = None
                stop.wait(backoff.next_delay())
                continue
            if not healthy or time.monotonic() - opened < MIN_WATCH_S:
                # an ERROR event, or a stream that closed at once: never reconnect in a tight loop
                stop.wait(backoff.next_delay())
