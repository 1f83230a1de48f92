"""The MutatingWebhookConfiguration of the two webhooks (the chart renders the same shape).

Both webhooks fail open (failurePolicy Ignore): an operator outage leaves pods on their fallback
backend and never blocks creation or scheduling. The binding webhook sees every binding in the
namespaces it covers, so it gets the shortest timeout.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, Final

import fiar_contract as contract

NAME: Final = "fiar-operator"
POD_HOOK: Final = f"pods.{contract.GROUP}"
BINDING_HOOK: Final = f"binding.{contract.GROUP}"
POD_PATH: Final = "/mutate/pods"
BINDING_PATH: Final = "/mutate/binding"


def namespace_selector(
    exclude: Sequence[str] = ("kube-system",), extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Namespaces the webhooks see: not excluded, not labelled fiar.io/ignore, and matching ``extra``."""
    expressions: list[dict[str, Any]] = [{"key": contract.NAMESPACE_IGNORE_LABEL, "operator": "DoesNotExist"}]
    if exclude:
        expressions.append({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(exclude)})
    selector: dict[str, Any] = {"matchExpressions": expressions + list((extra or {}).get("matchExpressions") or [])}
    if (extra or {}).get("matchLabels"):
        selector["matchLabels"] = dict((extra or {})["matchLabels"])
    return selector


def configuration(
    ca_bundle: bytes,
    *,
    url: str | None = None,
    service: tuple[str, str, int] | None = None,
    name: str = NAME,
    selector: Mapping[str, Any] | None = None,
    pod_timeout: int = 5,
    binding_timeout: int = 2,
) -> dict[str, Any]:
    """The configuration, pointing at ``url`` (https://host:port) or ``service`` (namespace, name, port)."""
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    ns_selector = dict(selector) if selector is not None else namespace_selector()

    def client_config(path: str) -> dict[str, Any]:
        bundle = base64.b64encode(ca_bundle).decode()
        if url is not None:
            return {"url": url.rstrip("/") + path, "caBundle": bundle}
        assert service is not None
        return {
            "service": {"namespace": service[0], "name": service[1], "port": service[2], "path": path},
            "caBundle": bundle,
        }

    def hook(hook_name: str, resource: str, path: str, timeout: int, reinvocation: str) -> dict[str, Any]:
        return {
            "name": hook_name,
            "clientConfig": client_config(path),
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": [resource],
                    "scope": "Namespaced",
                }
            ],
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "matchPolicy": "Equivalent",
            "reinvocationPolicy": reinvocation,
            "timeoutSeconds": timeout,
            "namespaceSelector": ns_selector,
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "fiar"}},
        "webhooks": [
            hook(POD_HOOK, "pods", POD_PATH, pod_timeout, "IfNeeded"),
            hook(BINDING_HOOK, "pods/binding", BINDING_PATH, binding_timeout, "Never"),
        ],
    }
