"""The operator's one seam to the Kubernetes API: raw JSON requests and watch streams.

The generated ``kubernetes`` client is used only for what it does well (kubeconfig / in-cluster
credentials, TLS, the connection pool); objects stay plain dicts, which keeps the informers cheap and
the code independent of the client's model classes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.watch.watch import iter_resp_lines

import fiar_contract as contract
from fiar_operator.errors import ApiError, ConfigurationError

NODES: Final = "/api/v1/nodes"
NAMESPACES: Final = "/api/v1/namespaces"
PODS: Final = "/api/v1/pods"
POLICIES: Final = f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}"
MUTATING_CONFIGS: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
CRDS: Final = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"


def api_client(kubeconfig: str | None = None, pool_size: int = 32) -> Any:
    """An ApiClient from a kubeconfig file, else in-cluster credentials, else the default kubeconfig."""
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
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


class Kube:
    """Raw JSON access to the API server through an ApiClient."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str | None,
        timeout: float | tuple[float, float] | None,
    ) -> Any:
        headers = {"Accept": JSON}
        if content_type:
            headers["Content-Type"] = content_type
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        request = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(*request, _request_timeout=timeout)
        except ApiException as exc:
            raise ApiError(f"{method} {path}: {exc.reason}", exc.status) from exc
        except Exception as exc:  # urllib3 / socket errors: the API server is unreachable or slow
            raise ApiError(f"{method} {path}: {exc}") from exc
        return response

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
        data = response.read()
        if not 200 <= response.status <= 299:
            message = ""
            try:
                message = json.loads(data).get("message", "")
            except (ValueError, AttributeError):
                message = data[:200].decode(errors="replace") if data else ""
            raise ApiError(f"{method} {path}: HTTP {response.status} {message}".strip(), response.status)
        return json.loads(data) if data else None

    def list(self, path: str, label_selector: str | None = None, page: int = 500) -> tuple[list[dict[str, Any]], str]:
        """Every object of a collection (paged) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            doc = self.call(
                "GET", path, {"limit": page, "continue": token, "labelSelector": label_selector}, timeout=(5.0, 60.0)
            )
            items += doc.get("items") or []
            token = (doc.get("metadata") or {}).get("continue") or None
            if not token:
                return items, str((doc.get("metadata") or {}).get("resourceVersion") or "")

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
        raw = response.response
        try:
            if not 200 <= response.status <= 299:
                raise ApiError(f"watch {path}: HTTP {response.status}", response.status)
            for line in iter_resp_lines(raw):
                if line:
                    yield json.loads(line)
        finally:
            raw.close()
            raw.release_conn()

    # -- the calls the operator makes ------------------------------------------------------------
    def get_pod(self, namespace: str, name: str, timeout: float = 1.0) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}", timeout=timeout)
        return result

    def get_namespace(self, name: str, timeout: float = 1.0) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", f"{NAMESPACES}/{name}", timeout=timeout)
        return result

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> dict[str, Any]:
        """Merge annotations into a pod; the uid precondition keeps a same-named successor untouched."""
        body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        result: dict[str, Any] = self.call(
            "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body, content_type=MERGE_PATCH
        )
        return result

    def patch_policy_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.call(
            "PATCH", f"{POLICIES}/{name}/status", body={"status": dict(status)}, content_type=MERGE_PATCH
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

    def delete(self, collection: str, name: str) -> None:
        try:
            self.call("DELETE", f"{collection}/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
