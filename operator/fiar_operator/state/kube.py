"""The operator's calls to the Kubernetes API, over the seam it shares with the node agent (``fiar_kube``).

``fiar_kube`` loads the credentials (kubeconfig or in-cluster, with token re-reads), owns the kept
connections (its lane for requests, a urllib3 pool for watches) and maps failures to typed errors
(``NotFound``, ``Conflict``, ``Gone``, ...); objects stay plain dicts, which keeps the informers
cheap and the code independent of the generated client's models.
This module names the collections the operator uses and pages through lists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Final

import fiar_contract as contract
import fiar_kube
from fiar_kube import APPLY_PATCH, JSON, MERGE_PATCH, segment
from fiar_operator.core.errors import ApiError, ConfigurationError, Conflict, NotFound
from fiar_operator.core.names import is_namespace_name, is_object, is_pod_name

__all__ = ["APPLY_PATCH", "JSON", "MERGE_PATCH", "Kube", "Listing", "configuration", "segment"]

NODES: Final = "/api/v1/nodes"
NAMESPACES: Final = "/api/v1/namespaces"
PODS: Final = "/api/v1/pods"
POLICIES: Final = f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}"
MUTATING_CONFIGS: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING_CONFIGS: Final = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
CRDS: Final = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
POOL_SIZE: Final = 32
"""Connections kept to the API server: informers, the reconciler's patchers, the webhooks' reads."""


def configuration(kubeconfig: str | None = None) -> Any:
    """Client settings from a kubeconfig file, else in-cluster credentials, else the default kubeconfig."""
    try:
        return fiar_kube.load_config(kubeconfig, default_kubeconfig=True)
    except fiar_kube.ConfigError as exc:
        raise ConfigurationError(f"no usable Kubernetes credentials: {exc}") from exc


PAGE: Final = 100
"""Objects per page of an informer's list. A page is held whole while it is indexed (its JSON, then
its decoded objects: about 28 KB a running pod, 40 times the record it leaves), and the heap it took
stays the process's: listing 20,000 managed pods in pages of 500 grew the process by 41 MiB at the
peak and left it 30 MiB larger, in pages of 100 by 18 and 16 MiB, for the same 12.5 MiB of records
(``bench/operator_list_memory.py``, BENCHMARKS.md)."""


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
    """Raw JSON access to the API server with the credentials of a client Configuration (or of
    anything with a ``configuration``, such as a kubernetes ``ApiClient``)."""

    def __init__(self, settings: Any, pool_size: int = POOL_SIZE) -> None:
        self.configuration = getattr(settings, "configuration", settings)
        self.client = fiar_kube.Client(self.configuration, user_agent="fiar-operator", maxsize=pool_size)

    def call(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: fiar_kube.Timeout = 10.0,
    ) -> Any:
        """One request; the decoded JSON answer, or the typed ApiError (``fiar_kube``) on failure."""
        return self.client.request(method, path, query, body=body, content_type=content_type, timeout=timeout)

    def list(self, path: str, label_selector: str | None = None, page: int = PAGE) -> Listing:
        """Every object of a collection, fetched page by page as the result is iterated."""
        return Listing(self, path, label_selector, page)

    def watch(
        self, path: str, resource_version: str, label_selector: str | None = None, timeout_seconds: int = 300
    ) -> Iterator[dict[str, Any]]:
        """Watch events (dicts with ``type`` and ``object``) from ``resource_version`` on; ERROR events
        are handed out as they come (``fiar_kube.status_error`` types them)."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector,
        }
        return self.client.stream(path, query, read_timeout_s=timeout_seconds + 30.0)

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

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Evict a pod through the Eviction API (its PodDisruptionBudgets decide: ``TooManyRequests``
        while one forbids it); the uid precondition keeps a same-named successor untouched."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        self.call("POST", f"{NAMESPACES}/{segment(namespace)}/pods/{segment(name)}/eviction", body=body)

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
        except Conflict:
            pass
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
        with contextlib.suppress(NotFound):
            self.call("DELETE", f"{collection}/{name}")
