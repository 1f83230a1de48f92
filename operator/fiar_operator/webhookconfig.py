"""The MutatingWebhookConfiguration of the two webhooks: the one place of their settings.

``fiar-operator webhook-config``, ``fiar-operator run --register-webhooks`` (the local demo) and the
Helm chart render the same webhooks; a test renders the chart and compares it with this module.
Both webhooks fail open (failurePolicy Ignore): an operator outage leaves pods on their fallback
backend and never blocks creation or scheduling. Both share one short timeout: the binding webhook
sees every binding in the namespaces it covers and answers from memory.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import fiar_contract as contract
from fiar_operator.settings import ALWAYS_EXCLUDED

NAME: Final = "fiar-operator"
POD_HOOK: Final = f"pods.{contract.GROUP}"
BINDING_HOOK: Final = f"binding.{contract.GROUP}"
POD_PATH: Final = "/mutate/pods"
BINDING_PATH: Final = "/mutate/binding"
TIMEOUT_SECONDS: Final = 2
"""API-server timeout of each webhook call; the chart's ``operator.webhook.timeoutSeconds`` default."""
MAX_TIMEOUT_SECONDS: Final = 2
"""Longest timeout allowed (the chart's values schema says the same): a slow call delays a binding."""
FAILURE_POLICY: Final = "Ignore"
SIDE_EFFECTS: Final = "None"
MATCH_POLICY: Final = "Equivalent"


@dataclass(frozen=True)
class Hook:
    name: str
    path: str
    resource: str
    reinvocation: Literal["IfNeeded", "Never"]
    """IfNeeded on the pod hook: a container that a later webhook adds is selected too."""


HOOKS: Final = (
    Hook(POD_HOOK, POD_PATH, "pods", "IfNeeded"),
    Hook(BINDING_HOOK, BINDING_PATH, "pods/binding", "Never"),
)


def namespace_selector(
    exclude: Sequence[str] = ALWAYS_EXCLUDED, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Namespaces the webhooks see: not excluded, not labelled fiar.io/ignore, and matching ``extra``."""
    expressions: list[dict[str, Any]] = []
    if exclude:
        names = list(dict.fromkeys(exclude))
        expressions.append({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": names})
    expressions.append({"key": contract.NAMESPACE_IGNORE_LABEL, "operator": "DoesNotExist"})
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
    timeout: int = TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """The configuration, pointing at ``url`` (https://host:port) or ``service`` (namespace, name, port)."""
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    if not 1 <= timeout <= MAX_TIMEOUT_SECONDS:
        raise ValueError(f"webhook timeout {timeout}s: expected 1 to {MAX_TIMEOUT_SECONDS}")
    ns_selector = dict(selector) if selector is not None else namespace_selector()
    bundle = base64.b64encode(ca_bundle).decode()

    def client_config(path: str) -> dict[str, Any]:
        if url is not None:
            return {"url": url.rstrip("/") + path, "caBundle": bundle}
        assert service is not None
        return {
            "service": {"namespace": service[0], "name": service[1], "port": service[2], "path": path},
            "caBundle": bundle,
        }

    def webhook(hook: Hook) -> dict[str, Any]:
        return {
            "name": hook.name,
            "clientConfig": client_config(hook.path),
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": [hook.resource],
                    "scope": "Namespaced",
                }
            ],
            "admissionReviewVersions": ["v1"],
            "sideEffects": SIDE_EFFECTS,
            "failurePolicy": FAILURE_POLICY,
            "matchPolicy": MATCH_POLICY,
            "reinvocationPolicy": hook.reinvocation,
            "timeoutSeconds": timeout,
            "namespaceSelector": ns_selector,
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "fiar"}},
        "webhooks": [webhook(hook) for hook in HOOKS],
    }
