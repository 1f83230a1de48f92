"""Keeps the webhook configuration's matchConditions in step with the policies (the leader only).

The chart installs the MutatingWebhookConfiguration without conditions: every pod CREATE and
binding outside the excluded namespaces reaches the webhooks, which is correct while no operator
has narrowed it. The leading replica then sets one matchCondition per webhook (webhookconfig.py
writes them), so the API server itself skips the pods no policy can select, and does not wait on
the operator for them, not even when it hangs. It patches only the configuration it is named
(``--webhook-config``) and only those conditions, and only when they change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Final

from fiar_operator import webhookconfig
from fiar_operator.errors import ApiError
from fiar_operator.kube import MUTATING_CONFIGS, Kube
from fiar_operator.policy import Policy

log = logging.getLogger(__name__)

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
RETRY: Final = 5.0
"""Seconds before a failed patch is tried again (e.g. the configuration is installed after the start)."""


class WebhookSync:
    def __init__(self, kube: Kube, name: str | None) -> None:
        self.kube, self.name = kube, name
        self._applied: dict[str, list[dict[str, str]]] | None = None
        self._retry_at: float | None = None
        self.binding_namespaces: frozenset[str] | None = None
        """The namespaces the binding condition names (None: it names none, every one passes)."""

    def sync(self, policies: Iterable[Policy], managed_namespaces: Iterable[str]) -> bool:
        """Patch the conditions if they changed since the last patch; whether a patch was sent."""
        if not self.name:
            return False
        policies = list(policies)
        namespaces = sorted(set(managed_namespaces))
        wanted = webhookconfig.match_conditions(policies, namespaces)
        if wanted == self._applied:
            return False
        body = {"webhooks": [{"name": hook, "matchConditions": conditions} for hook, conditions in wanted.items()]}
        try:
            self.kube.call(
                "PATCH", f"{MUTATING_CONFIGS}/{self.name}", body=body, content_type=STRATEGIC_MERGE, timeout=10.0
            )
        except ApiError as exc:
            if self._retry_at is None:
                log.warning("webhook configuration %s not narrowed to the policies: %s", self.name, exc)
            self._retry_at = time.monotonic() + RETRY
            return False
        self._applied, self._retry_at = wanted, None
        expression = wanted[webhookconfig.BINDING_HOOK][0]["expression"]
        self.binding_namespaces = None if expression == "true" else frozenset(namespaces) | _named(policies)
        log.info("webhook configuration %s follows %d policies", self.name, len(policies))
        return True

    def due(self) -> bool:
        """Whether a failed patch should be tried again now."""
        return self._retry_at is not None and time.monotonic() >= self._retry_at

    def forget(self) -> None:
        """Patch again at the next ``sync`` (after leadership changed hands)."""
        self._applied = None


def _named(policies: Iterable[Policy]) -> frozenset[str]:
    names: set[str] = set()
    for policy in policies:
        names.update(webhookconfig.names_only(policy.namespace_selector) or ())
    return frozenset(names)
