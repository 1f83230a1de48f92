"""The operator's one seam to the Kubernetes API: raw JSON requests and watch streams.

The ``kubernetes`` package is used only to load credentials (kubeconfig or in-cluster, with token
refresh); requests go through a urllib3 pool of our own and objects stay plain dicts, which keeps the
informers cheap and the code independent of the generated client's models and internals (which
changed in kubernetes 37).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

import fiar_contract as contract
from fiar_operator.errors import ApiError, ConfigurationError
from fiar_operator.names import is_namespace_name, is_object, is_pod_name

NODES: Final = "/api/v1/nodes"
NAMESPACES: Final = "/api/v1/namespaces"
PODS: Final = "/api/v1/pods"
POLICIES: Final = f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}"
MUTATING_CONFIGS: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
CRDS: Final = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"


def configuration(kubeconfig: str | None = None) -> Any:
    """Client settings from a kubeconfig file, else in-cluster credentials, else the default kubeconfig."""
    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except ConfigException:
                config.load_kube_config(client_configuration=cfg)
    except (ConfigException, OSError) as exc:
        where = kubeconfig or "in-cluster service account or ~/.kube/config"
        raise ConfigurationError(f"no usable Kubernetes credentials ({where}): {exc}") from exc
    return cfg


def segment(name: str) -> str:
    """``name`` as one path segment: every character but unreserved ones percent-encoded ("/" too)."""
    return quote(name, safe="")


def _lines(response: Any) -> Iterator[bytes]:
    buffer = bytearray()
    for segment in response.stream(amt=None, decode_content=False):
        buffer.extend(segment)
        newline = buffer.find(b"\n")
        while newline != -1:
            line = bytes(buffer[:newline])
            del buffer[: newline + 1]
            if line.strip():
                yield line
            newline = buffer.find(b"\n")


PAGE: Final = 500
"""Objects per page of a list (the informers' and kopf's)."""


class Listing:
    """The objects of a collection, read one page at a time while they are iterated.

    Only the page being iterated is held: each object is handed out and dropped, so listing a large
    collection into an index needs memory for one page plus the index, not for every raw object.
    ``resource_version`` is the list's resourceVersion once the iteration has finished (the version
    a watch continues from). A failed request raises from the iteration.
    """

    def __init__(self, kube: Kube, path: str, label_selector: str | None, page: int) -> None:
        self.kube, self.path, self.label_selector, self.page = kube, path, label_selector, page
        self.resource_version = ""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            query = {"limit": self.page, "continue": token, "labelSelector": self.label_selector}
            doc = self.kube.call("GET", self.path, query, timeout=(5.0, 60.0))
            meta = doc.get("metadata") or {}
            items: list[dict[str, Any]] = doc.get("items") or []
            del doc
            items.reverse()
            while items:
                yield items.pop()
            token = meta.get("continue") or None
            if not token:
                self.resource_version = str(meta.get("resourceVersion") or "")
                return


class Kube:
    """Raw JSON access to the API server with the credentials of a client Configuration.

    The connection pool is the operator's own (urllib3, as in the kubernetes client), so only the
    client's stable parts are used: loading credentials and refreshing tokens.
    """

    def __init__(self, settings: Any, pool_size: int = 32) -> None:
        self.configuration = getattr(settings, "configuration", settings)
        cfg = self.configuration
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=pool_size,
            cert_reqs=ssl.CERT_REQUIRED if cfg.verify_ssl else ssl.CERT_NONE,
            ca_certs=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
        )

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": "fiar-operator"}
        if content_type:
            headers["Content-Type"] = content_type
        cfg = self.configuration
        token = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
        if token:
            headers["Authorization"] = token
        return headers

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str | None,
        timeout: float | tuple[float, float] | None,
    ) -> Any:
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        url = self.configuration.host + path + ("?" + urlencode(params) if params else "")
        if isinstance(timeout, tuple):
            limit = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        else:
            limit = urllib3.Timeout(total=timeout)
        try:
            return self._pool.request(
                method,
                url,
                body=json.dumps(body).encode() if body is not None else None,
                headers=self._headers(content_type),
                timeout=limit,
                preload_content=False,
                retries=False,
            )
        except urllib3.exceptions.HTTPError as exc:  # the API server is unreachable or slow
            raise ApiError(f"{method} {path}: {exc}") from exc

    def call(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | tuple[float, float] | None = 10.0,
    ) -> Any:
        """One request; the decoded JSON answer, or ApiError (with the HTTP status) on failure."""
        response = self._send(method, path, query, body, content_type or (JSON if body is not None else None), timeout)
        try:
            data = response.read()
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(f"{method} {path}: {exc}") from exc
        finally:
            response.release_conn()
        if not 200 <= response.status <= 299:
            try:
                message = json.loads(data).get("message", "")
            except (ValueError, AttributeError):
                message = data[:200].decode(errors="replace") if data else ""
            raise ApiError(f"{method} {path}: HTTP {response.status} {message}".strip(), response.status)
        return json.loads(data) if data else None

    def list(self, path: str, label_selector: str | None = None, page: int = PAGE) -> Listing:
        """Every object of a collection, fetched page by page as the result is iterated."""
        return Listing(self, path, label_selector, page)

    def watch(
        self, path: str, resource_version: str, label_selector: str | None = None, timeout_seconds: int = 300
    ) -> Iterator[dict[str, Any]]:
        """Watch events (dicts with ``type`` and ``object``) from ``resource_version`` on."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector,
        }
        response = self._send("GET", path, query, None, None, (5.0, timeout_seconds + 30.0))
        try:
            if not 200 <= response.status <= 299:
                raise ApiError(f"watch {path}: HTTP {response.status}", response.status)
            for line in _lines(response):
                yield json.loads(line)
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(f"watch {path}: {exc}") from exc
        finally:
            response.release_conn()

    # -- the calls the operator makes ------------------------------------------------------------
    def get_pod(self, namespace: str, name: str, timeout: float = 1.0) -> dict[str, Any]:
        """The pod ``namespace``/``name``; ApiError for an invalid name (no request is made) or an
        answer that is not that pod."""
        if not is_namespace_name(namespace) or not is_pod_name(name):
            raise ApiError(f"not a pod name: {namespace[:80]!r}/{name[:260]!r}")
        result = self.call("GET", f"{NAMESPACES}/{segment(namespace)}/pods/{segment(name)}", timeout=timeout)
        if not is_object(result, "Pod", name, namespace):
            raise ApiError(f"GET pod {namespace}/{name}: the answer is not that pod")
        return dict(result)

    def get_namespace(self, name: str, timeout: float = 1.0) -> dict[str, Any]:
        """The namespace ``name``; ApiError for an invalid name (no request is made) or an answer that
        is not that namespace."""
        if not is_namespace_name(name):
            raise ApiError(f"not a namespace name: {name[:80]!r}")
        result = self.call("GET", f"{NAMESPACES}/{segment(name)}", timeout=timeout)
        if not is_object(result, "Namespace", name):
            raise ApiError(f"GET namespace {name}: the answer is not that namespace")
        return dict(result)

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> dict[str, Any]:
        """Merge annotations into a pod; the uid precondition keeps a same-named successor untouched."""
        body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        result: dict[str, Any] = self.call(
            "PATCH", f"{NAMESPACES}/{segment(namespace)}/pods/{segment(name)}", body=body, content_type=MERGE_PATCH
        )
        return result

    def patch_policy_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.call(
            "PATCH", f"{POLICIES}/{segment(name)}/status", body={"status": dict(status)}, content_type=MERGE_PATCH
        )
        return result

    def apply(self, collection: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create a cluster-scoped object, or replace it (keeping its resourceVersion) when it exists."""
        name = obj["metadata"]["name"]
        try:
            created: dict[str, Any] = self.call("POST", collection, body=dict(obj))
            return created
        except ApiError as exc:
            if exc.status != 409:
                raise
        current = self.call("GET", f"{collection}/{name}")
        body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        replaced: dict[str, Any] = self.call("PUT", f"{collection}/{name}", body=body)
        return replaced

    def server_side_apply(self, collection: str, obj: Mapping[str, Any], manager: str) -> dict[str, Any]:
        """Server-side apply of a cluster-scoped object as field manager ``manager`` (created when
        absent; fields other managers set are taken over, fields only others own are kept)."""
        name = obj["metadata"]["name"]
        query = {"fieldManager": manager, "force": "true"}
        applied: dict[str, Any] = self.call(
            "PATCH", f"{collection}/{name}", query, body=dict(obj), content_type=APPLY_PATCH
        )
        return applied

    def delete(self, collection: str, name: str) -> None:
        try:
            self.call("DELETE", f"{collection}/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
